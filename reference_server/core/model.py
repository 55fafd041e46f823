"""One loaded model version: validation, scheduling, execution, statistics.

:class:`ModelRuntime` ties a normalized config to its instances (one backend object and thread
each), its :class:`~reference_server.batching.scheduler.Scheduler`, its
:class:`~reference_server.core.stats.ModelStats` and, when enabled, the server's response cache.
The facade (:mod:`reference_server.core.server`) looks models up and calls :meth:`ModelRuntime.submit`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from tritonclient.grpc import model_config_pb2 as mc

from reference_server.backends.base import BackendArgs
from reference_server.backends.registry import create_backend
from reference_server.batching.decide import BatchingParams, QueuePolicy
from reference_server.batching.instances import (
    DeviceRegistry,
    InstanceSpec,
    ModelInstance,
    PauseGate,
    RateLimitedDispatch,
)
from reference_server.batching.rate_limiter import InstanceLimits, ResourceNeed
from reference_server.batching.scheduler import Batch, Entry, Scheduler
from reference_server.batching.sequence import Controls, SequenceParams, SequenceScheduler
from reference_server.batching.sequence import unsupported as sequence_unsupported
from reference_server.core.cache import ResponseCache, cache_key
from reference_server.core.errors import BackendError, Code, DecoupledRefusal, ServerError
from reference_server.core.repository import inside
from reference_server.core.signature import RequestCheck, datatype_of, metadata_of
from reference_server.core.stats import ModelMetrics, ModelStats, RequestTiming
from reference_server.core.types import InferRequest, InferResponse

Callback = Callable[[InferResponse | ServerError], None]

logger = logging.getLogger(__name__)


@dataclass(eq=False)
class _Context:
    callback: Callback
    cache_key: str | None = None
    lookup_ns: int = 0


def _queue_policy(policy: mc.ModelQueuePolicy) -> QueuePolicy:
    return QueuePolicy(
        delay_on_timeout=policy.timeout_action == mc.ModelQueuePolicy.DELAY,
        default_timeout_us=int(policy.default_timeout_microseconds),
        allow_timeout_override=bool(policy.allow_timeout_override),
        max_queue_size=int(policy.max_queue_size),
    )


class _Sequencer:
    """Releases responses strictly in slot order (``preserve_ordering``, §3.10)."""

    def __init__(self) -> None:
        self._next = 0
        self._done: dict[int, Callable[[], None]] = {}
        self._lock = threading.Lock()

    def complete(self, slot: int, deliver: Callable[[], None]) -> None:
        # Deliveries run under the lock so two instance threads cannot interleave them out of
        # order; they only hand results over (call_soon_threadsafe), so this stays cheap.
        with self._lock:
            self._done[slot] = deliver
            while self._next in self._done:
                self._done.pop(self._next)()
                self._next += 1


@dataclass(frozen=True)
class RuntimeOptions:
    """Server-wide settings a model runtime needs.

    Attributes:
        delay_count: ``TRITONSERVER_DELAY_SCHEDULER`` (0 = off).
        cache: The server's response cache, None when the server has none.
        devices: The server's devices.
        default_device: ``device`` parameter for backends whose config does not set one.
        rate_limiter: The server's rate limiter (``--rate-limit execution_count``); None =
            off, instance ``rate_limiter`` sections are ignored.
    """

    devices: DeviceRegistry
    delay_count: int = 0
    cache: ResponseCache | None = None
    default_device: str = "auto"
    rate_limiter: RateLimitedDispatch | None = None


class ModelRuntime:
    """A loaded, serving model version.

    Args:
        config: Normalized, validated config.
        version: Version string.
        version_dir: ``<model dir>/<version>``.
        options: Server-wide settings.
        metrics: The version's metric counters, shared with the version it replaces.
    """

    def __init__(
        self,
        config: mc.ModelConfig,
        version: str,
        version_dir: Path,
        options: RuntimeOptions,
        metrics: ModelMetrics | None = None,
    ) -> None:
        self.config = config
        self.name = config.name
        self.version = version
        self.version_dir = version_dir
        self._options = options
        self.stats = ModelStats(self.name, version, metrics)
        self.cache = options.cache if config.response_cache.enable else None
        self.instances: list[ModelInstance] = []
        self.pause_gate = PauseGate()
        self._sequencer = _Sequencer()
        self._check = RequestCheck(config)
        self._labels: dict[str, list[str]] = {}
        self.scheduler = self._make_scheduler()
        #: Decoupled: the backend answers through each request's response sender, any number
        #: of times, the last flagged final (a stream), instead of once from ``execute``.
        self.decoupled = bool(config.model_transaction_policy.decoupled)

    # ------------------------------------------------------------------ life cycle

    def _make_scheduler(self) -> Scheduler:
        cfg = self.config
        active = sum(g.count * max(1, len(g.gpus)) for g in cfg.instance_group if not g.passive)
        dispatch = self._options.rate_limiter
        if cfg.HasField("sequence_batching"):
            reason = sequence_unsupported(cfg)
            if reason is not None:
                raise ServerError(reason, Code.UNSUPPORTED)
            # Sequence slots belong to instances: the rate limiter does not reorder them here.
            return SequenceScheduler(
                self.name,
                SequenceParams.from_config(cfg),
                Controls.from_config(cfg),
                instance_count=active,
                on_reject=self._on_reject,
            )
        if not cfg.HasField("dynamic_batching"):
            return Scheduler(self.name, None, instance_count=active, dispatch=dispatch)
        db = cfg.dynamic_batching
        params = BatchingParams(
            max_batch_size=max(1, cfg.max_batch_size),
            preferred=frozenset(int(p) for p in db.preferred_batch_size),
            max_queue_delay_ns=int(db.max_queue_delay_microseconds) * 1000,
        )
        return Scheduler(
            self.name,
            params,
            default_policy=_queue_policy(db.default_queue_policy),
            level_policies={int(k): _queue_policy(v) for k, v in db.priority_queue_policy.items()},
            priority_levels=int(db.priority_levels),
            default_priority_level=int(db.default_priority_level),
            instance_count=active,
            preserve_ordering=bool(db.preserve_ordering),
            on_reject=self._on_reject,
            delay_count=self._options.delay_count,
            dispatch=dispatch,
            # Triton's enforce_equal_shape_tensors_: shape tensors and variable, non-ragged
            # dims make requests share shapes within a batch (and every arrival wake it).
            equal_shapes=any(
                i.is_shape_tensor or (-1 in i.dims and not i.allow_ragged_batch) for i in cfg.input
            ),
        )

    def _instance_specs(self) -> list[InstanceSpec]:
        specs = []
        for group in self.config.instance_group:
            kind = mc.ModelInstanceGroup.Kind.Name(group.kind)
            devices = list(group.gpus) if group.kind == mc.ModelInstanceGroup.KIND_GPU else [0]
            needs = tuple(
                ResourceNeed(r.name, int(r.count), bool(getattr(r, "global")))
                for r in group.rate_limiter.resources
            )
            for device_id in devices:
                limits = InstanceLimits(needs, int(group.rate_limiter.priority), int(device_id))
                for k in range(group.count):
                    specs.append(
                        InstanceSpec(
                            f"{group.name}_{k}", kind, int(device_id), group.passive, limits
                        )
                    )
        return specs

    def load(self) -> None:
        """Create and initialize every instance, then start serving.

        Raises:
            ServerError: a backend refused to initialize (everything created is released).
        """
        start = time.monotonic()
        self._load_labels()
        params = {k: v.string_value for k, v in self.config.parameters.items()}
        params.setdefault("device", self._options.default_device)
        specs = self._instance_specs()
        slots = iter(range(len(specs)))
        limiter = None if self.config.HasField("sequence_batching") else self._options.rate_limiter
        try:
            if limiter is not None:
                # Before any backend starts, as Triton registers each instance on creation:
                # resources that cannot be scheduled fail the load.
                limiter.register(self.scheduler, [s.limits for s in specs if not s.passive])
            for index, spec in enumerate(specs):
                backend = create_backend(self.config)
                device_name = f"gpu{spec.device_id}" if spec.kind == "KIND_GPU" else "cpu"
                args = BackendArgs(
                    model_name=self.name,
                    model_version=self.version,
                    config=self.config,
                    version_dir=self.version_dir,
                    instance_name=spec.name,
                    instance_kind=spec.kind,
                    device_id=spec.device_id,
                    device=self._options.devices.get(params.get("sim_device", device_name)),
                    instance_index=index,
                    parameters=params,
                )
                try:
                    backend.initialize(args)
                except ServerError:
                    raise
                except Exception as exc:
                    raise BackendError(str(exc) or type(exc).__name__) from exc
                slot = 0 if spec.passive else next(slots)
                self.instances.append(
                    ModelInstance(spec, backend, self.scheduler, self._run_batch, slot)
                )
        except BaseException:
            self._finalize_backends()
            if limiter is not None:
                limiter.unregister(self.scheduler)
            raise
        self.scheduler.start()
        for instance in self.instances:
            instance.start()
        self.stats.metrics.load_duration_s = time.monotonic() - start

    def _load_labels(self) -> None:
        model_dir = self.version_dir.parent
        for out in self.config.output:
            if out.label_filename:
                # An override may name any path: only files of the model directory are read.
                path = inside(model_dir, out.label_filename, "label file", resolve_links=False)
                if path.is_file():
                    self._labels[out.name] = path.read_text(encoding="utf-8").splitlines()

    def stop(self, wait: bool = False) -> None:
        """Stop accepting requests; queued and running ones finish, then backends finalize.

        Args:
            wait: Block until drained; otherwise drain on a background thread.
        """
        self.scheduler.stop()
        self.pause_gate.release()
        if wait:
            self._drain()
        else:
            threading.Thread(target=self._drain, name=f"drain-{self.name}", daemon=True).start()

    def join(self, deadline: float) -> None:
        """Wait (until the ``time.monotonic`` ``deadline``) for the batcher and instances to end."""
        self.scheduler.join(max(0.0, deadline - time.monotonic()))
        for inst in self.instances:
            inst.join(max(0.0, deadline - time.monotonic()))

    def _drain(self) -> None:
        self.scheduler.join()
        for instance in self.instances:
            instance.join()
        if self._options.rate_limiter is not None and not isinstance(
            self.scheduler, SequenceScheduler
        ):
            self._options.rate_limiter.unregister(self.scheduler)
        self._finalize_backends()

    def _finalize_backends(self) -> None:
        for instance in self.instances:
            try:
                instance.backend.finalize()
            except Exception:
                pass  # a failing finalize must not block unloading

    # ------------------------------------------------------------------ metadata

    def metadata(self) -> dict[str, Any]:
        """KServe v2 model metadata for this version (§5.3)."""
        return metadata_of(self.config, self.version)

    def device_info(self) -> list[dict[str, str]]:
        """What each instance actually runs on (backend's own report)."""
        return [
            {"instance": inst.spec.name, "kind": inst.spec.kind, **inst.backend.device_info()}
            for inst in self.instances
        ]

    # ------------------------------------------------------------------ requests

    def submit(self, req: InferRequest, callback: Callback) -> None:
        """Accept a request; the callback gets the response or error (on another thread).

        Raises:
            ServerError: validation or enqueue failure (not counted in statistics).
        """
        if self.decoupled:
            if not req.stream_responses:
                raise DecoupledRefusal(self.name)
            req.response_sender = self._sender(req, callback)
        batch_size, key = self._check.check(req)
        req.batch_size = batch_size
        req.model_version = self.version
        if not req.request_start_ns:
            req.request_start_ns = time.monotonic_ns()
        ctx = _Context(callback)
        entry = Entry(req, batch_size, shape_key=key, context=ctx)
        req.cancel_hook = self.scheduler.wake
        self.stats.pending_add(1)
        if self.cache is not None:
            lookup_start = time.monotonic_ns()
            ctx.cache_key = cache_key(self.name, self.version, req.inputs)
            cached = self.cache.lookup(ctx.cache_key)
            ctx.lookup_ns = time.monotonic_ns() - lookup_start
            if cached is not None:
                self._answer_from_cache(entry, cached.outputs, cached.output_datatypes)
                return
        try:
            self.scheduler.enqueue(entry)
        except ServerError:
            self.stats.pending_add(-1)
            raise

    def _sender(
        self, req: InferRequest, callback: Callback
    ) -> Callable[[InferResponse | ServerError, bool], None]:
        """The response sender of a decoupled model's request: each response goes to the
        callback as it comes; the final one (or an error, which ends the stream) is counted in
        the statistics once."""
        done = threading.Event()

        def send(result: InferResponse | ServerError, final: bool) -> None:
            if done.is_set():
                return  # a response after the final one is dropped, as Triton drops it
            if isinstance(result, ServerError):
                final = True
            if final:
                done.set()
                req.compute_end_ns = time.monotonic_ns()
                if isinstance(result, ServerError):
                    self.stats.record_failure("BACKEND", req.request_start_ns, req.compute_end_ns)
                else:
                    self.stats.record_success(
                        RequestTiming(
                            req.request_start_ns,
                            req.queue_start_ns,
                            req.compute_start_ns,
                            req.compute_input_end_ns or req.compute_start_ns,
                            req.compute_output_start_ns or req.compute_end_ns,
                            req.compute_end_ns,
                            time.monotonic_ns(),
                        ),
                        1,
                        0,
                    )
            if not isinstance(result, ServerError):
                result.model_name = self.name
                result.model_version = self.version
                result.id = req.id
                result.final = final
            _deliver(callback, result)

        return send

    def _answer_from_cache(
        self, entry: Entry, outputs: dict[str, np.ndarray], datatypes: dict[str, str]
    ) -> None:
        req = entry.request
        ctx = entry.context
        assert isinstance(ctx, _Context)
        resp = InferResponse(
            model_name=self.name,
            model_version=self.version,
            id=req.id,
            outputs={k: v.copy() for k, v in outputs.items()},
            output_datatypes=dict(datatypes),
        )
        self.stats.pending_add(-1)
        end = time.monotonic_ns()
        self.stats.record_cache_hit(end - req.request_start_ns, 0, ctx.lookup_ns)
        if self.scheduler.preserve_ordering:
            slot = self.scheduler.reserve_slot()
            self._sequencer.complete(slot, lambda: _deliver(ctx.callback, resp))
        else:
            _deliver(ctx.callback, resp)

    def _on_reject(self, entry: Entry, reason: str, error: ServerError) -> None:
        ctx = entry.context
        assert isinstance(ctx, _Context)
        self.stats.pending_add(-1)
        self.stats.record_failure(reason, entry.request.request_start_ns, time.monotonic_ns())
        _deliver(ctx.callback, error)

    # ------------------------------------------------------------------ execution

    def _run_batch(self, instance: ModelInstance, batch: Batch) -> None:
        entries = batch.entries
        requests = [e.request for e in entries]
        # Null requests of the direct sequence strategy (no context) belong to no client.
        self.stats.pending_add(-sum(1 for e in entries if e.context is not None))
        self.pause_gate.wait()
        start = time.monotonic_ns()
        for req in requests:
            req.compute_start_ns = start
            req.compute_input_end_ns = 0
            req.compute_output_start_ns = 0
        results: list[InferResponse | ServerError | None]
        try:
            results = list(instance.backend.execute(requests))
            if len(results) != len(requests):
                raise BackendError(
                    f"backend returned {len(results)} responses for {len(requests)} requests"
                )
        except ServerError as exc:
            results = [BackendError(exc.message, exc.code)] * len(requests)
        except Exception as exc:
            message = f"{type(exc).__name__}: {exc}"
            results = [BackendError(message)] * len(requests)
        end = time.monotonic_ns()
        input_end = requests[0].compute_input_end_ns or start
        output_start = requests[0].compute_output_start_ns or end
        if any(not isinstance(r, ServerError) for r in results):
            self.stats.record_execution(
                sum(e.batch_size for e in entries),
                input_end - start,
                output_start - input_end,
                end - output_start,
            )
        for entry, result in zip(entries, results, strict=True):
            if entry.context is None:
                continue
            if result is None or (self.decoupled and isinstance(result, ServerError)):
                # A decoupled model answers through the request's response sender; an error
                # from execute ends that stream.
                req = entry.request
                req.compute_input_end_ns = input_end
                req.compute_output_start_ns = output_start
                if result is not None and req.response_sender is not None:
                    req.response_sender(result, True)
                continue
            req = entry.request
            req.compute_input_end_ns = input_end
            req.compute_output_start_ns = output_start
            req.compute_end_ns = end
            self._finish(entry, result)

    def _finish(self, entry: Entry, result: InferResponse | ServerError) -> None:
        req = entry.request
        ctx = entry.context
        assert isinstance(ctx, _Context)
        out: InferResponse | ServerError
        if isinstance(result, ServerError):
            out = result
            self.stats.record_failure("BACKEND", req.request_start_ns, time.monotonic_ns())
        else:
            result.model_name = self.name
            result.model_version = self.version
            result.id = req.id
            miss_ns = 0
            if self.cache is not None and ctx.cache_key is not None:
                insert_start = time.monotonic_ns()
                if self.cache.insert(ctx.cache_key, result):
                    miss_ns = ctx.lookup_ns + time.monotonic_ns() - insert_start
            try:
                out = self._select_outputs(req, result)
            except ServerError as exc:
                out = exc
            timing = RequestTiming(
                req.request_start_ns,
                req.queue_start_ns,
                req.compute_start_ns,
                req.compute_input_end_ns,
                req.compute_output_start_ns,
                req.compute_end_ns,
                time.monotonic_ns(),
            )
            self.stats.record_success(timing, entry.batch_size, miss_ns)
        if entry.slot >= 0:
            final = out
            self._sequencer.complete(entry.slot, lambda: _deliver(ctx.callback, final))
        else:
            _deliver(ctx.callback, out)

    def _select_outputs(self, req: InferRequest, resp: InferResponse) -> InferResponse:
        if not req.requested_outputs:
            return resp
        wanted = {o.name: o for o in req.requested_outputs}
        outputs: dict[str, np.ndarray] = {}
        datatypes: dict[str, str] = {}
        for name, array in resp.outputs.items():
            spec = wanted.get(name)
            if spec is None:
                continue
            if spec.class_count > 0:
                outputs[name] = self._classify(
                    name, array, spec.class_count, self.config.max_batch_size > 0
                )
                datatypes[name] = "BYTES"
            else:
                outputs[name] = array
                datatypes[name] = resp.output_datatypes.get(name, datatype_of(array))
        return InferResponse(
            resp.model_name, resp.model_version, resp.id, outputs, datatypes, resp.parameters
        )

    def _classify(self, name: str, array: np.ndarray, k: int, batching: bool) -> np.ndarray:
        # Classification extension: top-k "<value>:<index>[:<label>]" per batch item.
        labels = self._labels.get(name, [])
        items = array.reshape(array.shape[0], -1) if batching else array.reshape(1, -1)
        k = min(k, items.shape[1])
        rows = []
        for row in items:
            order = np.argsort(-row.astype(np.float64), kind="stable")[:k]
            entries = []
            for idx in order:
                text = f"{float(row[idx]):f}:{int(idx)}"
                if idx < len(labels):
                    text += f":{labels[idx]}"
                entries.append(text.encode())
            rows.append(entries)
        result = np.array(rows, dtype=np.object_)
        return result if batching else result.reshape(k)

    def pause(self, seconds: float) -> None:
        """Hold executions starting in the next ``seconds`` back (coordinated-omission tests)."""
        self.pause_gate.pause(seconds)


def _deliver(callback: Callback, result: InferResponse | ServerError) -> None:
    # A failing frontend callback must not kill the instance or batcher thread that runs it.
    try:
        callback(result)
    except Exception:
        logger.exception("response callback failed")
