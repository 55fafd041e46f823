"""The server under test, behind one protocol, and the HTTP both implementations share.

:class:`Target` (start, push a config, ensure alive, stop), :func:`load_configs` (a trial's
configs, one per tuned model), :class:`ConfigRejectedError`,
:func:`untunable_reason` (a model config the search cannot tune), and ``_HttpTarget``: how
a config is pushed without a restart (``POST /v2/repository/models/<m>/load`` with
``{"parameters": {"config": <JSON>}}``, then wait until the model is ready) and what each
instance runs on (:func:`read_device_info`, :func:`observed_device`). Plain HTTP (urllib)
through :mod:`analyzer.target.transport`: no gevent, no tritonclient client.
"""

from __future__ import annotations

import base64
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from google.protobuf import json_format
from tritonclient.grpc import model_config_pb2 as mc

from analyzer.config.access import PLAIN, ServerAccess
from analyzer.config.pipeline import is_ensemble
from analyzer.errors import InputError, TargetDiedError, TargetError
from analyzer.target.liveness import live
from analyzer.target.server_stats import parse_device_info
from analyzer.target.transport import Request, Transport, UrllibTransport


class ConfigRejectedError(TargetError):
    """The server refused a config (the trial fails; the sweep goes on)."""


#: What Triton answers a load request with when its model control mode is not explicit.
CONTROL_MODE_REFUSAL = "explicit model load / unload is not allowed"


def control_mode_error(url: str, said: str) -> InputError:
    """A server that loads no model on request (Triton not in explicit mode): no trial can run,
    and the fix is how the server is started, so the run stops (exit 2) rather than fail
    every trial."""
    return InputError(
        f"the server at {url} does not load models on request ({said}): start tritonserver "
        "with --model-control-mode=explicit (and --load-model=MODEL) for perfsweep to load "
        "each trial's config"
    )


def load_configs(
    target: Target,
    configs: Sequence[mc.ModelConfig],
    files: Mapping[str, bytes] | None = None,
) -> None:
    """Load a trial's configs, one per tuned model, in order (each waits until ready);
    ``files`` (``file:<path>`` to contents: a generative engine's settings file) go with the
    one model's config (without them the model's own files on the server are used)."""
    if files:
        if len(configs) != 1:
            raise ValueError("files go with one model's config, not a pipeline's")
        target.load_config(configs[0], files=files)
        return
    for config in configs:
        target.load_config(config)


def untunable_reason(config: mc.ModelConfig) -> str | None:
    """Why perfsweep must not tune this model, or None.

    ``dynamic_batching``, ``sequence_batching`` and ``ensemble_scheduling`` share one proto
    ``oneof``: setting the first erases the others, which would silently change what an ensemble
    or a stateful model means. A stateful model with the sequence batcher's ``oldest`` strategy
    is tuned in place (:func:`analyzer.config.model_config.apply_knobs` writes into ``oldest``); the
    ``direct`` strategy has nothing to tune, and an ensemble schedules its composing models (a
    sweep tunes those: :class:`analyzer.config.pipeline.Tuned`).
    """
    kind = config.WhichOneof("scheduling_choice")
    if is_ensemble(config):
        return (
            f'model {config.name!r} is an ensemble (platform "ensemble" / '
            "ensemble_scheduling), which has no batcher of its own: its composing models do the "
            f"batching. `perfsweep run --model {config.name}` tunes them together; here, tune "
            "a composing model by name"
        )
    if config.model_transaction_policy.decoupled:
        return (
            f"model {config.name!r} is decoupled (model_transaction_policy "
            "{ decoupled: true }): it answers a request with a stream of responses, as a "
            "generative model's engine does, so a dynamic-batching sweep cannot tune it. "
            f"`perfsweep load --model {config.name} --protocol grpc-stream` (or "
            "generate-stream, openai) measures its time to first token, inter-token latency, "
            "tokens/s and goodput"
        )
    if kind == "sequence_batching" and not config.sequence_batching.HasField("oldest"):
        return (
            f"model {config.name!r} is sequence-batched with the direct strategy (a stateful "
            "model): the direct strategy has no batching delay to tune (a batch is every "
            "slot's next request); use oldest "
            "(sequence_batching { oldest { ... } }), whose max_queue_delay_microseconds, "
            "preferred_batch_size and max_candidate_sequences perfsweep tunes with the instance "
            "count and max_batch_size"
        )
    return None


