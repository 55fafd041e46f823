"""Pure logic of the GPU sources: the busy share of a simulated device, NVML's units."""

from __future__ import annotations

import importlib.util
from types import SimpleNamespace
from typing import Any

import pytest

from reference_server.core.gpu import DeviceMeter, GpuCollector, NvmlSource, SimulatedGpuSpec

MS = 1_000_000


class Clock:
    def __init__(self) -> None:
        self.now = 0

    def __call__(self) -> int:
        return self.now


def test_busy_share_covers_the_trailing_interval_only() -> None:
    clock = Clock()
    meter = DeviceMeter(clock_ns=clock, interval_ns=1000 * MS)
    meter.attach(None)
    for start in range(0, 3000, 100):  # 25 ms busy every 100 ms for 3 s
        clock.now = start * MS
        assert meter.book(25 * MS) == (start * MS, (start + 25) * MS)
    clock.now = 3000 * MS
    assert meter.utilization() == pytest.approx(0.25)
    assert meter.busy_ns() == 30 * 25 * MS
    # Work booked but still running counts up to now.
    meter.book(1000 * MS)
    clock.now = 3500 * MS
    assert meter.utilization() == pytest.approx((500 + 5 * 25) / 1000)
    assert meter.busy_ns() == 30 * 25 * MS + 500 * MS
    clock.now = 4200 * MS  # it ended at 4000 ms
    assert meter.utilization() == pytest.approx(0.8)
    clock.now = 5000 * MS
    assert meter.utilization() == 0.0


def test_work_booked_on_a_busy_device_starts_when_the_work_before_it_ends() -> None:
    """The device is a timeline: the next piece starts when the last one ends, not when the
    thread that booked the last one wakes."""
    clock = Clock()
    meter = DeviceMeter(clock_ns=clock, interval_ns=1000 * MS)
    meter.attach(None)
    assert meter.book(10 * MS) == (0, 10 * MS)
    clock.now = 4 * MS
    assert meter.book(6 * MS) == (10 * MS, 16 * MS)
    clock.now = 30 * MS  # the device went idle at 16 ms
    assert meter.book(5 * MS) == (30 * MS, 35 * MS)
    assert meter.busy_ns() == 16 * MS  # booked, not run yet
    clock.now = 40 * MS
    assert meter.busy_ns() == 21 * MS


def test_busy_share_of_a_new_device_uses_its_age() -> None:
    clock = Clock()
    meter = DeviceMeter(clock_ns=clock, interval_ns=2000 * MS)
    meter.attach(None)
    meter.book(100 * MS)
    clock.now = 200 * MS
    assert meter.utilization() == pytest.approx(0.5)


def test_memory_context_only_while_an_instance_holds_some() -> None:
    meter = DeviceMeter()
    spec = SimulatedGpuSpec(context_mb=100, weights_mb=10, activation_mb_per_item=1)
    meter.attach(spec)
    assert meter.memory_used_bytes() == 0
    meter.hold("a", spec.instance_bytes(0))
    meter.hold("b", spec.instance_bytes(4))
    meter.hold("b", spec.instance_bytes(2))  # never shrinks while held
    assert meter.memory_used_bytes() == (100 + 10 + 14) * 1024 * 1024
    meter.release("a")
    meter.release("b")
    assert meter.memory_used_bytes() == 0


class FakeNvml:
    """The handful of pynvml calls NvmlSource makes, with NVML's units (mW, mJ, percent)."""

    def __init__(self) -> None:
        self.energy_mj = 5_000_000

    def nvmlInit(self) -> None: ...
    def nvmlDeviceGetCount(self) -> int:
        return 2

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetUUID(self, h: int) -> str:
        return f"GPU-0000000{h}-0000-0000-0000-000000000000"

    def nvmlDeviceGetName(self, h: int) -> bytes:
        return b"NVIDIA H100"

    def nvmlDeviceGetUtilizationRates(self, h: int) -> Any:
        return SimpleNamespace(gpu=87, memory=40)

    def nvmlDeviceGetMemoryInfo(self, h: int) -> Any:
        return SimpleNamespace(total=80 * 2**30, used=3 * 2**30, free=77 * 2**30)

    def nvmlDeviceGetPowerUsage(self, h: int) -> int:
        if h == 1:
            raise RuntimeError("NVMLError_NotSupported")
        return 250_500

    def nvmlDeviceGetEnforcedPowerLimit(self, h: int) -> int:
        return 700_000

    def nvmlDeviceGetTotalEnergyConsumption(self, h: int) -> int:
        return self.energy_mj


def test_nvml_units_become_tritons() -> None:
    nvml = FakeNvml()
    source = NvmlSource(nvml)
    assert source.available()
    nvml.energy_mj += 1_500_000  # 1.5 kJ since the source started
    first, second = source.readings()
    assert first.uuid == "GPU-00000000-0000-0000-0000-000000000000"
    assert first.name == "NVIDIA H100"
    assert first.utilization == pytest.approx(0.87)
    assert first.memory_total_bytes == 80 * 2**30 and first.memory_used_bytes == 3 * 2**30
    assert first.power_usage_w == pytest.approx(250.5)
    assert first.power_limit_w == pytest.approx(700.0)
    assert first.energy_j == pytest.approx(1500.0)
    # A field NVML refuses is absent, not zero: no sample is printed for it.
    assert second.power_usage_w is None and second.utilization == pytest.approx(0.87)
    text_families = {m.name: m for m in GpuCollector([source]).collect()}
    assert len(text_families["nv_gpu_power_usage"].samples) == 1
    assert len(text_families["nv_gpu_utilization"].samples) == 2


@pytest.mark.skipif(
    importlib.util.find_spec("pynvml") is not None, reason="pynvml is installed here"
)
def test_without_pynvml_there_is_no_real_gpu() -> None:
    source = NvmlSource()
    assert not source.available()
    assert source.readings() == []
    assert source.error is not None and "pynvml" in source.error
    assert list(GpuCollector([source]).collect()) == []
