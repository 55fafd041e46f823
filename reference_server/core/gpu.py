"""GPU metrics: Triton's ``nv_gpu_*`` families, from NVML, from the simulated devices, or none.

Triton publishes, per GPU and labelled ``gpu_uuid`` (``research/triton_spec.md`` §8):
``nv_gpu_utilization`` (0.0-1.0), ``nv_gpu_memory_total_bytes``, ``nv_gpu_memory_used_bytes``,
``nv_gpu_power_usage`` (W), ``nv_gpu_power_limit`` (W) and the counter
``nv_energy_consumption`` (J since the server started). A CPU-only Triton prints none of them.

Sources, in the order :func:`default_sources` uses them:

* :class:`NvmlSource`: the real GPUs through NVML (``nvidia-ml-py``'s ``pynvml``, imported on
  first use; absent or failing NVML means no real GPU series, as on a CPU-only Triton).
* :class:`SimulatedSource`: every simulated device a ``simulated`` model instance runs on. Its
  utilisation is the device-busy share over the trailing second (the backend books the
  device's time on the meter's timeline), and its memory and power come from the latency
  profile's ``[gpu]`` table: synthetic figures, which the profile's provenance says.

NVML's utilisation is "the percent of time over the past sample period during which one or more
kernels was executing", a period of 1/6 s to 1 s by product, and Triton reads it on a timer
(``--metrics-interval-ms``, 2000 ms). The simulated source computes it at scrape time over the
trailing second, so a value is never older than the scrape and never reaches back more than a
second (a measurement window of perfsweep lasts at least that long).
:class:`GpuCollector` turns readings into metric families, plus one reference-server addition,
``perfsweep_gpu_info{gpu_uuid, name}`` (Triton's page names no GPU), so a client can record the
server's GPUs by name.
"""

from __future__ import annotations

import collections
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Protocol

from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

#: The span the simulated utilisation covers: NVML's longest sample period.
METRICS_INTERVAL_NS = 1_000_000_000

#: (name, type, help text exactly as Triton 2.51's ``core/src/metrics.cc`` registers it).
GPU_FAMILIES: tuple[tuple[str, str, str], ...] = (
    ("nv_gpu_utilization", "gauge", "GPU utilization rate [0.0 - 1.0)"),
    ("nv_gpu_memory_total_bytes", "gauge", "GPU total memory, in bytes"),
    ("nv_gpu_memory_used_bytes", "gauge", "GPU used memory, in bytes"),
    ("nv_gpu_power_usage", "gauge", "GPU power usage in watts"),
    ("nv_gpu_power_limit", "gauge", "GPU power management limit in watts"),
    (
        "nv_energy_consumption",
        "counter",
        "GPU energy consumption in joules since the Triton Server started",
    ),
)
#: The reference server's addition: which GPU a uuid is (Triton's page has only the uuid).
GPU_INFO_METRIC = "perfsweep_gpu_info"

_SIM_NAMESPACE = uuid.UUID("0b5a1f3e-6d2c-4c53-9a0e-7f1d2b9c4e11")


@dataclass(frozen=True)
class GpuReading:
    """One GPU at one instant; a field the source cannot read is None (no sample is printed)."""

    uuid: str
    name: str
    utilization: float | None = None
    memory_total_bytes: int | None = None
    memory_used_bytes: int | None = None
    power_usage_w: float | None = None
    power_limit_w: float | None = None
    energy_j: float | None = None


class GpuSource(Protocol):
    """Something that can read GPUs (NVML, the simulated devices)."""

    def readings(self) -> list[GpuReading]:
        """The GPUs this source sees now (empty: none)."""
        ...


# --------------------------------------------------------------------------------------------------
# Simulated devices


