"""The facade the frontends call: :class:`InferenceServer` and its :class:`CoreOptions`.

The server owns the model repository, the lifecycle table (which model versions are READY,
LOADING, UNLOADING, UNAVAILABLE and why), the loaded :class:`~reference_server.core.model.ModelRuntime`
objects, the optional response cache, the devices and a Prometheus registry of its own. Every
failure is raised (or delivered) as a :class:`~reference_server.core.errors.ServerError` carrying
Triton's code and message; frontends only translate it to HTTP/gRPC.

Loading a new config for a loaded model builds and starts the new version first, then swaps it
in and lets the old one drain its queued and running requests, so no request is dropped.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import os
import shutil
import subprocess
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from prometheus_client import CollectorRegistry
from tritonclient.grpc import model_config_pb2 as mc

from reference_server.batching.instances import DeviceRegistry, RateLimitedDispatch
from reference_server.batching.rate_limiter import ResourceLimit
from reference_server.compat import TRITON_COMPAT_VERSION
from reference_server.core.cache import ResponseCache
from reference_server.core.config import (
    config_from_json,
    normalize,
    validate,
    validate_instance_groups,
)
from reference_server.core.engine_metrics import EngineCollector, EngineSource
from reference_server.core.ensemble import EnsembleRuntime
from reference_server.core.ensemble_config import check_steps, composing_models, is_ensemble
from reference_server.core.errors import Code, ServerError
from reference_server.core.gpu import GpuCollector, default_sources
from reference_server.core.model import ModelRuntime, RuntimeOptions
from reference_server.core.repository import (
    DUPLICATE_REASON,
    ModelRepository,
    ModelSource,
    check_model_name,
    select_versions,
)
from reference_server.core.shm import SharedMemoryRegistry
from reference_server.core.stats import MetricSource, ModelMetrics, TritonCollector, render_text
from reference_server.core.types import InferRequest, InferResponse

READY = "READY"
UNAVAILABLE = "UNAVAILABLE"
LOADING = "LOADING"
UNLOADING = "UNLOADING"

#: Extensions this server implements (``GET /v2``), in Triton's order.
EXTENSIONS = (
    "classification",
    "model_repository",
    "model_repository(unload_dependents)",
    "schedule_policy",
    "model_configuration",
    "system_shared_memory",
    "binary_tensor_data",
    "parameters",
    "statistics",
)

#: How long :meth:`InferenceServer.stop` waits for models to drain.
_STOP_DRAIN_S = 30.0


@dataclass(frozen=True)
class CoreOptions:
    """Server-wide settings of the core.

    Attributes:
        model_repositories: Repository directories.
        model_control_mode: ``"none"`` (load everything at start, no load/unload API),
            ``"poll"`` (treated as none: no rescans) or ``"explicit"`` (load
            ``startup_models`` at start; the API loads and unloads).
        startup_models: Models to load at start in explicit mode (``"*"`` = all).
        cache_size_bytes: Response cache size (0 = no cache; models must also enable it).
        rate_limit: ``"off"`` (ignore instance ``rate_limiter`` sections, Triton's default) or
            ``"execution_count"`` (instances wait for their resources before they run, and
            priority orders them: ``reference_server.batching.rate_limiter``).
        rate_limit_resources: ``--rate-limit-resource`` values; empty = each resource has the
            largest count any loaded instance asks for. Ignored with ``rate_limit="off"``.
        delay_scheduler: ``TRITONSERVER_DELAY_SCHEDULER``: dynamic batchers wait until this
            many requests are queued before forming the first batch (0 = off). Read the
            environment variable at the edge (:func:`delay_scheduler_from_env`).
        gpu_ids: GPUs to use; None = detect (``/proc/driver/nvidia/gpus``).
        strict_readiness: Server not ready while a model failed to load.
        device: Default device of onnxruntime models (``"cpu"``, ``"cuda"`` or ``"auto"``)
            unless their config sets the ``device`` parameter.
        metrics_counter_latencies: ``--metrics-config counter_latencies`` (Triton quirk: false
            freezes every per-model counter).
        metrics_histogram_latencies: ``--metrics-config histogram_latencies``: publish
            ``nv_inference_first_response_histogram_ms``.
    """

    model_repositories: tuple[Path, ...] = ()
    model_control_mode: Literal["none", "poll", "explicit"] = "explicit"
    startup_models: tuple[str, ...] = ()
    cache_size_bytes: int = 0
    rate_limit: Literal["off", "execution_count"] = "off"
    rate_limit_resources: tuple[ResourceLimit, ...] = ()
    delay_scheduler: int = 0
    gpu_ids: tuple[int, ...] | None = None
    strict_readiness: bool = True
    device: str = "auto"
    metrics_counter_latencies: bool = True
    metrics_histogram_latencies: bool = False


#: Triton's ``Status::CodeString`` phrases, used in load-failure reasons.
_CODE_PHRASES = {
    Code.UNKNOWN: "Unknown",
    Code.INTERNAL: "Internal",
    Code.NOT_FOUND: "Not found",
    Code.INVALID_ARG: "Invalid argument",
    Code.UNAVAILABLE: "Unavailable",
    Code.UNSUPPORTED: "Unsupported",
    Code.ALREADY_EXISTS: "Already exists",
    Code.CANCELLED: "Cancelled",
}


def _code_phrase(code: Code) -> str:
    return _CODE_PHRASES.get(code, code.value)


def delay_scheduler_from_env(environ: dict[str, str] | None = None) -> int:
    """Read ``TRITONSERVER_DELAY_SCHEDULER`` (0 when unset or not a number)."""
    env = os.environ if environ is None else environ
    try:
        return max(0, int(env.get("TRITONSERVER_DELAY_SCHEDULER", "0")))
    except ValueError:
        return 0


def detect_gpus() -> tuple[int, ...]:
    """GPU ids visible through the NVIDIA driver (empty on CPU-only hosts).

    Reads ``/proc/driver/nvidia/gpus``; where that is not mounted (some containers), asks
    ``nvidia-smi -L``.
    """
    root = Path("/proc/driver/nvidia/gpus")
    try:
        count = len(list(root.iterdir()))
        if count:
            return tuple(range(count))
    except OSError:
        pass
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return ()
    try:
        listing = subprocess.run(
            [smi, "-L"], capture_output=True, text=True, timeout=10, check=False
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return ()
    return tuple(range(sum(1 for line in listing.splitlines() if line.startswith("GPU "))))


class _LoopInbox:
    """Hands results from worker threads to one asyncio loop, many per wake-up.

    ``loop.call_soon_threadsafe`` writes to the loop's self-pipe on every call; at high
    concurrency that was a visible share of the event-loop thread's time. Results are queued
    here instead and one scheduled drain resolves every result that arrived before it runs, so a
    batch completed on an instance thread costs the loop one wake-up, not one per request.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._lock = threading.Lock()
        self._items: collections.deque[
            tuple[asyncio.Future[InferResponse], InferResponse | ServerError]
        ] = collections.deque()
        self._scheduled = False

    def put(
        self, future: asyncio.Future[InferResponse], result: InferResponse | ServerError
    ) -> None:
        """Queue ``result`` for ``future`` (any thread); schedules a drain if none is pending.

        Raises:
            RuntimeError: the loop is closed (the caller logs it, as before).
        """
        with self._lock:
            self._items.append((future, result))
            if self._scheduled:
                return
            self._scheduled = True
        try:
            self.loop.call_soon_threadsafe(self._drain)
        except RuntimeError:
            with self._lock:
                self._scheduled = False
            raise

    def _drain(self) -> None:
        with self._lock:
            items, self._items = self._items, collections.deque()
            self._scheduled = False
        for future, result in items:
            if future.done():
                continue  # the handler was cancelled (client went away)
            if isinstance(result, ServerError):
                future.set_exception(result)
            else:
                future.set_result(result)


#: A loaded model version: one network (its batcher, instances and backends) or an ensemble.
Runtime = ModelRuntime | EnsembleRuntime


@dataclass
class _ModelState:
    """Lifecycle of one model name: per version state and reason, and what is serving."""

    versions: dict[str, tuple[str, str]] = field(default_factory=dict)
    runtimes: dict[str, Runtime] = field(default_factory=dict)
    from_override: bool = False
    fingerprint: tuple[tuple[str, int, int], ...] = ()
    failed: bool = False
    last_error: str = ""
    override: ModelSource | None = None


@dataclass
class _LoadLock:
    """Serializes the loads of one model name; ``users`` counts loads holding or awaiting it."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    users: int = 0


class InferenceServer:
    """The core of the reference server: models, scheduling, statistics, metrics.

    Args:
        options: Server settings.
        registry: Prometheus registry to publish into (a new one by default); ``/metrics``
            renders it with :meth:`metrics_text`.
    """

    def __init__(self, options: CoreOptions, registry: CollectorRegistry | None = None) -> None:
        self.options = options
        self.registry = registry if registry is not None else CollectorRegistry()
        self.gpu_ids = options.gpu_ids if options.gpu_ids is not None else detect_gpus()
        self.repository = ModelRepository(options.model_repositories)
        self.cache = ResponseCache(options.cache_size_bytes) if options.cache_size_bytes else None
        self.devices = DeviceRegistry()
        #: Regions clients registered (``systemsharedmemory`` extension), shared by both
        #: frontends.
        self.shared_memory = SharedMemoryRegistry()
        if options.rate_limit not in ("off", "execution_count"):
            raise ServerError(
                f"invalid argument for --rate-limit: '{options.rate_limit}' (use off or "
                "execution_count)",
                Code.INVALID_ARG,
            )
        self.rate_limiter = (
            RateLimitedDispatch(options.rate_limit_resources)
            if options.rate_limit == "execution_count"
            else None
        )
        self._runtime_options = RuntimeOptions(
            devices=self.devices,
            delay_count=options.delay_scheduler,
            cache=self.cache,
            default_device=options.device,
            rate_limiter=self.rate_limiter,
        )
        self._models: dict[str, _ModelState] = {}
        self._lock = threading.RLock()
        self._load_locks: dict[str, _LoadLock] = {}  # only names with a load under way
        self._live = False
        self._stopping = False
        self._inbox: _LoopInbox | None = None  # of the loop that called infer() last
        self.registry.register(
            TritonCollector(
                self._metric_sources, self.cache.gauges if self.cache is not None else None
            )
        )
        self.registry.register(GpuCollector(default_sources(self.devices.devices)))
        self.registry.register(EngineCollector(self._engine_sources))

    # ------------------------------------------------------------------ life cycle

    def start(self) -> None:
        """Load the startup models (all of them unless the control mode is explicit).

        A model that fails to load is recorded as UNAVAILABLE with its reason; the server
        still starts (and reports not ready while strict readiness is on).
        """
        if self.options.model_control_mode == "explicit":
            names = list(self.options.startup_models)
            if "*" in names:
                names = self.repository.names()
        else:
            names = self.repository.names()
        self._live = True
        for name in names:
            try:
                self._load(name, None, None)
            except ServerError:
                pass  # recorded in the lifecycle table

    def stop(self) -> None:
        """Stop accepting requests and drain every model (bounded wait)."""
        with self._lock:
            self._stopping = True
            runtimes = [rt for st in self._models.values() for rt in st.runtimes.values()]
        for rt in runtimes:
            rt.stop(wait=False)
        deadline = time.monotonic() + _STOP_DRAIN_S
        for rt in runtimes:
            rt.join(deadline)
        self.shared_memory.close()
        self.repository.close()

    def is_live(self) -> bool:
        """True once started (Triton stays live while shutting down)."""
        return self._live

    def is_ready(self) -> bool:
        """Live, not stopping and (strict readiness) no model failed at the load stage.

        As in Triton 2.51, a config refused while polling (unknown name, unparsable or invalid
        config) leaves readiness alone; a model that failed at the load stage and serves no
        version makes the server not ready until a load of it succeeds (unloading it does not
        clear that, in Triton either).
        """
        if not self._live or self._stopping:
            return False
        if not self.options.strict_readiness:
            return True
        with self._lock:
            return not any(st.failed and not st.runtimes for st in self._models.values())

    # ------------------------------------------------------------------ lookup

    def _lookup(self, name: str, version: str = "") -> Runtime:
        """Triton's model lookup with its error codes and messages (§1)."""
        with self._lock:
            st = self._models.get(name)
            if version:
                if st is None or version not in st.versions:
                    raise ServerError(
                        f"Request for unknown model: '{name}' version {version} is not found",
                        Code.NOT_FOUND,
                    )
                runtime = st.runtimes.get(version)
                if runtime is None or st.versions[version][0] != READY:
                    raise ServerError(
                        f"Request for unknown model: '{name}' version {version} is not at "
                        "ready state",
                        Code.UNAVAILABLE,
                    )
                return runtime
            if st is None:
                raise ServerError(
                    f"Request for unknown model: '{name}' is not found", Code.NOT_FOUND
                )
            ready = [v for v, rt in st.runtimes.items() if st.versions.get(v, ("",))[0] == READY]
            if not ready:
                raise ServerError(
                    f"Request for unknown model: '{name}' has no available versions",
                    Code.NOT_FOUND,
                )
            return st.runtimes[max(ready, key=int)]

    def model_ready(self, name: str, version: str = "") -> bool:
        """True when the model (version) is READY; raises per §1 when unknown/not ready."""
        self._lookup(name, version)
        return True

    # ------------------------------------------------------------------ metadata

    def server_metadata(self) -> dict[str, Any]:
        """``GET /v2``: name, version and the extensions implemented here."""
        return {"name": "triton", "version": TRITON_COMPAT_VERSION, "extensions": list(EXTENSIONS)}

    def model_metadata(self, name: str, version: str = "") -> dict[str, Any]:
        """KServe v2 model metadata; ``versions`` lists every READY version unless one is given."""
        runtime = self._lookup(name, version)
        meta = runtime.metadata()
        if not version:
            with self._lock:
                st = self._models[name]
                meta["versions"] = sorted(
                    (v for v, (s, _) in st.versions.items() if s == READY and v in st.runtimes),
                    key=int,
                )
        return meta

    def model_config(self, name: str, version: str = "") -> mc.ModelConfig:
        """The normalized config of a READY model version (a copy)."""
        cfg = mc.ModelConfig()
        cfg.CopyFrom(self._lookup(name, version).config)
        return cfg

    def device_info(self, name: str, version: str = "") -> list[dict[str, str]]:
        """What each instance of the model actually runs on.

        For onnxruntime models this names the execution provider that ONNX Runtime really
        used (``CUDAExecutionProvider`` or ``CPUExecutionProvider``); reports quote it.
        """
        return self._lookup(name, version).device_info()

    def pause_device(self, name: str, seconds: float) -> None:
        """Test hook: executions of ``name`` that start in the next ``seconds`` wait it out.

        Requests keep queueing meanwhile, as when a GPU stalls; used to check that the
        measurement engine does not hide such stalls (coordinated omission).
        """
        self._lookup(name).pause(seconds)

    # ------------------------------------------------------------------ repository

    def repository_index(self, ready_only: bool = False) -> list[dict[str, str]]:
        """Repository index entries sorted by name then version (§2.6)."""
        with self._lock:
            names = set(self.repository.names()) | set(self._models)
            out: list[dict[str, str]] = []
            for name in sorted(names):
                st = self._models.get(name)
                if st is None or not st.versions:
                    if not ready_only:
                        out.append({"name": name})
                    continue
                for version in sorted(st.versions, key=int):
                    state, reason = st.versions[version]
                    if ready_only and state != READY:
                        continue
                    entry = {"name": name, "version": version, "state": state}
                    if reason:
                        entry["reason"] = reason
                    out.append(entry)
            return out

    def _check_control_mode(self) -> None:
        if self.options.model_control_mode != "explicit":
            raise ServerError(
                "explicit model load / unload is not allowed if polling is enabled",
                Code.UNAVAILABLE,
            )

    def load_model(
        self, name: str, config_json: str | None = None, files: dict[str, bytes] | None = None
    ) -> None:
        """Load or reload a model (explicit mode); synchronous.

        Args:
            name: Model name.
            config_json: A ModelConfig as a JSON string; replaces the on-disk config.
            files: ``{"file:<version>/<path>": bytes}`` forming a whole model directory.

        A load without a config override after one with an override keeps that override (and
        the files that came with it), as Triton 2.51 does; send the config again to be sure.

        Raises:
            ServerError: UNAVAILABLE outside explicit mode; INTERNAL ``failed to poll`` when the
                name is invalid, the model is not in the repository or the config (override)
                is refused; INVALID_ARG ``load failed for model ...`` when it fails to load.
        """
        self._check_control_mode()
        check_model_name(name)  # before anything is keyed by the name
        self._load(name, config_json, files)

    def unload_model(self, name: str, unload_dependents: bool = False) -> None:
        """Start unloading a model; returns at once, in-flight requests still finish."""
        del unload_dependents  # no ensembles here, so nothing depends on a model
        self._check_control_mode()
        with self._lock:
            st = self._models.get(name)
            if st is None:
                return
            st.override = None  # Triton forgets an override on unload: the next load reads disk
            if not st.runtimes:
                return
            runtimes = dict(st.runtimes)
            st.runtimes.clear()
            for version in runtimes:
                st.versions[version] = (UNLOADING, "")
        for version, runtime in runtimes.items():
            threading.Thread(
                target=self._finish_unload,
                args=(name, version, runtime),
                name=f"unload-{name}",
                daemon=True,
            ).start()

    def _finish_unload(self, name: str, version: str, runtime: Runtime) -> None:
        runtime.stop(wait=True)
        with self._lock:
            st = self._models.get(name)
            if st is not None and st.versions.get(version, ("",))[0] == UNLOADING:
                st.versions[version] = (UNAVAILABLE, "unloaded")

    @contextlib.contextmanager
    def _load_lock(self, name: str) -> Iterator[None]:
        """Hold the load lock of ``name``: loads of one name run one at a time.

        The entry goes when its last user leaves, so loads of names that never turn into a
        model (a client trying made-up names) leave nothing behind. Counting users, rather
        than deleting on release, keeps a waiting load on the same lock as the one running: a
        new entry is only made when no load of the name holds or awaits one.
        """
        with self._lock:
            entry = self._load_locks.get(name)
            if entry is None:
                entry = self._load_locks[name] = _LoadLock()
            entry.users += 1
        try:
            with entry.lock:
                yield
        finally:
            with self._lock:
                entry.users -= 1
                if entry.users == 0:
                    del self._load_locks[name]

    def _load(
        self,
        name: str,
        config_json: str | None,
        files: dict[str, bytes] | None,
    ) -> None:
        """Load (or reload) a model the way Triton does, in two stages.

        Poll stage (read, normalize, validate the config): failures are INTERNAL ``failed to
        poll``, and the model's lifecycle is untouched. Load stage (instance groups, versions,
        backends): failures are INVALID_ARG ``load failed ... version <v> is at UNAVAILABLE
        state: ...`` and the index records the reason. Either way a version already serving
        keeps serving.
        """
        with self._load_lock(name):
            with self._lock:
                kept = self._models[name].override if name in self._models else None
            source: ModelSource | None = None
            try:
                override = config_from_json(config_json) if config_json is not None else None
                if override is None and not files and kept is not None:
                    source = kept
                else:
                    source = self.repository.read(name, override, files)
                cfg = normalize(source.config, model_name=name, gpu_ids=self.gpu_ids)
                validate(cfg, dir_name=name, gpu_ids=self.gpu_ids, instance_groups=False)
            except ServerError as exc:
                if files and source is not None:
                    self.repository.discard(source)  # the files of a refused load
                if exc.code == Code.INTERNAL and "failed to poll" in exc.message:
                    raise
                # Triton 2.51 leaves no index entry for a model refused at this stage; it is
                # recorded here anyway (UNAVAILABLE + reason, as for load-stage failures) so
                # that startup checks and users can see why a model is missing.
                duplicate = exc.message == DUPLICATE_REASON
                reason = exc.message if duplicate else f"{_code_phrase(exc.code)}: {exc.message}"
                self._record_failure(name, reason, load_stage=False)
                # Triton answers only "failed to poll" and logs the reason; the reason is
                # appended here so that clients see why (a deliberate, documented addition).
                raise ServerError(
                    f"failed to load '{name}', failed to poll from model repository: {exc.message}",
                    Code.INTERNAL,
                ) from exc
            if is_ensemble(cfg):
                try:
                    check_steps(cfg, self._composing_configs(cfg))
                except ServerError as exc:
                    # Triton checks an ensemble against its dependencies before any version
                    # loads, and answers with that check's message alone.
                    self._record_failure(
                        name, f"{_code_phrase(exc.code)}: {exc.message}", load_stage=True
                    )
                    raise ServerError(
                        f"load failed for model '{name}': {exc.message}\n", Code.INVALID_ARG
                    ) from exc
            with self._lock:
                st = self._models.setdefault(name, _ModelState())
                current = dict(st.runtimes)
            version = "1"
            new: dict[str, Runtime] = {}
            try:
                validate_instance_groups(cfg, self.gpu_ids)
                versions = select_versions(cfg, source.directory)
                unchanged = (
                    (source is kept or (not source.from_override and not st.from_override))
                    and current
                    and set(current) == {v for v, _ in versions}
                    and all(rt.config == cfg for rt in current.values())
                    and source.fingerprint == st.fingerprint
                )
                if unchanged:
                    return
                with self._lock:
                    for v, _ in versions:
                        if v not in current:
                            st.versions[v] = (LOADING, "")
                for version, path in versions:
                    metrics = (
                        current[version].stats.metrics
                        if version in current
                        else ModelMetrics(
                            counters=self.options.metrics_counter_latencies,
                            histogram=self.options.metrics_histogram_latencies,
                        )
                    )
                    runtime: Runtime
                    if is_ensemble(cfg):
                        runtime = EnsembleRuntime(cfg, version, path, metrics, self.submit)
                    else:
                        runtime = ModelRuntime(cfg, version, path, self._runtime_options, metrics)
                    runtime.load()
                    new[version] = runtime
            except ServerError as exc:
                for runtime in new.values():
                    runtime.stop(wait=False)
                if files:
                    self.repository.discard(source)  # the new runtimes stopped: unused
                reason = f"{_code_phrase(exc.code)}: {exc.message}"
                self._record_failure(name, reason, load_stage=True)
                raise ServerError(
                    f"load failed for model '{name}': version {version} is at UNAVAILABLE "
                    f"state: {reason};\n",
                    Code.INVALID_ARG,
                ) from exc
            with self._lock:
                st.runtimes = new
                st.from_override = source.from_override
                st.fingerprint = source.fingerprint
                st.override = source if source.from_override else None
                st.failed = False
                st.last_error = ""
                for v in current:
                    if v not in new:
                        st.versions[v] = (UNAVAILABLE, "unloaded")
                for v in new:
                    st.versions[v] = (READY, "")
            for runtime in current.values():
                runtime.stop(wait=False)

    def _composing_configs(self, cfg: mc.ModelConfig) -> dict[str, mc.ModelConfig]:
        """The serving configs of an ensemble's composing models, each loaded first if it is
        not serving yet (as Triton loads an ensemble's dependencies with it).

        Raises:
            ServerError: Triton's message for a dependency that is missing or did not load.
        """
        needed = composing_models(cfg)
        known = set(self.repository.names())
        missing = sorted(n for n in needed if n not in known and not self._serving(n))
        if missing:
            raise ServerError(
                f"ensemble {cfg.name} contains models that are not available or ambiguous: "
                + ", ".join(missing),
                Code.INVALID_ARG,
            )
        configs = {}
        for name in needed:
            if not self._serving(name):
                try:
                    self._load(name, None, None)
                except ServerError as exc:
                    reason = exc.__cause__ if isinstance(exc.__cause__, ServerError) else exc
                    raise ServerError(
                        f"ensemble '{cfg.name}' depends on '{name}' which has no loaded version. "
                        f"Model '{name}' loading failed with error: {reason.message}",
                        Code.INVALID_ARG,
                    ) from exc
            configs[name] = self._lookup(name).config
        return configs

    def _serving(self, name: str) -> bool:
        with self._lock:
            return name in self._models and bool(self._models[name].runtimes)

    def load_errors(self) -> dict[str, str]:
        """Why each model that is not serving failed to load (``"<code phrase>: <msg>"``)."""
        with self._lock:
            return {
                name: st.last_error
                for name, st in sorted(self._models.items())
                if not st.runtimes and st.last_error
            }

    def _record_failure(self, name: str, reason: str, *, load_stage: bool) -> None:
        """Note why a load failed; only a load-stage failure can make the server not ready."""
        with self._lock:
            st = self._models.setdefault(name, _ModelState())
            serving = set(st.runtimes)
            # Versions that were being added become UNAVAILABLE; a serving one stays READY.
            for version, (state, _) in list(st.versions.items()):
                if version not in serving and state != UNAVAILABLE:
                    st.versions[version] = (UNAVAILABLE, reason)
            if serving:
                return
            st.failed = st.failed or load_stage
            st.last_error = reason
            if not st.versions:
                st.versions["1"] = (UNAVAILABLE, reason)
            else:
                for version in st.versions:
                    st.versions[version] = (UNAVAILABLE, reason)

    # ------------------------------------------------------------------ statistics, metrics

    def model_statistics(self, name: str = "", version: str = "") -> dict[str, Any]:
        """``{"model_stats": [...]}`` as Triton's statistics extension renders it (§7)."""
        with self._lock:
            if not name:
                selected = [
                    rt
                    for n in sorted(self._models)
                    for v, rt in sorted(self._models[n].runtimes.items(), key=lambda x: int(x[0]))
                    if self._models[n].versions.get(v, ("",))[0] == READY
                ]
                return {"model_stats": [rt.stats.to_json() for rt in selected]}
            st = self._models.get(name)
            ready = {
                v: rt
                for v, rt in (st.runtimes.items() if st else [])
                if st is not None and st.versions.get(v, ("",))[0] == READY
            }
            if not ready:
                raise ServerError(f"requested model '{name}' is not available", Code.INVALID_ARG)
            if version:
                if version not in ready:
                    raise ServerError(
                        f"requested model version is not available for model '{name}'",
                        Code.INVALID_ARG,
                    )
                return {"model_stats": [ready[version].stats.to_json()]}
            return {"model_stats": [ready[v].stats.to_json() for v in sorted(ready, key=int)]}

    def _metric_sources(self) -> list[MetricSource]:
        with self._lock:
            runtimes = [rt for st in self._models.values() for rt in st.runtimes.values()]
        return [
            MetricSource(
                rt.name,
                rt.version,
                rt.stats.metrics,
                dict(rt.config.metric_tags),
                rt.cache is not None,
                tuple(rt.device_info()),
            )
            for rt in sorted(runtimes, key=lambda r: (r.name, int(r.version)))
        ]

    def _engine_sources(self) -> list[EngineSource]:
        with self._lock:
            runtimes = [rt for st in self._models.values() for rt in st.runtimes.values()]
        sources = []
        for rt in sorted(runtimes, key=lambda r: (r.name, int(r.version))):
            if not isinstance(rt, ModelRuntime):
                continue
            for index, instance in enumerate(rt.instances):
                # A generative backend (one vLLM engine per instance) reports its figures.
                report = getattr(instance.backend, "engine_figures", None)
                figures = report() if report is not None else None
                if figures is not None:
                    sources.append(EngineSource(rt.name, index, *figures))
        return sources

    def metrics_text(self) -> str:
        """The ``/metrics`` body: Triton's names, no ``_total`` suffix on counters.

        Use this rather than ``prometheus_client.generate_latest`` (which renames counters).
        """
        return render_text(self.registry)

    # ------------------------------------------------------------------ inference

    def submit(
        self, request: InferRequest, callback: Callable[[InferResponse | ServerError], None]
    ) -> None:
        """Start an inference; ``callback`` receives the response or the error exactly once.

        Errors found before the request is queued (unknown model, validation, queue full,
        stopping) are delivered through ``callback`` too, before ``submit`` returns. Other
        results arrive on an instance or batcher thread.
        """
        request.request_start_ns = time.monotonic_ns()
        try:
            runtime = self._lookup(request.model_name, request.model_version)
            runtime.submit(request, callback)
        except ServerError as exc:
            callback(exc)

    async def infer(self, request: InferRequest) -> InferResponse:
        """Run one inference from an asyncio loop.

        Raises:
            ServerError: with Triton's code and message.
        """
        loop = asyncio.get_running_loop()
        inbox = self._inbox
        if inbox is None or inbox.loop is not loop:
            # Normally one loop serves both frontends; a new one (tests) gets a new inbox, and
            # requests still in flight keep theirs through the callback below.
            inbox = self._inbox = _LoopInbox(loop)
        future: asyncio.Future[InferResponse] = loop.create_future()

        def callback(result: InferResponse | ServerError) -> None:
            inbox.put(future, result)

        self.submit(request, callback)
        try:
            return await future
        except asyncio.CancelledError:
            request.cancel()
            raise

    async def infer_stream(self, request: InferRequest) -> AsyncIterator[InferResponse]:
        """Every response of one request, from an asyncio loop: a decoupled model's stream
        (``response.final`` on the last), or the single response of any other model.

        Raises:
            ServerError: with Triton's code and message (before or during the stream).
        """
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[InferResponse | ServerError] = asyncio.Queue()

        def callback(result: InferResponse | ServerError) -> None:
            try:
                loop.call_soon_threadsafe(queue.put_nowait, result)
            except RuntimeError:
                pass  # the loop closed: nobody is listening any more

        request.stream_responses = True
        self.submit(request, callback)
        complete = False
        try:
            while not complete:
                result = await queue.get()
                if isinstance(result, ServerError):
                    complete = True
                    raise result
                complete = result.final
                yield result
        finally:
            if not complete:
                # Left early (client gone): stop generating for nobody.
                request.cancel()

    def is_decoupled(self, name: str, version: str = "") -> bool:
        """Whether the model answers through a stream (raises per §1 when unknown)."""
        return bool(self._lookup(name, version).config.model_transaction_policy.decoupled)

    def infer_sync(self, request: InferRequest, timeout_s: float | None = None) -> InferResponse:
        """Blocking inference for threads and tests.

        Raises:
            ServerError: with Triton's code and message.
            TimeoutError: no answer within ``timeout_s``.
        """
        done = threading.Event()
        box: list[InferResponse | ServerError] = []

        def callback(result: InferResponse | ServerError) -> None:
            box.append(result)
            done.set()

        self.submit(request, callback)
        if not done.wait(timeout_s):
            raise TimeoutError(f"no response for request '{request.id}' in {timeout_s} s")
        result = box[0]
        if isinstance(result, ServerError):
            raise result
        return result
