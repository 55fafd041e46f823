"""A generative server started from the user's command template, restarted per config.

``vllm serve`` and SGLang take their engine settings on the command line, so a config reaches
them only through a restart. :class:`CommandTarget` formats ``model.serve_command`` with a
trial's knobs (:func:`analyzer.config.knobs.command_values`: each knob under vLLM's name and
the engine's own, and ``{port}``), starts it on loopback in a process group of its own
(:class:`~analyzer.target.supervise.Supervisor`), waits until it answers ``GET /health`` and
lists the model on ``GET /v1/models`` (the OpenAI-compatible API every such server speaks), and
stops it at the end of the run. A load of the config already running starts nothing.

It is a :class:`~analyzer.target.protocol.Target` like the others: the sweep's load of a
trial's config hands it the config and the engine file that :class:`~analyzer.config.pipeline.
Tuned` makes for the knobs (``file:1/model.json``, vLLM's names), which this target reads back
into knobs. The model's "config" is a stand-in (its backend names the engine), since such a
server has no Triton config.
"""

from __future__ import annotations

import json
import shlex
import socket
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from tritonclient.grpc import model_config_pb2 as mc

from analyzer.config.access import PLAIN, ServerAccess
from analyzer.config.knobs import ENGINES, EngineKnobs, command_values
from analyzer.config.pipeline import ENGINE_FILE_KEY, engine_knobs_of
from analyzer.errors import InputError, TargetDiedError, TargetError
from analyzer.target.supervise import Supervisor
from analyzer.target.transport import Request, Transport, UrllibTransport


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on now (the server binds it on each start)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def format_command(template: str, knobs: EngineKnobs, engine: str, port: int) -> list[str]:
    """The command line of ``template`` for ``knobs`` (split as a shell splits it, never run
    through a shell).

    Raises:
        InputError: the template names a placeholder that is neither a knob nor ``{port}``.
    """
    values = {**command_values(knobs, engine), "port": str(port)}
    try:
        text = template.format(**values)
    except KeyError as exc:
        raise InputError(
            f"--serve-command names {{{exc.args[0]}}}, which is no knob: use "
            f"{', '.join('{' + k + '}' for k in sorted(values))}"
        ) from None
    except (IndexError, ValueError) as exc:
        raise InputError(f"--serve-command {template!r}: {exc}") from None
    return shlex.split(text)


def check_template(template: str, engine: str) -> None:
    """Refuse a template without ``{port}`` or with an unknown placeholder (before any start).

    Raises:
        InputError: the template cannot be used.
    """
    if engine not in ENGINES:
        raise InputError(f"engine {engine!r}: use one of {', '.join(ENGINES)}")
    if "{port}" not in template:
        raise InputError("--serve-command must take the port perfsweep gives it: add --port {port}")
    format_command(template, EngineKnobs(1, 1), engine, 0)


