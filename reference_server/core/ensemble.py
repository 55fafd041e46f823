"""Ensembles as Triton runs them: ``platform: "ensemble"`` with ``ensemble_scheduling`` steps.

An ensemble has no batcher and no instances of its own. Each request it accepts becomes a set of
step requests, one per step, each sent into its composing model's own scheduler (dynamic batcher,
instances, priorities, statistics) as soon as the tensors its ``input_map`` names exist; a step's
``output_map`` names the tensors its outputs become. The ensemble answers once every output it
declares exists, and records in its own statistics the whole request's duration, a queue time
of about zero and, as compute time, the sum of its steps' compute times (Triton's ensemble
scheduler does the same: its context aggregates the composing requests' compute durations).

Its config's checks are :mod:`reference_server.core.ensemble_config`'s.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from tritonclient.grpc import model_config_pb2 as mc

from reference_server.core.errors import Code, ServerError
from reference_server.core.signature import RequestCheck, datatype_of, metadata_of
from reference_server.core.stats import ModelMetrics, ModelStats, RequestTiming
from reference_server.core.types import InferRequest, InferResponse, RequestedOutput

Callback = Callable[[InferResponse | ServerError], None]
#: ``InferenceServer.submit``: start a request into the model it names.
Submit = Callable[[InferRequest, Callback], None]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Step:
    model: str
    version: str
    inputs: dict[str, str]  # composing model input -> ensemble tensor
    outputs: dict[str, str]  # composing model output -> ensemble tensor


class _Run:
    """One ensemble request on its way through the steps."""

    def __init__(self, req: InferRequest, callback: Callback, steps: Sequence[_Step]) -> None:
        self.req = req
        self.callback = callback
        self.lock = threading.Lock()
        self.tensors: dict[str, tuple[np.ndarray, str]] = {
            name: (array, req.input_datatypes.get(name) or datatype_of(array))
            for name, array in req.inputs.items()
        }
        self.waiting = list(steps)
        self.in_flight: list[InferRequest] = []
        self.error: ServerError | None = None
        self.answered = False
        self.compute = [0, 0, 0]  # input, infer, output: the steps' sums

    def ready_steps(self) -> list[_Step]:
        """Take the steps whose input tensors all exist (under ``lock``)."""
        ready: list[_Step] = []
        waiting: list[_Step] = []
        for step in self.waiting:
            has_inputs = all(t in self.tensors for t in step.inputs.values())
            (ready if has_inputs else waiting).append(step)
        self.waiting = waiting
        return ready


class EnsembleRuntime:
    """A loaded ensemble version: the facade's view of a model, without a batcher of its own.

    Args:
        config: Normalized, validated ensemble config.
        version: Version string.
        version_dir: ``<model dir>/<version>`` (an ensemble has no files to read).
        metrics: The version's metric counters, shared with the version it replaces.
        submit: How a step request reaches its composing model (the server's ``submit``).
    """

    def __init__(
        self,
        config: mc.ModelConfig,
        version: str,
        version_dir: Path,
        metrics: ModelMetrics | None,
        submit: Submit,
    ) -> None:
        self.config = config
        self.name = config.name
        self.version = version
        self.version_dir = version_dir
        self.stats = ModelStats(self.name, version, metrics)
        self.cache = None
        self._submit = submit
        self._check = RequestCheck(config)
        self._steps = [
            _Step(
                s.model_name,
                str(s.model_version) if s.model_version > 0 else "",
                dict(s.input_map),
                dict(s.output_map),
            )
            for s in config.ensemble_scheduling.step
        ]
        self._stopping = False

    def load(self) -> None:
        """Start serving (the steps were checked against their models before any version
        loaded: :func:`~reference_server.core.ensemble_config.check_steps`)."""
        self.stats.metrics.load_duration_s = 0.0

    def stop(self, wait: bool = False) -> None:
        """Accept no more requests; those under way finish in their composing models."""
        del wait  # nothing of its own to drain
        self._stopping = True

    def join(self, deadline: float) -> None:
        del deadline  # no threads of its own

    def metadata(self) -> dict[str, Any]:
        return metadata_of(self.config, self.version)

    def device_info(self) -> list[dict[str, str]]:
        return []  # its steps run on their own models' instances

    def pause(self, seconds: float) -> None:
        del seconds  # pause the composing models instead

    # ------------------------------------------------------------------ requests

    def submit(self, req: InferRequest, callback: Callback) -> None:
        """Accept a request and start its first steps; ``callback`` gets the answer.

        Raises:
            ServerError: the request does not fit the ensemble's config.
        """
        if self._stopping:
            raise ServerError(
                f"[request id: {req.id or '<id_unknown>'}] Server is stopping, scheduler for "
                "model has stopped accepting new inference requests",
                Code.UNAVAILABLE,
            )
        batch_size, _ = self._check.check(req)
        req.batch_size = batch_size
        req.model_version = self.version
        now = time.monotonic_ns()
        req.request_start_ns = req.request_start_ns or now
        req.queue_start_ns = now
        run = _Run(req, callback, self._steps)
        req.compute_start_ns = time.monotonic_ns()  # its steps start: the ensemble's queue ends
        req.cancel_hook = lambda: self._cancel(run)
        self.stats.pending_add(1)
        with run.lock:
            ready = run.ready_steps()
        self._launch(run, ready)

    def _cancel(self, run: _Run) -> None:
        with run.lock:
            steps = list(run.in_flight)
        for step in steps:
            step.cancel()

    def _launch(self, run: _Run, steps: list[_Step]) -> None:
        req = run.req
        for step in steps:
            with run.lock:
                if run.error is not None:
                    return
                inputs = {m: run.tensors[t][0] for m, t in step.inputs.items()}
                datatypes = {m: run.tensors[t][1] for m, t in step.inputs.items()}
                child = InferRequest(
                    model_name=step.model,
                    model_version=step.version,
                    id=req.id,
                    inputs=inputs,
                    input_datatypes=datatypes,
                    requested_outputs=[RequestedOutput(name) for name in step.outputs],
                    parameters=dict(req.parameters),
                    priority=req.priority,
                    timeout_us=req.timeout_us,
                    cancelled=req.cancelled,
                )
                run.in_flight.append(child)
            self._submit(child, functools.partial(self._step_done, run, step, child))

    def _step_done(
        self, run: _Run, step: _Step, child: InferRequest, result: InferResponse | ServerError
    ) -> None:
        ready: list[_Step] = []
        with run.lock:
            run.in_flight.remove(child)
            if isinstance(result, ServerError):
                if run.error is None:
                    run.error = ServerError(
                        f"in ensemble '{self.name}', {result.message}", result.code
                    )
            else:
                for out_name, tensor in step.outputs.items():
                    array = result.outputs[out_name]
                    datatype = result.output_datatypes.get(out_name) or datatype_of(array)
                    run.tensors[tensor] = (array, datatype)
                run.compute[0] += child.compute_input_end_ns - child.compute_start_ns
                run.compute[1] += child.compute_output_start_ns - child.compute_input_end_ns
                run.compute[2] += child.compute_end_ns - child.compute_output_start_ns
                if run.error is None:
                    ready = run.ready_steps()
        if ready:
            self._launch(run, ready)
        self._maybe_answer(run)

    def _maybe_answer(self, run: _Run) -> None:
        req = run.req
        with run.lock:
            if run.answered:
                return
            finished = not run.in_flight and (run.error is not None or not run.waiting)
            outputs_ready = all(o.name in run.tensors for o in self.config.output)
            if run.error is not None:
                if run.in_flight:
                    return  # Triton answers an error once no step is in flight
                result: InferResponse | ServerError = run.error
            elif outputs_ready:
                result = self._response(run)
            elif finished:
                result = ServerError(
                    f"in ensemble '{self.name}', unexpected deadlock, at least one output is not "
                    "set while no more ensemble steps can be made",
                    Code.INVALID_ARG,
                )
            else:
                return
            run.answered = True
        end = time.monotonic_ns()
        self.stats.pending_add(-1)
        if isinstance(result, ServerError):
            self.stats.record_failure("OTHER", req.request_start_ns, end)
        else:
            cin, cinf, cout = run.compute
            start = req.compute_start_ns
            timing = RequestTiming(
                req.request_start_ns,
                req.queue_start_ns,
                start,
                start + cin,
                start + cin + cinf,
                start + cin + cinf + cout,
                end,
            )
            self.stats.record_success(timing, req.batch_size)
            self.stats.record_execution(req.batch_size, cin, cinf, cout)
        try:
            run.callback(result)
        except Exception:  # a failing frontend callback must not kill a composing model's thread
            logger.exception("response callback failed")

    def _response(self, run: _Run) -> InferResponse:
        req = run.req
        wanted = [o.name for o in req.requested_outputs] or [o.name for o in self.config.output]
        return InferResponse(
            self.name,
            self.version,
            req.id,
            {name: run.tensors[name][0] for name in wanted},
            {name: run.tensors[name][1] for name in wanted},
        )