class Target(Protocol):
    """The server under test.

    Attributes:
        model: The model being tuned.
        url: Base HTTP URL (``http://host:port``).
        device: ``sim``, ``cpu``, ``cuda`` for a managed server; ``remote`` otherwise.
        shared: The server outlives the sweep (``--url``): the sweep must leave it on a
            known config. A managed server is stopped instead.
        notify: Told what the target does about a dead server (a restart, a wait): the live
            view sets it.
        access: The TLS files and headers every request to it carries.
    """

    model: str
    url: str
    device: str
    shared: bool
    notify: Callable[[str], None]
    access: ServerAccess

    def start(self) -> None:
        """Start (or connect to) the server and wait until the model is ready."""
        ...

    def stop(self) -> None:
        """Stop what :meth:`start` started (a remote server is left running)."""
        ...

    def model_config(self) -> mc.ModelConfig:
        """The model's current config as the server reports it."""
        ...

    def load_config(
        self,
        config: mc.ModelConfig,
        *,
        wait_for_model: bool = True,
        files: Mapping[str, bytes] | None = None,
    ) -> None:
        """Reload model ``config.name`` (the tuned model when the config names none, or one of
        the pipeline's composing models) with ``config``, no server restart, and wait until it
        and (``wait_for_model``) :attr:`model` are ready. A composing model's probe config may
        break the pipeline that calls it (Triton refuses an ensemble whose step batches less
        than the ensemble): that load waits for the composing model alone.

        ``files`` (``file:<version>/<path>`` to contents) replace the model's files for this
        load, as Triton's repository load takes them beside ``config`` (a generative engine's
        ``1/model.json``); None: the files in the server's repository."""
        ...

    def config_of(self, name: str) -> mc.ModelConfig | None:
        """Model ``name``'s current config as the server reports it (a composing model's);
        None when the server answers that it has no such model.

        Raises:
            TargetError: The server did not answer.
        """
        ...

    def ensure_alive(self) -> None:
        """Return when the server answers. A dead managed server is restarted; a dead ``--url``
        server is waited for (``run.server_wait_s``). Either way the last config loaded is
        loaded again.

        Raises:
            TargetDiedError: The server is dead and cannot be brought back.
        """
        ...

    def describe(self) -> dict[str, Any]:
        """Facts for the summary: kind, url, device, server version."""
        ...


def _error_text(payload: Any) -> str:
    if isinstance(payload, dict) and "error" in payload:
        return str(payload["error"])
    return str(payload)


def config_to_json(config: mc.ModelConfig) -> str:
    """A ModelConfig as the JSON string the repository ``load`` override expects."""
    return json_format.MessageToJson(config, preserving_proto_field_name=True, indent=None)


def config_from_json(data: dict[str, Any]) -> mc.ModelConfig:
    """Parse a server's ``GET .../config`` JSON (unknown fields from newer servers ignored)."""
    return json_format.ParseDict(data, mc.ModelConfig(), ignore_unknown_fields=True)


def read_device_info(
    metrics_url: str, model: str, transport: Transport | None = None
) -> list[dict[str, str]]:
    """What each instance of ``model`` runs on, scraped from ``metrics_url``.

    Read from the reference server's ``perfsweep_model_device_info`` metric (backend, device,
    execution provider or simulated profile); empty when it cannot be read.
    """
    if not metrics_url:
        return []
    try:
        answer = (transport or UrllibTransport()).request(Request("GET", metrics_url, None, 5.0))
    except OSError:
        return []
    if answer.status != 200:
        return []
    return parse_device_info(answer.text(), model)


def observed_device(devices: list[dict[str, str]], requested: str) -> str:
    """``sim``, ``cuda`` or ``cpu`` as the server reports it; ``requested`` when unknown."""
    if not devices:
        return requested
    if all(d.get("backend") == "simulated" for d in devices):
        return "sim"
    kinds = {d.get("device", "") for d in devices}
    return "cuda" if "cuda" in kinds else (kinds.pop() if len(kinds) == 1 else requested)


