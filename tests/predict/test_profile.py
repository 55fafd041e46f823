"""Profiles: from statistics, from a run directory's windows, from a TOML; JSON round trip."""

from __future__ import annotations

from pathlib import Path

import pytest

from analyzer.predict import ExtrapolationError, ProfileError
from analyzer.predict.fitting import WindowSample, fit_windows, from_run_dir
from analyzer.predict.interference import overlap_from_interference
from analyzer.predict.profile import BatchTiming, Profile, load_profile, save_profile
from analyzer.predict.sources import from_statistics, from_toml

RUN = Path(__file__).parent / "data" / "run-sim"


def _stats(model: str, rows: list[tuple[int, int, float, float, float]]) -> dict:
    """A statistics document: (batch size, count, input ms, infer ms, output ms) per row."""
    return {
        "model_stats": [
            {
                "name": model,
                "version": "1",
                "batch_stats": [
                    {
                        "batch_size": b,
                        "compute_input": {"count": n, "ns": int(i * 1e6 * n)},
                        "compute_infer": {"count": n, "ns": int(f * 1e6 * n)},
                        "compute_output": {"count": n, "ns": int(o * 1e6 * n)},
                    }
                    for b, n, i, f, o in rows
                ],
            },
            {"name": "other", "version": "1", "batch_stats": []},
        ]
    }


def test_from_statistics_means_per_batch_size_and_no_extrapolation() -> None:
    doc = _stats("m", [(1, 10, 0.5, 4.0, 0.2), (4, 5, 0.8, 6.0, 0.3)])
    profile = from_statistics(doc, "m", server="test server")
    assert [t.batch_size for t in profile.timings] == [1, 4]
    assert profile.timings[1].infer_ms == pytest.approx(6.0)
    assert profile.timing(2).infer_ms == pytest.approx(4.0 + 2.0 / 3.0)  # interpolated
    assert "15 executions" in profile.provenance and "test server" in profile.provenance
    with pytest.raises(ExtrapolationError, match="covers batch sizes 1-4"):
        profile.check_covers(5)
    with pytest.raises(ProfileError, match="no executions of model 'x'"):
        from_statistics(doc, "x")


def test_json_round_trip_and_refused_versions(tmp_path: Path) -> None:
    profile = Profile(
        model="m",
        provenance="planted",
        source="test",
        timings=(BatchTiming(1, 0.1, 1.0, 0.1, 3), BatchTiming(2, 0.2, 1.5, 0.1, 4)),
        jitter=0.05,
        interference={2: 1.4},
        overlap_ms=0.25,
    )
    path = tmp_path / "p.json"
    save_profile(profile, path)
    assert load_profile(path) == profile
    path.write_text('{"kind": "perfsweep.profile", "format_version": 99}')
    with pytest.raises(ProfileError, match="format version 1"):
        load_profile(path)


def test_fit_recovers_a_planted_linear_curve() -> None:
    # infer = 3 + 0.5 b ms per execution; a request reports its batch's time.
    def window(hist: dict[int, int], instances: int = 1, wait_ms: float = 0.0) -> WindowSample:
        items = sum(b * n for b, n in hist.items())
        infer = sum(n * b * (3.0 + 0.5 * b) for b, n in hist.items()) / items
        return WindowSample(instances, hist, 1000.0 * (1.0 + wait_ms), 1000.0 * infer, 200.0)

    samples = [window({1: 50}), window({1: 10, 2: 20, 4: 5}), window({4: 10, 8: 10})]
    samples.append(window({8: 10}, instances=2, wait_ms=3.0))
    profile = fit_windows(samples, "m", "planted")
    assert profile.max_batch_size == 8
    for b in (1, 3, 8):
        assert profile.timing(b).infer_ms == pytest.approx(3.0 + 0.5 * b, rel=1e-6)
    # The 2-instance window's device waits stay out of the input phase...
    assert profile.timing(8).input_ms == pytest.approx(1.0, rel=1e-6)
    # ...and show up as interference: (4 + 7 + 0.2) / (1 + 7 + 0.2).
    assert profile.interference[2] == pytest.approx(11.2 / 8.2, rel=1e-6)
    with pytest.raises(ProfileError, match="no trial window"):
        fit_windows([], "m", "planted")


