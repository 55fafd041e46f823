"""One child process that dies with this one: start, wait for a ready line, stop, tell if alive.

A supervised child dies with the process that started it, even after ``kill -9`` of that process:
on Linux the child asks for ``PR_SET_PDEATHSIG`` (SIGTERM when its parent thread exits) before
it executes, and everywhere it gets ``PERFSWEEP_PARENT_PID`` (``python -m reference_server`` stops
itself once that parent is gone). :func:`die_with_parent` is the one mechanism; the managed
servers (:class:`analyzer.target.managed.ManagedServer`: the reference server, or a real Triton from
:mod:`analyzer.target.triton`) and ``perfsweep ui``'s Locust processes are started through
:func:`child_process_options`; the predict phase's simulation workers are :func:`worker_pool`'s
(each also watches its parent, as the reference server does: a worker waiting for work would
otherwise sleep on after a ``kill -9`` of the run).

:class:`Supervisor` knows nothing about servers or HTTP: it runs a command with its output
appended to a log file, waits until a caller-given parser finds what it needs in the new part of
the log, restarts it when it died (with a new command line when the caller gives one), and
stops it (SIGTERM, then SIGKILL). With ``own_group`` the child leads a process group of its own,
and stopping it also ends what it started (Triton's Python-backend stub processes).
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from analyzer.errors import TargetError

if TYPE_CHECKING:
    from concurrent.futures import ProcessPoolExecutor

#: Environment variable naming the pid a managed child must outlive no longer than it.
PARENT_PID_ENV = "PERFSWEEP_PARENT_PID"

_PR_SET_PDEATHSIG = 1

T = TypeVar("T")


def die_with_parent(parent_pid: int) -> None:
    """``preexec_fn`` of a managed child: SIGTERM when the parent thread dies (Linux).

    Runs in the child between fork and exec. When the parent already died in between, the
    child exits at once. Elsewhere this does nothing; the server's own watchdog
    (``PERFSWEEP_PARENT_PID``) covers it.
    """
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent_pid:
        os._exit(1)


def _pool_worker_start(parent_pid: int) -> None:
    """A pool worker's initializer: it ends once ``parent_pid`` is no longer its parent.

    SIGTERM ends it (a handler the parent had is not inherited here): ``PR_SET_PDEATHSIG``
    sends it at once on Linux, and a watchdog thread covers the rest (another platform, or the
    signal lost): the worker is re-parented when its parent dies.
    """
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    die_with_parent(parent_pid)

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(0.5)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="parent-watchdog", daemon=True).start()


def worker_pool(workers: int) -> ProcessPoolExecutor:
    """A process pool whose workers die with this process, even after its ``kill -9``."""
    # Imported here, not at the top: this module is imported before the load generator patches
    # threading for gevent, and concurrent.futures.process made then would hold real OS locks
    # that its (by then patched) manager thread and the caller's greenlets deadlock on.
    from concurrent.futures import ProcessPoolExecutor

    return ProcessPoolExecutor(
        max_workers=workers, initializer=_pool_worker_start, initargs=(os.getpid(),)
    )


def child_process_options(env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """``subprocess.Popen`` keyword arguments that tie a child's life to this process.

    Args:
        env: The child's environment (default: this process's); the parent pid is added.
    """
    parent = os.getpid()
    return {
        "preexec_fn": lambda: die_with_parent(parent),
        "env": {**(os.environ if env is None else env), PARENT_PID_ENV: str(parent)},
    }


def group_members(pgid: int) -> list[int]:
    """The live processes of process group ``pgid`` (zombies not counted), read from ``/proc``;
    empty where there is no ``/proc``."""
    members: list[int] = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return members
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):  # it ended while we looked
            continue
        if fields[0] not in ("Z", "X") and int(fields[2]) == pgid:
            members.append(int(entry))
    return members


def kill_group(pgid: int, timeout_s: float = 10.0) -> None:
    """SIGKILL what is left of process group ``pgid`` until nothing of it runs (bounded by
    ``timeout_s``): its leader is gone, but what the leader started may still run."""
    deadline = time.monotonic() + timeout_s
    while group_members(pgid) and time.monotonic() < deadline:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            return
        time.sleep(0.02)


def _end_group_after(
    proc: subprocess.Popen[bytes], before: Callable[[int], None] | None = None
) -> None:
    """Wait for a group leader to exit, call ``before(pgid)``, then end the rest of its group."""
    proc.wait()
    if before is not None:
        before(proc.pid)
    kill_group(proc.pid)


def log_note(log_path: Path, text: str) -> None:
    """Append ``--- perfsweep: <text>`` to a child's log (perfsweep's own lines in it)."""
    with open(log_path, "ab") as log:
        log.write(f"--- perfsweep: {text}\n".encode())


class Supervisor:
    """One child process with its stdout and stderr appended to ``log_path``.

    Args:
        command: The command line.
        log_path: The log file (appended to: every start adds to the same file).
        name: What the child is, for messages ("the reference server").
        label: Its short name in the log's ``--- perfsweep: <label> pid N`` line (tests read it).
        env: Extra environment variables for the child.
        own_group: Start the child in a session (and process group) of its own: Ctrl-C in the
            terminal does not reach it, and the processes it started end with it: when it
            exits (a thread waits for that) and when it is stopped.
        before_group_end: With ``own_group``: called with the group id once the child has
            exited, before the rest of its group is ended (in the waiting thread), to note what
            those processes hold.
    """

    def __init__(
        self,
        command: Sequence[str],
        log_path: Path,
        name: str = "the child process",
        label: str = "child",
        env: Mapping[str, str] | None = None,
        own_group: bool = False,
        before_group_end: Callable[[int], None] | None = None,
    ) -> None:
        self.command = list(command)
        self.own_group = own_group
        self.before_group_end = before_group_end
        self.log_path = Path(log_path).resolve()
        self.name = name
        self.label = label
        self.env = dict(env or {})
        self._proc: subprocess.Popen[bytes] | None = None
        self._offset = 0

    def start(self) -> None:
        """Start the child (its output goes to the end of the log)."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        with open(self.log_path, "ab") as log:
            self.note(f"starting {' '.join(self.command)}", log)
            options = child_process_options()  # dies with this process, even on kill -9
            options["env"].update(self.env)
            self._proc = subprocess.Popen(
                self.command,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=self.own_group,
                **options,
            )
            self.note(f"{self.label} pid {self._proc.pid}", log)
        if self.own_group:
            # What the child started dies with it at once, not when someone calls stop(): the
            # helpers of a killed server (Triton's stubs) hold its sockets open, so the requests
            # in flight to it would hang instead of failing.
            threading.Thread(
                target=_end_group_after,
                args=(self._proc, self.before_group_end),
                name="group-reaper",
                daemon=True,
            ).start()

    def wait_for(
        self, parse: Callable[[str], T | None], timeout_s: float, poll_s: float = 0.1
    ) -> T:
        """Wait until ``parse`` finds something in what the child wrote since it started.

        Raises:
            TargetError: The child exited first (the message quotes its last log line), or
                ``timeout_s`` passed (the child is stopped); both name the log.
        """
        deadline = time.monotonic() + timeout_s
        while True:
            proc = self._proc
            if proc is None or proc.poll() is not None:
                code = proc.returncode if proc is not None else None
                raise TargetError(
                    f"{self.name} exited with status {code} during startup: "
                    f"{self.log_tail()} (full log: {self.log_path})"
                )
            found = parse(self.log_text())
            if found is not None:
                return found
            if time.monotonic() > deadline:
                self.stop()
                raise TargetError(
                    f"{self.name} did not start within {timeout_s:.0f} s (log: {self.log_path})"
                )
            time.sleep(poll_s)

    def restart(self, timeout_s: float = 10.0, command: Sequence[str] | None = None) -> None:
        """Stop the child whatever its state (dead, or running but hung), say so in the log
        (``<label> died (status N); restarting``), and start it again.

        Args:
            timeout_s: How long the old child gets to stop after SIGTERM.
            command: The new command line (a managed Triton picks new free ports); default the
                same one.
        """
        code = self.returncode()
        self.stop(timeout_s)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log_note(self.log_path, f"{self.label} died (status {code}); restarting")
        if command is not None:
            self.command = list(command)
        self.start()

    def running(self) -> bool:
        """Whether the child was started and has not exited."""
        return self._proc is not None and self._proc.poll() is None

    def returncode(self) -> int | None:
        """The child's exit status (None while it runs or when it was never started)."""
        return self._proc.poll() if self._proc is not None else None

    def pid(self) -> int | None:
        """The child's process id (None when not started)."""
        return self._proc.pid if self._proc is not None else None

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop the child: SIGTERM, then SIGKILL after ``timeout_s``.

        With ``own_group`` only the child gets the SIGTERM (a server shuts its own helpers down
        cleanly); whatever is left of its process group afterwards is killed.
        """
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=timeout_s)
        if self.own_group:
            if self.before_group_end is not None:  # the waiting thread may not have yet
                self.before_group_end(proc.pid)
            kill_group(proc.pid, timeout_s)

    def note(self, text: str, log: Any = None) -> None:
        """Append ``--- perfsweep: <text>`` to the log (``log``: an open binary handle)."""
        if log is None:
            log_note(self.log_path, text)
            return
        log.write(f"--- perfsweep: {text}\n".encode())
        log.flush()

    def log_text(self) -> str:
        """What the child wrote since its last start."""
        with open(self.log_path, "rb") as log:
            log.seek(self._offset)
            return log.read().decode(errors="replace")

    def log_tail(self) -> str:
        """The last non-blank line the child wrote since its last start."""
        lines = [line for line in self.log_text().splitlines() if line.strip()]
        return lines[-1] if lines else "no output"