class _HttpTarget:
    """What both targets share: the KServe v2 HTTP calls, through :attr:`transport`.

    ``clock`` and ``sleep`` pace the waits for readiness (tests pass a fake clock).
    """

    model: str
    url: str
    load_timeout_s: float = 300.0
    transport: Transport
    access: ServerAccess = PLAIN
    clock: Callable[[], float] = staticmethod(time.monotonic)
    sleep: Callable[[float], None] = staticmethod(time.sleep)
    notify: Callable[[str], None] = staticmethod(lambda text: None)
    #: The last config :meth:`load_config` pushed per model, in order (loaded again into a
    #: server that returns).
    _last_configs: dict[str, mc.ModelConfig] | None = None
    #: The files that went with each of those loads.
    _last_files: dict[str, dict[str, bytes]] | None = None

    def _call(
        self, method: str, path: str, body: Any = None, timeout_s: float = 10.0
    ) -> tuple[int, Any]:
        """(status, decoded JSON or text) of one request; :class:`OSError` when no answer."""
        answer = self.transport.request(Request(method, self.url + path, body, timeout_s))
        return answer.status, answer.payload()

    def _get(self, path: str, timeout_s: float = 10.0) -> tuple[int, Any]:
        return self._call("GET", path, timeout_s=timeout_s)

    def _is_live(self) -> bool:
        return live(self.url, self.transport)

    def _is_ready(self, model: str | None = None) -> bool:
        try:
            status, _ = self._get(f"/v2/models/{model or self.model}/ready", timeout_s=5.0)
        except OSError:
            return False
        return status == 200

    def model_config(self) -> mc.ModelConfig:
        status, payload = self._config_answer(self.model)
        if status != 200 or not isinstance(payload, dict):
            raise TargetError(
                f"{self.url} has no model {self.model!r} ({status}: {_error_text(payload)}); "
                "check --model and that the server loaded it"
            )
        return config_from_json(payload)

    def config_of(self, name: str) -> mc.ModelConfig | None:
        status, payload = self._config_answer(name)
        if status != 200 or not isinstance(payload, dict):
            return None
        return config_from_json(payload)

    def _config_answer(self, name: str) -> tuple[int, Any]:
        try:
            return self._get(f"/v2/models/{name}/config")
        except OSError as exc:
            raise TargetError(f"cannot read the config of {name} from {self.url}: {exc}") from exc

    def reload_last(self) -> None:
        """Load again every config :meth:`load_config` pushed, with its files (a server that
        came back)."""
        files = self._last_files or {}
        for name, config in list((self._last_configs or {}).items()):
            self.load_config(config, files=files.get(name) or None)

    def load_config(
        self,
        config: mc.ModelConfig,
        *,
        wait_for_model: bool = True,
        files: Mapping[str, bytes] | None = None,
    ) -> None:
        name = config.name or self.model
        parameters = {"config": config_to_json(config)}
        for key, data in (files or {}).items():
            parameters[key] = base64.b64encode(data).decode("ascii")
        body = {"parameters": parameters}
        path = f"/v2/repository/models/{name}/load"
        if files and self._is_ready(name):
            # Triton reloads a loaded model only when its config or its repository's files
            # changed: a load whose override files alone differ answers 200 and keeps the
            # running instances, with their old engine settings (seen on Triton 2.51 with a
            # Python-based vllm backend). Unloaded first, the model starts from the files.
            self._unload(name)
        try:
            status, payload = self._call("POST", path, body, timeout_s=self.load_timeout_s)
        except OSError as exc:
            if not self._is_live():
                raise TargetDiedError(
                    f"the server at {self.url} died while loading a config: {exc}", self.url
                ) from exc
            raise TargetError(f"loading a config into {self.url} failed: {exc}") from exc
        if status != 200:
            # A server that still answers refused this config (Triton reports a refused override
            # as 400 or as a 500 "failed to load"): the trial fails, the sweep goes on. A server
            # that went away died (restart or wait, and retry).
            if CONTROL_MODE_REFUSAL in _error_text(payload):
                raise control_mode_error(self.url, _error_text(payload))
            if self._is_live():
                raise ConfigRejectedError(
                    f"the server refused the config ({status}): {_error_text(payload)}"
                )
            raise TargetDiedError(
                f"the server at {self.url} died while loading a config ({status}: "
                f"{_error_text(payload)})",
                self.url,
            )
        deadline = self.clock() + self.load_timeout_s
        # A composing model's reload reloads the pipeline that calls it (Triton): both ready.
        for model in dict.fromkeys((name, self.model) if wait_for_model else (name,)):
            while not self._is_ready(model):
                if not self._is_live():
                    raise TargetDiedError(
                        f"the server at {self.url} died while loading {model}", self.url
                    )
                if self.clock() > deadline:
                    raise TargetError(
                        f"{model} was not ready {self.load_timeout_s:.0f} s after load"
                    )
                self.sleep(0.1)
        if self._last_configs is None:
            self._last_configs = {}
        self._last_configs[name] = config
        self._last_files = {**(self._last_files or {}), name: dict(files or {})}

    def _unload(self, name: str) -> None:
        """Unload model ``name`` and wait until it is no longer ready.

        Raises:
            TargetError: the server refused, or the model stayed ready.
        """
        try:
            status, payload = self._call(
                "POST", f"/v2/repository/models/{name}/unload", {}, self.load_timeout_s
            )
        except OSError as exc:
            raise TargetError(f"unloading {name} from {self.url} failed: {exc}") from exc
        if status != 200:
            raise TargetError(
                f"the server refused to unload {name} ({status}): {_error_text(payload)}"
            )
        deadline = self.clock() + self.load_timeout_s
        while self._is_ready(name):
            if self.clock() > deadline:
                raise TargetError(
                    f"{name} was still ready {self.load_timeout_s:.0f} s after unload"
                )
            self.sleep(0.1)

    def server_metadata(self) -> dict[str, Any]:
        try:
            status, payload = self._get("/v2")
        except OSError:
            return {}
        return payload if status == 200 and isinstance(payload, dict) else {}