@dataclass(frozen=True)
class SimulatedGpuSpec:
    """The ``[gpu]`` table of a latency profile: what a simulated GPU reports beyond busy time.

    All figures are the profile's (synthetic unless its provenance says otherwise).

    Attributes:
        name: The GPU's name as ``perfsweep_gpu_info`` reports it.
        memory_total_mb: Device memory, MiB.
        context_mb: Taken once while any instance is on the device (CUDA context, libraries).
        weights_mb: Taken by every instance (each instance holds its own copy of the weights).
        activation_mb_per_item: Per instance, times the largest batch it has executed (an
            arena that grows to its peak and keeps it, as ONNX Runtime's does).
        power_idle_w: Board power with the device idle.
        power_busy_w: Board power while the device is busy 100 % of the time.
        power_limit_w: The power limit reported.
    """

    name: str = "simulated GPU"
    memory_total_mb: float = 16384.0
    context_mb: float = 0.0
    weights_mb: float = 0.0
    activation_mb_per_item: float = 0.0
    power_idle_w: float = 0.0
    power_busy_w: float = 0.0
    power_limit_w: float = 0.0

    def instance_bytes(self, peak_batch: int) -> int:
        """Memory one instance holds after executing batches of at most ``peak_batch``."""
        return _mib(self.weights_mb + self.activation_mb_per_item * max(0, peak_batch))

    @classmethod
    def from_toml(cls, data: dict[str, Any]) -> SimulatedGpuSpec:
        """Build from a profile's ``[gpu]`` table (unknown keys are an error)."""
        fields = set(cls.__dataclass_fields__)
        unknown = sorted(set(data) - fields)
        if unknown:
            raise ValueError(f"unknown [gpu] keys {unknown}; known: {sorted(fields)}")
        kwargs: dict[str, Any] = {k: (str(v) if k == "name" else float(v)) for k, v in data.items()}
        return cls(**kwargs)


def _mib(mb: float) -> int:
    return round(mb * 1024 * 1024)


class DeviceMeter:
    """What one device was doing: busy intervals and memory held by simulated instances.

    Thread-safe. Each :class:`~reference_server.batching.instances.Device` owns one; only the simulated
    backend writes to it, and a device becomes a simulated GPU (:attr:`spec` set) when the
    first simulated instance is placed on it.

    Args:
        clock_ns: Monotonic clock in ns (injectable for tests).
        interval_ns: The span utilisation is measured over.
    """

    def __init__(
        self,
        clock_ns: Callable[[], int] = time.monotonic_ns,
        interval_ns: int = METRICS_INTERVAL_NS,
    ) -> None:
        self._clock = clock_ns
        self.interval_ns = interval_ns
        self._lock = threading.Lock()
        self._created_ns = clock_ns()
        self.spec: SimulatedGpuSpec | None = None
        self.simulated = False
        self._busy_total_ns = 0
        self._intervals: collections.deque[tuple[int, int]] = collections.deque()
        self._free_at_ns = 0
        self._held: dict[object, int] = {}

    # ---- written by the simulated backend

    def attach(self, spec: SimulatedGpuSpec | None) -> None:
        """Mark the device simulated; the first spec given stays (one GPU, one spec)."""
        with self._lock:
            if not self.simulated:
                self.simulated = True
                self._created_ns = self._clock()
            if self.spec is None and spec is not None:
                self.spec = spec

    def book(self, duration_ns: int) -> tuple[int, int]:
        """Book the device for ``duration_ns`` from when it is next free: the (start, end) of
        the piece of work.

        The device is a timeline, not a lock: work starts when the work booked before it ends,
        whether or not the thread that booked that work has woken to collect it, as a GPU runs
        the next kernel while the CPU thread of the last one waits for the interpreter. A lock
        held across the sleep would keep the device busy for that wait too (up to the GIL's
        switch interval, 5 ms, under load), which no latency profile holds.
        """
        with self._lock:
            now = self._clock()
            start = max(now, self._free_at_ns)
            end = start + max(0, int(duration_ns))
            self._free_at_ns = end
            if end > start:
                self._busy_total_ns += end - start
                self._intervals.append((start, end))
            self._trim(now)
            return start, end

    def hold(self, key: object, nbytes: int) -> None:
        """Instance ``key`` holds at least ``nbytes`` (memory never shrinks while held)."""
        with self._lock:
            self._held[key] = max(self._held.get(key, 0), int(nbytes))

    def release(self, key: object) -> None:
        """Instance ``key`` was finalized: its memory is free again."""
        with self._lock:
            self._held.pop(key, None)

    # ---- read by the source

    def _trim(self, now: int) -> None:
        horizon = now - self.interval_ns
        while self._intervals and self._intervals[0][1] <= horizon:
            self._intervals.popleft()

    def utilization(self) -> float:
        """Busy share of the trailing interval (shorter right after the device appeared)."""
        with self._lock:
            now = self._clock()
            self._trim(now)
            since = max(now - self.interval_ns, self._created_ns)
            span = now - since
            if span <= 0:
                return 0.0
            busy = sum(max(0, min(end, now) - max(start, since)) for start, end in self._intervals)
            return min(1.0, max(0.0, busy / span))

    def busy_ns(self) -> int:
        """Total busy time since the device appeared, up to now (booked work not yet done
        counts as far as it has run)."""
        with self._lock:
            now = self._clock()
            ahead = sum(end - max(start, now) for start, end in self._intervals if end > now)
            return self._busy_total_ns - ahead

    def alive_ns(self) -> int:
        """Time since the device appeared."""
        with self._lock:
            return self._clock() - self._created_ns

    def memory_used_bytes(self) -> int:
        """Context (while any instance is on the device) plus what every instance holds."""
        with self._lock:
            held = sum(self._held.values())
            context = _mib(self.spec.context_mb) if self.spec and self._held else 0
            return held + context


