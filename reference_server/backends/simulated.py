"""The simulated backend: executes a latency profile instead of a model.

Each execution sleeps the profile's host time before and after the device part, and the device
time as booked on the timeline of the instance's
:class:`~reference_server.batching.instances.Device` (``DeviceMeter.book``: it starts when the
work booked before it ends), so instances sharing a simulated GPU serialise their device work
and more instances give diminishing returns. Sleeping (never spinning) keeps simulations free of
CPU cost. Outputs are real tensors of the configured shapes (zeros).

The device's :class:`~reference_server.core.gpu.DeviceMeter` records the booked device time
(its busy share is ``nv_gpu_utilization``) and the memory each instance holds: the
profile's weights from initialize on, growing with the largest batch executed (``[gpu]`` table).

Config parameters: ``profile`` (bundled name or path relative to the model directory, default
``resnet50_sim``), ``sim_device`` (device name shared across models, default per instance kind).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np

from reference_server.backends.base import BackendArgs, mark_compute, response_for
from reference_server.core.config import numpy_dtype, protocol_datatype
from reference_server.core.errors import ServerError
from reference_server.core.types import InferRequest, InferResponse
from reference_server.zoo.profiles import LatencyProfile, resolve_profile


class SimulatedBackend:
    """Sleeps according to a :class:`~reference_server.zoo.profiles.LatencyProfile`."""

    def __init__(self) -> None:
        self._args: BackendArgs | None = None
        self.profile: LatencyProfile | None = None
        self._rng = np.random.default_rng(0)
        self._peak_batch = 0

    def initialize(self, args: BackendArgs) -> None:
        self._args = args
        ref = args.parameters.get("profile", "resnet50_sim") or "resnet50_sim"
        self.profile = resolve_profile(ref, args.version_dir.parent)
        self._rng = np.random.default_rng(self.profile.seed + args.instance_index)
        self._peak_batch = 0
        args.device.meter.attach(self.profile.gpu)
        if self.profile.gpu is not None:
            args.device.meter.hold(self, self.profile.gpu.instance_bytes(0))

    def _jittered_s(self, ms: float) -> float:
        assert self.profile is not None
        if self.profile.jitter > 0:
            ms *= max(0.0, 1.0 + self.profile.jitter * float(self._rng.standard_normal()))
        return ms / 1000.0

    def execute(self, requests: Sequence[InferRequest]) -> list[InferResponse | ServerError]:
        assert self._args is not None and self.profile is not None
        batch = sum(max(1, r.batch_size) for r in requests)
        profile = self.profile
        _sleep(self._jittered_s(profile.host_pre.ms(batch)))
        meter = self._args.device.meter
        if profile.gpu is not None and batch > self._peak_batch:
            self._peak_batch = batch
            meter.hold(self, profile.gpu.instance_bytes(batch))
        input_end, output_start = meter.book(int(self._jittered_s(profile.device.ms(batch)) * 1e9))
        _sleep((output_start - time.monotonic_ns()) / 1e9)
        _sleep(self._jittered_s(profile.host_post.ms(batch)))
        mark_compute(requests, input_end, output_start)
        cfg = self._args.config
        responses: list[InferResponse | ServerError] = []
        for req in requests:
            resp = response_for(req, self._args)
            lead = [max(1, req.batch_size)] if cfg.max_batch_size > 0 else []
            for out in cfg.output:
                shape = lead + [d if d > 0 else 1 for d in out.dims]
                datatype = protocol_datatype(out.data_type)
                dtype = numpy_dtype(datatype)
                array = (
                    np.full(shape, b"", dtype=np.object_)
                    if datatype == "BYTES"
                    else np.zeros(shape, dtype=dtype)
                )
                resp.outputs[out.name] = array
                resp.output_datatypes[out.name] = datatype
            responses.append(resp)
        return responses

    def finalize(self) -> None:
        if self._args is not None:
            self._args.device.meter.release(self)
        self._args = None

    def device_info(self) -> dict[str, str]:
        assert self.profile is not None
        device = self._args.device.name if self._args is not None else ""
        return {
            "backend": "simulated",
            "device": device,
            "profile": self.profile.name,
            "provenance": self.profile.provenance,
        }


def _sleep(seconds: float) -> None:
    if seconds > 0:
        time.sleep(seconds)
