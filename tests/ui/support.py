"""Helpers for the dashboard tests: a small simulated model, the reference server and
``perfsweep ui`` / ``locust`` as child processes whose stdout lines are read without blocking."""

from __future__ import annotations

import contextlib
import json
import os
import queue
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
UI_READY = "perfsweep ui: dashboard at "
SERVER_READY = "perfsweep reference server ready:"
MODEL = "simple"


def write_sim_model(
    repository: Path, name: str = MODEL, device_ms: float = 2.0, batching: str = ""
) -> Path:
    """A 16-float simulated model: ``device_ms`` + 0.2 ms per batch item, no jitter, batches to 8.

    ``batching`` goes inside ``dynamic_batching { ... }`` (e.g. a queue policy).
    """
    model_dir = repository / name
    (model_dir / "1").mkdir(parents=True, exist_ok=True)
    (model_dir / "profile.toml").write_text(
        textwrap.dedent(
            f"""\
            name = "{name}_profile"
            provenance = "SYNTHETIC test profile: {device_ms} ms + 0.2 ms per item, no jitter"
            seed = 0
            jitter = 0.0

            [device]
            a_ms = {device_ms}
            b_ms = 0.2
            """
        )
    )
    (model_dir / "config.pbtxt").write_text(
        textwrap.dedent(
            f"""\
            name: "{name}"
            backend: "simulated"
            max_batch_size: 8
            input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] }} ]
            output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] }} ]
            instance_group [ {{ kind: KIND_CPU count: 1 }} ]
            dynamic_batching {{ max_queue_delay_microseconds: 1000 {batching} }}
            parameters {{ key: "profile" value: {{ string_value: "profile.toml" }} }}
            """
        )
    )
    return repository


def child_env(**extra: str) -> dict[str, str]:
    """This environment, with the repository importable and ``extra`` set."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p)
    env.pop("PERFSWEEP_UI_PASSWORD", None)
    env.pop("PERFSWEEP_UI_USER", None)
    env.update(extra)
    return env


class Child:
    """A child process; a thread moves its stdout lines into a queue (stderr goes to a file)."""

    def __init__(self, args: Sequence[str], log: Path, env: dict[str, str] | None = None) -> None:
        self.log = log
        self._stderr = log.open("wb")
        self.proc = subprocess.Popen(
            list(args),
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            stdin=subprocess.DEVNULL,
            text=True,
            env=env or child_env(),
            cwd=REPO_ROOT,
            start_new_session=True,
        )
        self.lines: queue.Queue[str] = queue.Queue()
        self.seen: list[str] = []
        self._pump_thread = threading.Thread(target=self._pump, daemon=True)
        self._pump_thread.start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))

    def wait_line(self, prefix: str, timeout_s: float = 120.0) -> str:
        """The first stdout line starting with ``prefix`` (fails with the log tail on timeout)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=0.2)
            except queue.Empty:
                if self.proc.poll() is not None and self.lines.empty():
                    break
                continue
            self.seen.append(line)
            if line.startswith(prefix):
                return line
        raise AssertionError(
            f"no line starting {prefix!r}; stdout {self.seen[-5:]}; stderr tail: {self.tail()}"
        )

    def stdout(self, timeout_s: float = 10.0) -> str:
        """Everything the (exited) child printed, once its stdout is read to the end."""
        self._pump_thread.join(timeout_s)
        return "\n".join([*self.seen, *self.lines.queue])

    def tail(self) -> str:
        """Last lines of stderr."""
        self._stderr.flush()
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-15:])

    def stop(self, timeout_s: float = 20.0) -> int:
        """SIGTERM the child (which cleans up its own children), SIGKILL the group if it hangs."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(5)
        with contextlib.suppress(ProcessLookupError):  # anything it left behind in its group
            os.killpg(self.proc.pid, signal.SIGKILL)
        self._stderr.close()
        return int(self.proc.returncode)


def perfsweep(*args: str) -> list[str]:
    """The ``perfsweep`` command line in this interpreter."""
    return [sys.executable, "-c", "from analyzer.cli import main; main()", *args]


@contextlib.contextmanager
def reference_server(repository: Path, log: Path) -> Iterator[dict[str, str]]:
    """The reference server serving ``repository`` (sim device); yields its ready-line fields."""
    child = Child(
        [
            sys.executable,
            "-m",
            "reference_server",
            "--model-repository",
            str(repository),
            "--device",
            "sim",
            "--http-port",
            "0",
            "--grpc-port",
            "0",
            "--metrics-port",
            "0",
        ],
        log,
    )
    try:
        line = child.wait_line(SERVER_READY, 60.0)
        yield dict(item.split("=", 1) for item in line[len(SERVER_READY) :].split())
    finally:
        child.stop()


def http(
    method: str,
    url: str,
    body: Any = None,
    form: dict[str, Any] | None = None,
    opener: urllib.request.OpenerDirector | None = None,
    timeout_s: float = 30.0,
) -> tuple[int, Any]:
    """One request; JSON decoded when the answer is JSON, text otherwise."""
    data = None
    headers = {}
    if body is not None:
        data = json.dumps(body).encode()
        headers["Content-Type"] = "application/json"
    elif form is not None:
        data = urllib.parse.urlencode(form, doseq=True).encode()
        headers["Content-Type"] = "application/x-www-form-urlencoded"
    request = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with (opener or urllib.request.build_opener()).open(request, timeout=timeout_s) as resp:
            status, raw, ctype = resp.status, resp.read(), resp.headers.get("Content-Type", "")
    except urllib.error.HTTPError as exc:
        status, raw, ctype = exc.code, exc.read(), exc.headers.get("Content-Type", "")
    if "json" in ctype:
        return status, json.loads(raw)
    return status, raw.decode(errors="replace")


def start_ui(
    tmp: Path, http_url: str, model: str, grpc_url: str, metrics_url: str, *extra: str, **env: str
) -> tuple[Child, str]:
    """``perfsweep ui --url`` on a free port; returns the child and the dashboard's base URL."""
    child = Child(
        perfsweep(
            "ui",
            "--url",
            http_url,
            "--model",
            model,
            "--grpc-url",
            grpc_url,
            "--metrics-url",
            metrics_url,
            "--web-port",
            "0",
            *extra,
        ),
        tmp / "ui.log",
        env=child_env(**env),
    )
    line = child.wait_line(UI_READY)
    match = re.search(r"(http://\S+?)/? ", line + " ")
    assert match, line
    return child, match.group(1)