class _NamedMeter(Protocol):
    name: str
    meter: DeviceMeter


def simulated_uuid(device_name: str) -> str:
    """A stable, Triton-shaped uuid for a simulated device (``GPU-xxxxxxxx-...``)."""
    return f"GPU-{uuid.uuid5(_SIM_NAMESPACE, device_name)}"


class SimulatedSource:
    """Readings of the simulated devices (those a simulated instance has run on).

    Args:
        devices: Called at every scrape; the server's devices (``DeviceRegistry.devices``).
    """

    def __init__(self, devices: Callable[[], Iterable[_NamedMeter]]) -> None:
        self._devices = devices

    def readings(self) -> list[GpuReading]:
        out = []
        for device in self._devices():
            meter = device.meter
            if not meter.simulated:
                continue
            spec = meter.spec
            util = meter.utilization()
            reading = GpuReading(
                uuid=simulated_uuid(device.name),
                name=f"{spec.name if spec else 'simulated GPU'} ({device.name})",
                utilization=util,
            )
            if spec is not None:
                idle, busy = spec.power_idle_w, spec.power_busy_w
                reading = GpuReading(
                    uuid=reading.uuid,
                    name=reading.name,
                    utilization=util,
                    memory_total_bytes=_mib(spec.memory_total_mb),
                    memory_used_bytes=meter.memory_used_bytes(),
                    power_usage_w=idle + (busy - idle) * util,
                    power_limit_w=spec.power_limit_w,
                    energy_j=(idle * meter.alive_ns() + (busy - idle) * meter.busy_ns()) / 1e9,
                )
            out.append(reading)
        return out


# --------------------------------------------------------------------------------------------------
# NVML


