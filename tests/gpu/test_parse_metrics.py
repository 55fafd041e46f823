"""One parser for a real Triton's ``/metrics`` page and the reference server's.

``data/triton_2.51_cpu_metrics.txt`` was captured from the nvidia-pytriton wheel's Triton 2.51
(``identity`` model, 3 requests, CPU-only: it prints no GPU family). ``data/
triton_gpu_metrics.txt`` is a page in Triton's exact format on a two-GPU host (names, types,
help texts of ``core/src/metrics.cc``; ``gpu_uuid`` on the per-model series of KIND_GPU
instances, as ``research/triton_spec.md`` §8 says), since no GPU is at hand to capture one.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from analyzer.target.server_stats import (
    GpuSample,
    MetricsSnapshot,
    ServerSnapshot,
    combine_views,
    parse_metrics,
    server_view,
)
from reference_server.app import ServerOptions, ServerThread

DATA = Path(__file__).with_name("data")
A = "GPU-53a2b5f0-8c7e-2d1f-4b6a-9e0c3d7f1a25"
B = "GPU-0e9fdafb-5adb-91cd-26a8-308d34357efc"
MB = 1024 * 1024


def test_real_triton_cpu_page_has_model_series_and_no_gpu() -> None:
    text = (DATA / "triton_2.51_cpu_metrics.txt").read_text(encoding="utf-8")
    snap = parse_metrics(text, "identity")
    assert snap.failures_by_reason == {"OTHER": 0, "BACKEND": 0, "CANCELED": 0, "REJECTED": 0}
    assert snap.pending_requests == 0
    assert snap.gpus == {}  # nv_cpu_utilization is not a GPU


def test_triton_gpu_page_gives_every_gpu_and_sums_model_series_over_gpus() -> None:
    text = (DATA / "triton_gpu_metrics.txt").read_text(encoding="utf-8")
    snap = parse_metrics(text, "resnet50")
    assert snap.failures_by_reason == {"REJECTED": 4, "BACKEND": 0}
    assert snap.pending_requests == 4
    assert list(snap.gpus) == sorted([A, B])
    assert snap.gpus[A] == GpuSample(
        uuid=A,
        name=None,  # Triton names no GPU
        utilization=0.89,
        memory_total_bytes=16945512448,
        memory_used_bytes=974913536,
        power_w=55.137,
        power_limit_w=70.0,
        energy_j=5513.7,
    )


def _sample(uid: str, util: float, used_mb: float, energy: float | None, power: float) -> GpuSample:
    return GpuSample(
        uuid=uid,
        utilization=util,
        memory_total_bytes=1000 * MB,
        memory_used_bytes=used_mb * MB,
        power_w=power,
        power_limit_w=70.0,
        energy_j=energy,
    )


def _snap(at: float, *gpus: GpuSample) -> ServerSnapshot:
    return ServerSnapshot(None, MetricsSnapshot(gpus={g.uuid: g for g in gpus}), taken_at=at)


def test_window_and_level_figures_per_gpu() -> None:
    s0 = _snap(0.0, _sample(A, 0.10, 300, 100.0, 20), _sample(B, 0.0, 50, None, 10))
    s1 = _snap(2.0, _sample(A, 0.80, 500, 200.0, 60), _sample(B, 0.2, 40, None, 30))
    s2 = _snap(6.0, _sample(A, 0.90, 450, 440.0, 65), _sample(B, 0.4, 60, None, 50))
    w1, w2 = server_view(s0, s1), server_view(s1, s2)
    assert w1 is not None and w2 is not None
    a1 = w1.gpus[0]
    assert a1.uuid == A and a1.utilization_samples_pct == (80.0,)
    assert a1.memory_used_peak_mb == 500 and a1.memory_total_mb == 1000
    assert a1.power_mean_w == pytest.approx(50.0)  # 100 J over 2 s, from the energy counter
    b1 = w1.gpus[1]
    assert b1.power_mean_w == pytest.approx(20.0)  # no counter: mean of the gauges
    level = combine_views([w1, w2])
    assert level is not None
    a, b = level.gpus
    assert a.utilization_samples_pct == (80.0, 90.0)
    assert a.utilization_pct_mean == pytest.approx(85.0)
    assert a.utilization_pct_p95 == pytest.approx(90.0)
    assert a.memory_used_peak_mb == 500
    assert a.power_mean_w == pytest.approx((50.0 + 60.0) / 2)
    assert b.utilization_pct_mean == pytest.approx(30.0) and b.memory_used_peak_mb == 60
    # The record round-trips through the measurement JSON.
    from analyzer.measure.measurement import ServerView

    assert ServerView.from_dict(level.to_dict()) == level


def test_no_gpu_series_no_gpu_figures() -> None:
    view = server_view(_snap(0.0), _snap(1.0))
    assert view is not None and view.gpus == ()
    assert view.to_dict()["gpus"] == []


@pytest.mark.usefixtures("serves")
def test_reference_server_page_through_the_same_parser(tmp_path: Path) -> None:
    options = ServerOptions(device="sim", models=("resnet50",))
    with ServerThread(options) as server:
        import urllib.request

        with urllib.request.urlopen(server.metrics_url, timeout=10) as resp:
            text = resp.read().decode()
    snap = parse_metrics(text, "resnet50")
    assert snap.pending_requests == 0
    ((uid, gpu),) = snap.gpus.items()
    assert uid.startswith("GPU-") and gpu.name == "simulated GPU, resnet50_sim profile (sim-gpu0)"
    assert gpu.memory_total_bytes == 16384 * MB
    # One instance, nothing run yet: context 300 MiB + weights 97.4 MiB.
    assert gpu.memory_used_bytes == round((300 + 97.4) * MB)
    assert gpu.utilization == 0.0 and gpu.power_w == 10.0 and gpu.power_limit_w == 70.0


@pytest.mark.triton
def test_live_real_triton_page(real_triton) -> None:  # type: ignore[no-untyped-def]
    snap = parse_metrics(real_triton.metrics_text(), "identity")
    assert snap.pending_requests == 0
    assert set(snap.failures_by_reason) == {"REJECTED", "CANCELED", "BACKEND", "OTHER"}
    assert snap.gpus == {}  # the wheel's Triton runs CPU-only here