def test_from_run_dir_fixture() -> None:
    profile = from_run_dir(RUN)
    assert profile.model == "resnet50" and profile.source == "run_dir"
    assert profile.max_batch_size == 15  # the largest batch the run executed
    # The run was recorded on resnet50_sim when its device took 4.0 ms at batch 1 and 9.0 at 8
    # (plus the server's own overhead).
    assert profile.timing(1).infer_ms == pytest.approx(4.0, rel=0.1)
    assert profile.timing(8).infer_ms == pytest.approx(9.0, rel=0.15)
    assert 3 in profile.interference and profile.interference[3] > 1.0


def test_from_toml_is_the_simulated_backend_curve() -> None:
    profile = from_toml("resnet50_sim")
    assert profile.max_batch_size == 32 and profile.jitter == pytest.approx(0.03)
    assert profile.timing(8).infer_ms == pytest.approx(22.5)
    assert profile.timing(8).input_ms == pytest.approx(2.0 + 0.2 * 8)
    assert "SYNTHETIC" in profile.provenance
    with pytest.raises(ProfileError, match="linear"):
        from_toml("sim_linear")
    assert from_toml("sim_linear", max_batch_size=4).timing(4).infer_ms == pytest.approx(3.0)


# ------------------------------------------------------------------ overlap from interference


def _burst_ratio(host_ms: float, serial_ms: float, instances: int) -> float:
    """N batches started together on N instances of one device: batch k ends its serialised
    part at h + (k + 1) s, so the mean execution over the one-instance h + s."""
    mean = sum(host_ms + (k + 1) * serial_ms for k in range(instances)) / instances
    return mean / (host_ms + serial_ms)


@pytest.mark.parametrize("instances", [2, 3])
def test_overlap_recovers_host_work_reported_inside_compute_infer(instances: int) -> None:
    # Triton's Python backend: its whole execute() is compute_infer; 2 ms of it is host work.
    alone = BatchTiming(4, 0.05, 16.0, 0.2)
    r = _burst_ratio(2.0 + 0.25, 14.0, instances)  # host = 2 ms + the input/output phases
    noise = [r * (1 + e) for e in (-0.001, 0.0, 0.001, 0.0) * 6]
    overlap = overlap_from_interference(alone, instances, noise)
    assert overlap.ms == pytest.approx(2.0, abs=0.15)
    assert overlap.serial_share == pytest.approx(14.0 / 16.25, abs=0.01)
    assert overlap.bursts == 24 and f"{overlap.ms:.2f} ms" in overlap.describe()


def test_no_overlap_where_the_statistics_already_split_host_work() -> None:
    # The reference server: host work in compute_input/output, the device's in compute_infer.
    alone = BatchTiming(4, 1.2, 5.9, 0.6)
    r = _burst_ratio(1.8, 5.9, 2)
    assert overlap_from_interference(alone, 2, [r] * 12).ms == pytest.approx(0.0, abs=1e-9)


def test_noisy_bursts_claim_less_overlap_never_more() -> None:
    alone = BatchTiming(4, 0.0, 16.0, 0.0)
    r = _burst_ratio(2.0, 14.0, 2)
    exact = overlap_from_interference(alone, 2, [r] * 12)
    noisy = overlap_from_interference(alone, 2, [r * (1 + e) for e in (-0.05, 0.05) * 6])
    assert noisy.ms < exact.ms
    assert noisy.stderr > 0
    # One burst has no standard error: no overlap is claimed.
    assert overlap_from_interference(alone, 2, [r]).ms == 0.0
    # One burst in 24 stretched by a hiccup moves neither the ratio nor its error much.
    steady = [r * (1 + e) for e in (-0.005, 0.005) * 12]
    hiccup = overlap_from_interference(alone, 2, [*steady[:-1], 2.5 * r])
    assert hiccup.ms == pytest.approx(overlap_from_interference(alone, 2, steady).ms, abs=0.3)
    assert hiccup.ms > 1.0


def test_table_moves_the_overlap_from_the_device_to_the_input_phase() -> None:
    timings = (BatchTiming(1, 0.1, 1.5, 0.1), BatchTiming(2, 0.2, 3.0, 0.1))
    plain = Profile(model="m", provenance="p", source="test", timings=timings)
    shifted = Profile(model="m", provenance="p", source="test", timings=timings, overlap_ms=2.0)
    for a, b in zip(plain.table(2)[1:], shifted.table(2)[1:], strict=True):
        assert b.total_ms == pytest.approx(a.total_ms)
        assert b.infer_ms == pytest.approx(max(0.0, a.infer_ms - 2.0))
    assert shifted.table(2)[1].infer_ms == 0.0  # never below zero: 1.5 ms moved, not 2
    assert shifted.timing(2) == plain.timing(2)  # the measured phases stay as measured
