"""Profiles: from statistics, from a run directory's windows, from a TOML; JSON round trip."""

from __future__ import annotations

from pathlib import Path

import pytest

from analyzer.predict import ExtrapolationError, ProfileError
from analyzer.predict.profile import (
    BatchTiming,
    Profile,
    WindowSample,
    fit_windows,
    from_run_dir,
    from_statistics,
    from_toml,
    load_profile,
    save_profile,
)

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
    # resnet50_sim: 4.0 ms device time at batch 1, 9.0 at 8 (plus the server's own overhead).
    assert profile.timing(1).infer_ms == pytest.approx(4.0, rel=0.1)
    assert profile.timing(8).infer_ms == pytest.approx(9.0, rel=0.15)
    assert 3 in profile.interference and profile.interference[3] > 1.0


def test_from_toml_is_the_simulated_backend_curve() -> None:
    profile = from_toml("resnet50_sim")
    assert profile.max_batch_size == 32 and profile.jitter == pytest.approx(0.03)
    assert profile.timing(8).infer_ms == pytest.approx(9.0)
    assert profile.timing(8).input_ms == pytest.approx(0.8 + 0.08 * 8)
    assert "SYNTHETIC" in profile.provenance
    with pytest.raises(ProfileError, match="linear"):
        from_toml("sim_linear")
    assert from_toml("sim_linear", max_batch_size=4).timing(4).infer_ms == pytest.approx(3.0)