def server_truth(http_url: str, metrics_url: str, model: str) -> dict[str, Any]:
    """What a server itself reports for ``model``: statistics totals and Prometheus counters."""
    from prometheus_client.parser import text_string_to_metric_families

    _, stats = http("GET", f"{http_url}/v2/models/{model}/stats")
    entry = stats["model_stats"][0]
    batches = {str(b["batch_size"]): int(b["compute_infer"]["count"]) for b in entry["batch_stats"]}
    _, text = http("GET", metrics_url)
    failures: dict[str, int] = {}
    pending = None
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.labels.get("model") != model:
                continue
            # prometheus_client's parser names counter samples with a _total suffix.
            if s.name.removesuffix("_total") == "nv_inference_request_failure":
                reason = s.labels.get("reason", "OTHER")
                failures[reason] = failures.get(reason, 0) + int(s.value)
            elif s.name == "nv_inference_pending_request_count":
                pending = (pending or 0) + int(s.value)
    return {
        "inference_count": int(entry["inference_count"]),
        "execution_count": int(entry["execution_count"]),
        "batch_executions": batches,
        "failures_by_reason": failures,
        "pending_requests": pending,
    }


def quiet_truth(http_url: str, metrics_url: str, model: str, timeout_s: float = 30.0) -> dict:
    """``server_truth`` once the server is quiet: nothing pending and nothing changing for 1 s.

    After Locust stops its users, requests already on the wire still arrive for a moment, so a
    single "pending == 0" reading is not the end of the traffic.
    """
    deadline = time.monotonic() + timeout_s
    last: dict | None = None
    while time.monotonic() < deadline:
        now = server_truth(http_url, metrics_url, model)
        if now == last and now["pending_requests"] in (0, None):
            return now
        last = now
        time.sleep(1.0)
    raise AssertionError(f"{model} on {http_url} did not go quiet in {timeout_s:g} s: {last}")


TOTAL_KEYS = (
    "inference_count",
    "execution_count",
    "batch_executions",
    "failures_by_reason",
    "pending_requests",
)


def wait_agreement(dashboard_url: str, truth: dict, timeout_s: float = 15.0) -> dict:
    """Wait until the dashboard's server totals equal ``truth`` (a quiet server's own numbers).

    The dashboard scrapes once a second, so its next document must agree on every key; if it
    never does, the assertion shows both sides.
    """
    deadline = time.monotonic() + timeout_s
    totals: dict = {}
    while time.monotonic() < deadline:
        _, doc = http("GET", f"{dashboard_url}/perfsweep/server")
        totals = (doc.get("server") or {}).get("totals", {})
        if all(totals.get(k) == truth[k] for k in TOTAL_KEYS):
            return dict(totals)
        time.sleep(0.5)
    diff = {k: (totals.get(k), truth[k]) for k in TOTAL_KEYS if totals.get(k) != truth[k]}
    raise AssertionError(f"dashboard vs server (dashboard, server): {diff}")


def wait_for(predicate: Callable[[], Any], timeout_s: float, what: str, poll_s: float = 0.5) -> Any:
    """Poll until ``predicate()`` is truthy; return it (AssertionError naming ``what`` otherwise)."""
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(poll_s)
    raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what} (last: {last!r})")


def process_gone(pid: int) -> bool:
    """The process no longer runs (a zombie waiting for its new parent to reap it counts)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True
    except OSError:
        return False


def children_of(pid: int) -> dict[int, str]:
    """The live direct children of ``pid`` (from ``/proc``): pid -> command line."""
    found: dict[int, str] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{entry}/cmdline", "rb") as cmdline:
                command = cmdline.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:  # it ended while we looked
            continue
        if int(fields[1]) == pid and fields[0] not in ("Z", "X"):
            found[int(entry)] = command
    return found


def wait_all_gone(pids: dict[int, str], timeout_s: float, what: str) -> None:
    """Poll until every pid in ``pids`` has ended; fail naming the survivors otherwise."""
    deadline = time.monotonic() + timeout_s
    alive = dict(pids)
    while alive:
        alive = {pid: cmd for pid, cmd in alive.items() if not process_gone(pid)}
        if not alive:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: still running {timeout_s:g} s later: {alive}")
        time.sleep(0.1)