class CommandTarget:
    """A server perfsweep starts from a command template, once per config.

    Args:
        template: ``model.serve_command``.
        model: The model name the server serves (``--served-model-name``, or its path).
        engine: ``vllm`` or ``sglang`` (the placeholders' names).
        log_path: The server's stdout and stderr (every start appends).
        startup_timeout_s: How long one start may take until the model is listed.
        transport: The HTTP seam (default urllib).
        clock, sleep: Pace the readiness wait (tests pass fakes).
    """

    shared = False
    device = "remote"
    access: ServerAccess = PLAIN

    def __init__(
        self,
        template: str,
        model: str,
        engine: str,
        log_path: Path,
        startup_timeout_s: float = 180.0,
        transport: Transport | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        check_template(template, engine)
        self.template = template
        self.model = model
        self.engine = engine
        self.log_path = Path(log_path)
        self.startup_timeout_s = startup_timeout_s
        self.transport = transport or UrllibTransport()
        self.clock = clock
        self.sleep = sleep
        # One port for the run: the load generator keeps its address across restarts.
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.notify: Callable[[str], None] = lambda text: None
        self.knobs = engine_knobs_of(engine, {})
        self.starts = 0
        self.restarts = 0
        self._process: Supervisor | None = None

    # -- what the sweep reads -------------------------------------------------------------------

    def command_line(self, knobs: EngineKnobs) -> str:
        """The command that serves ``knobs`` (``best/command.txt``), quoted for a shell."""
        return shlex.join(format_command(self.template, knobs, self.engine, self.port))

    def model_config(self) -> mc.ModelConfig:
        """A stand-in config: the model's name, its engine as the backend, decoupled."""
        config = mc.ModelConfig(name=self.model, backend=self.engine, max_batch_size=0)
        config.model_transaction_policy.decoupled = True
        config.instance_group.add(count=1)
        return config

    def config_of(self, name: str) -> mc.ModelConfig | None:
        return self.model_config() if name == self.model else None

    def describe(self) -> dict[str, Any]:
        return {
            "kind": "command",
            "url": self.url,
            "device": self.device,
            "engine": self.engine,
            "command": self.template,
            "starts": self.starts,
            "restarts": self.restarts,
            "log": str(self.log_path),
        }

    # -- life cycle -----------------------------------------------------------------------------

    def start(self) -> None:
        """Start the server with the engine's own settings (the baseline)."""
        self._launch(self.knobs)

    def stop(self) -> None:
        if self._process is not None:
            self._process.stop()
            self._process = None

    def load_config(
        self,
        config: mc.ModelConfig,
        *,
        wait_for_model: bool = True,
        files: Mapping[str, bytes] | None = None,
    ) -> None:
        """Restart the server with the knobs of ``files`` (the engine file, vLLM's names; none:
        the engine's own settings), unless they are already running."""
        knobs = self.knobs_of(files)
        if knobs == self.knobs and self._process is not None and self._process.running():
            return
        self.notify(f"restarting the server with {knobs.label()}")
        self._launch(knobs)

    def knobs_of(self, files: Mapping[str, bytes] | None) -> EngineKnobs:
        """The knobs an engine file holds (none: the engine's own settings)."""
        data = (files or {}).get(ENGINE_FILE_KEY)
        if data is None:
            return engine_knobs_of(self.engine, {})
        return engine_knobs_of("vllm", json.loads(data))

    def ensure_alive(self) -> None:
        """A server that died is started again with the knobs it ran.

        Raises:
            TargetDiedError: it does not come back.
        """
        if self._process is not None and self._process.running() and self._healthy():
            return
        self.restarts += 1
        try:
            self._launch(self.knobs)
        except TargetError as exc:
            raise TargetDiedError(str(exc), self.url) from exc

    def _launch(self, knobs: EngineKnobs) -> None:
        self.stop()
        command = format_command(self.template, knobs, self.engine, self.port)
        # A group of its own: the engine's worker processes end with it.
        process = Supervisor(
            command, self.log_path, name="the served engine", label="engine", own_group=True
        )
        process.start()
        self._process = process
        self.starts += 1
        self.knobs = knobs
        deadline = self.clock() + self.startup_timeout_s
        while not self._ready():
            if not process.running():
                raise TargetError(
                    f"the server exited while starting (status {process.returncode()}): "
                    f"{process.log_tail()} (log: {self.log_path})"
                )
            if self.clock() > deadline:
                raise TargetError(
                    f"the server did not list model {self.model!r} within "
                    f"{self.startup_timeout_s:.0f} s (log: {self.log_path})"
                )
            self.sleep(0.5)

    def _healthy(self) -> bool:
        try:
            answer = self.transport.request(Request("GET", f"{self.url}/health", None, 5.0))
        except OSError:
            return False
        return answer.status == 200

    def _ready(self) -> bool:
        """Healthy, and the model is among ``/v1/models``."""
        if not self._healthy():
            return False
        try:
            answer = self.transport.request(Request("GET", f"{self.url}/v1/models", None, 5.0))
        except OSError:
            return False
        if answer.status != 200:
            return False
        payload = answer.payload()
        names = [m.get("id") for m in payload.get("data", [])] if isinstance(payload, dict) else []
        return self.model in names