class NvmlSource:
    """The real GPUs through NVML; no readings when ``pynvml`` or the driver is missing.

    Not measured on hardware yet (no GPU where this was written): the calls are the documented
    ``nvidia-ml-py`` ones that Triton's DCGM fields correspond to.

    Args:
        module: The ``pynvml`` module (tests pass a stand-in); None imports it on first use.
    """

    def __init__(self, module: ModuleType | Any | None = None) -> None:
        self._nvml: Any = module
        self._lock = threading.Lock()
        self._handles: list[Any] | None = None
        self._energy_start_mj: dict[int, int] = {}
        self.error: str | None = None

    def _init(self) -> list[Any]:
        if self._handles is not None:
            return self._handles
        self._handles = []
        try:
            if self._nvml is None:
                import pynvml  # nvidia-ml-py: only where NVML is wanted

                self._nvml = pynvml
            self._nvml.nvmlInit()
            count = int(self._nvml.nvmlDeviceGetCount())
            self._handles = [self._nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        except Exception as exc:  # ImportError, NVMLError (no driver): no real GPU series
            self.error = f"{type(exc).__name__}: {exc}"
            self._handles = []
        for i, handle in enumerate(self._handles):
            energy = self._read("nvmlDeviceGetTotalEnergyConsumption", handle)
            if energy is not None:
                self._energy_start_mj[i] = int(energy)
        return self._handles

    def _read(self, call: str, handle: Any) -> Any:
        try:
            return getattr(self._nvml, call)(handle)
        except Exception:  # NVMLError_NotSupported and friends: that field is just absent
            return None

    def available(self) -> bool:
        """Whether NVML answered and sees at least one GPU."""
        with self._lock:
            return bool(self._init())

    def readings(self) -> list[GpuReading]:
        with self._lock:
            out = []
            for i, h in enumerate(self._init()):
                uid = self._read("nvmlDeviceGetUUID", h)
                if uid is None:
                    continue
                name = self._read("nvmlDeviceGetName", h)
                util = self._read("nvmlDeviceGetUtilizationRates", h)  # percent
                mem = self._read("nvmlDeviceGetMemoryInfo", h)
                power = self._read("nvmlDeviceGetPowerUsage", h)  # mW
                limit = self._read("nvmlDeviceGetEnforcedPowerLimit", h)  # mW
                energy = self._read("nvmlDeviceGetTotalEnergyConsumption", h)  # mJ
                start = self._energy_start_mj.get(i)
                out.append(
                    GpuReading(
                        uuid=_text(uid),
                        name=_text(name) if name is not None else "",
                        utilization=util.gpu / 100.0 if util is not None else None,
                        memory_total_bytes=int(mem.total) if mem is not None else None,
                        memory_used_bytes=int(mem.used) if mem is not None else None,
                        power_usage_w=power / 1000.0 if power is not None else None,
                        power_limit_w=limit / 1000.0 if limit is not None else None,
                        energy_j=(energy - start) / 1000.0
                        if energy is not None and start is not None
                        else None,
                    )
                )
            return out


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


# --------------------------------------------------------------------------------------------------
# Exposition


class GpuCollector(Collector):
    """Yields Triton's GPU families from the sources' readings; nothing when no GPU is seen.

    Args:
        sources: Read at every scrape, in order; a uuid seen twice is reported once.
    """

    def __init__(self, sources: Iterable[GpuSource]) -> None:
        self._sources = tuple(sources)

    def readings(self) -> list[GpuReading]:
        """Every GPU the sources see now."""
        seen: dict[str, GpuReading] = {}
        for source in self._sources:
            for reading in source.readings():
                seen.setdefault(reading.uuid, reading)
        return list(seen.values())

    def collect(self) -> Iterator[Metric]:
        readings = self.readings()
        if not readings:
            return
        fields = {
            "nv_gpu_utilization": "utilization",
            "nv_gpu_memory_total_bytes": "memory_total_bytes",
            "nv_gpu_memory_used_bytes": "memory_used_bytes",
            "nv_gpu_power_usage": "power_usage_w",
            "nv_gpu_power_limit": "power_limit_w",
            "nv_energy_consumption": "energy_j",
        }
        for name, typ, help_ in GPU_FAMILIES:
            family = Metric(name, help_, typ)
            for r in readings:
                value = getattr(r, fields[name])
                if value is not None:
                    family.add_sample(name, {"gpu_uuid": r.uuid}, value)
            if family.samples:
                yield family
        info = Metric(
            GPU_INFO_METRIC,
            "Name of each GPU the server reports (reference server only; value is always 1)",
            "gauge",
        )
        for r in readings:
            info.add_sample(GPU_INFO_METRIC, {"gpu_uuid": r.uuid, "name": r.name}, 1)
        yield info


def default_sources(devices: Callable[[], Iterable[_NamedMeter]]) -> list[GpuSource]:
    """NVML (used when it sees a GPU), then the simulated devices of ``devices``."""
    return [NvmlSource(), SimulatedSource(devices)]
