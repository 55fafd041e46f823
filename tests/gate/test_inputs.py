"""Reading results for the gate: run directories, summary.json, ``perfsweep load`` output."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from analyzer.errors import InputError, ResultFormatError
from analyzer.gate.inputs import from_load_document, read_result
from analyzer.measure.capacity import CapacityResult
from analyzer.measure.generator import load_output_dict
from analyzer.measure.measurement import Measurement, WindowStats
from analyzer.measure.specs import Goals, LoadMode
from analyzer.measure.tokens import TokenStats
from analyzer.rundir.results import RunDirectory


def window(i: int, rps: float, p99: float) -> WindowStats:
    return WindowStats(i, 1.0, int(rps), 0, rps, p99 / 2, p99, p99 / 2)


def measurement(
    target: float, rps: float, p99: float, windows: tuple[WindowStats, ...] = (), errors: int = 0
) -> Measurement:
    return Measurement(
        mode=LoadMode.REQUEST_RATE,
        target=target,
        throughput_rps=rps,
        p50_ms=p99 / 2,
        p90_ms=p99 * 0.8,
        p95_ms=p99 * 0.9,
        p99_ms=p99,
        request_count=1000,
        error_count=errors,
        stable=True,
        valid=True,
        send_lag_p99_ms=0.1,
        server=None,
        windows=windows,
    )


ENV = {"model": "m", "device": "sim", "scenario_hash": "h", "host": "ci"}


def write(path: Path, doc: dict[str, Any]) -> Path:
    path.write_text(json.dumps(doc))
    return path


def test_one_level_is_sampled_by_its_windows(tmp_path: Path) -> None:
    m = measurement(50, 49.5, 8.0, (window(0, 49, 7.5), window(1, 50, 8.5), window(2, 49.5, 8.0)))
    g = read_result(write(tmp_path / "r.json", load_output_dict([m], environment=ENV)))
    assert (g.throughput_rps, g.p99_ms, g.error_rate) == (49.5, 8.0, 0.0)
    assert g.sample_basis == "windows"
    assert g.throughput_samples == (49.0, 50.0, 49.5)
    assert g.p99_samples == (7.5, 8.5, 8.0)
    assert g.environment["measure"] == "request_rate 50"
    assert g.environment["scenario_hash"] == "h"


def test_repeats_at_one_level_are_samples_and_the_headline_is_their_median() -> None:
    doc = load_output_dict(
        [measurement(50, 48, 9.0, errors=10), measurement(50, 50, 7.0), measurement(50, 49, 8.0)],
        environment=ENV,
    )
    g = from_load_document(doc, "r.json")
    assert g.sample_basis == "repeats"
    assert g.throughput_samples == (48, 50, 49)
    assert (g.throughput_rps, g.p99_ms) == (49, 8.0)
    assert g.error_rate == pytest.approx(10 / 3000)


def test_level_selection() -> None:
    doc = load_output_dict([measurement(10, 10, 2.0), measurement(80, 79, 9.0)], environment=ENV)
    highest = from_load_document(doc, "r.json")
    assert highest.p99_ms == 9.0
    assert any("highest load level" in n for n in highest.notes)
    assert from_load_document(doc, "r.json", level=10).p99_ms == 2.0
    with pytest.raises(InputError, match="no load level 20"):
        from_load_document(doc, "r.json", level=20)


def test_capacity_result_is_one_sample() -> None:
    best = measurement(120, 119, 40.0)
    cap = CapacityResult(Goals(p99_ms=50), 120.0, (best, measurement(240, 200, 300.0)), best, True)
    g = from_load_document(load_output_dict(list(cap.points), cap, ENV), "cap.json")
    assert (g.throughput_rps, g.p99_ms, g.sample_basis) == (120.0, 40.0, "single")
    assert g.environment["measure"] == "capacity at p99 <= 50 ms"


def streamed(m: Measurement, ttft: float, itl: float, tokens_per_s: float) -> Measurement:
    """``m`` with token streams (a generative model's level)."""
    tokens = TokenStats(
        ttft_p50_ms=ttft / 2,
        ttft_p99_ms=ttft,
        itl_p50_ms=itl / 2,
        itl_p99_ms=itl,
        mean_itl_p50_ms=itl / 2,
        mean_itl_p99_ms=itl,
        streams=m.request_count,
        failed_streams=0,
        input_tokens=128 * m.request_count,
        output_tokens=32 * m.request_count,
        output_tokens_per_s=tokens_per_s,
    )
    return dataclasses.replace(m, tokens=tokens)


def test_repeats_of_token_streams_are_token_samples_too(tmp_path: Path) -> None:
    repeats = [
        streamed(measurement(4, 4, 900.0), 120.0, 11.0, 128.0),
        streamed(measurement(4, 4, 950.0), 140.0, 12.0, 127.0),
        streamed(measurement(4, 4, 920.0), 130.0, 10.0, 126.0),
    ]
    g = read_result(write(tmp_path / "r.json", load_output_dict(repeats, environment=ENV)))
    assert g.tokens is not None
    assert g.tokens.ttft_p99_samples == (120.0, 140.0, 130.0)
    assert g.tokens.itl_p99_samples == (11.0, 12.0, 10.0)
    assert g.tokens.tokens_per_s_samples == (128.0, 127.0, 126.0)
    assert (g.tokens.ttft_p99_ms, g.tokens.itl_p99_ms, g.tokens.output_tokens_per_s) == (
        130.0,
        11.0,
        127.0,
    )


def test_a_load_without_streams_has_no_token_figures() -> None:
    g = from_load_document(load_output_dict([measurement(50, 50, 8.0)], environment=ENV), "r")
    assert g.tokens is None


def test_capacity_under_token_goals_judges_its_best_point_and_names_the_goals() -> None:
    best = streamed(measurement(6, 6, 2000.0), 300.0, 20.0, 190.0)
    over = streamed(measurement(12, 9, 5000.0), 3000.0, 60.0, 280.0)
    cap = CapacityResult(
        Goals(p99_ms=None, ttft_p99_ms=500, itl_p99_ms=25),  # type: ignore[arg-type]
        6.0,
        (best, over),
        best,
        True,
    )
    g = from_load_document(load_output_dict(list(cap.points), cap, ENV), "cap.json")
    assert g.environment["measure"] == "capacity at TTFT p99 <= 500 ms, ITL p99 <= 25 ms"
    assert g.tokens is not None
    assert (g.tokens.ttft_p99_ms, g.tokens.itl_p99_ms, g.tokens.output_tokens_per_s) == (
        300.0,
        20.0,
        190.0,
    )


def test_unknown_load_format_version_is_refused(tmp_path: Path) -> None:
    doc = {**load_output_dict([measurement(50, 50, 8.0)]), "format_version": 99}
    with pytest.raises(ResultFormatError) as info:
        read_result(write(tmp_path / "r.json", doc))
    assert info.value.exit_code == 2


def test_not_a_result(tmp_path: Path) -> None:
    with pytest.raises(ResultFormatError, match="not a perfsweep result"):
        read_result(write(tmp_path / "x.json", {"kind": "something"}))
    with pytest.raises(InputError, match="does not exist"):
        read_result(tmp_path / "missing.json")
    with pytest.raises(InputError, match=r"no summary\.json"):
        read_result(tmp_path)


CONFIG = {
    "max_batch_size": 8,
    "max_queue_delay_us": 100,
    "preferred_batch_size": [],
    "instance_count": 1,
}


def candidate(number: int, throughput_rps: list[float], p99_ms: list[float], **extra: Any) -> dict:
    """A summary.json validation candidate (what ``sweep.validate_winners`` writes)."""
    return {
        "trial_number": number,
        "config": CONFIG,
        "throughput_rps": throughput_rps,
        "p99_ms": p99_ms,
        "worst_rps": min(throughput_rps),
        "all_meet_goals": True,
        **extra,
    }


def summary(best_number: int | None, validation: list[dict[str, Any]]) -> dict[str, Any]:
    config = CONFIG
    best = (
        None
        if best_number is None
        else {
            "config": config,
            "throughput_rps": 410.0,
            "p50_ms": 9.0,
            "p99_ms": 30.0,
            "meets_goals": True,
            "trial_number": best_number,
            "config_path": "best/config.pbtxt",
            "validated_throughput_rps": 400.0,
        }
    )
    return {
        "run_id": "m-20260101-000000",
        "model": "m",
        "device": "sim",
        "target_url": "http://127.0.0.1:1",
        "goals": {"p99_ms": 40.0, "min_throughput_rps": 0.0, "max_error_rate": 0.01},
        "objective": "throughput",
        "baseline": {
            "config": config,
            "throughput_rps": 100.0,
            "p50_ms": 5.0,
            "p99_ms": 12.0,
            "meets_goals": True,
            "trial_number": -1,
        },
        "best": best,
        "gain": 4.1,
        "validation": validation,
        "environment": {"host": "ci", "gpu": [], "scenario_hash": "s1"},
        "scenario": {},
    }


def test_run_directory_uses_validation_repeats_and_the_trial_record(tmp_path: Path) -> None:
    run = RunDirectory(tmp_path / "run")
    validation = [
        candidate(3, [400.0, 420.0, 415.0], [31.0, 29.0, 30.0]),
        candidate(5, [300.0, 310.0], [35.0, 36.0]),
    ]
    run.write_summary(summary(3, validation))
    run.write_trial(
        {
            "number": 3,
            "source": "search",
            "state": "complete",
            "config": CONFIG,
            "error_rate": 0.002,
        }
    )
    g = read_result(run.root)
    # The validated numbers, not the search step's 410 req/s: the worst repeat on each metric
    # (Objective.repeat_figure, the figure the report's headline states), not their median.
    assert (g.throughput_rps, g.p99_ms) == (400.0, 31.0)
    assert any("validation repeats of trial 3" in n for n in g.notes)
    assert g.sample_basis == "repeats"
    assert g.throughput_samples == (400.0, 420.0, 415.0)
    assert g.error_rate == 0.002
    assert g.environment["measure"] == "capacity at p99 <= 40 ms"
    assert g.environment["scenario_hash"] == "s1"
    assert g.environment["gpu"] is None  # no GPU: the fact is unknown, not a mismatch
    # The same summary read as a file also finds the trial record beside it.
    assert read_result(run.summary_json).error_rate == 0.002


def test_a_single_validation_repeat_is_the_headline_but_one_sample(tmp_path: Path) -> None:
    path = tmp_path / "summary.json"
    validation = [candidate(3, [62.5], [28.0])]
    doc = {"format_version": 1, "kind": "perfsweep.summary", **summary(3, validation)}
    g = read_result(write(path, doc))
    assert (g.throughput_rps, g.p99_ms, g.sample_basis) == (62.5, 28.0, "single")


def test_summary_without_best_judges_the_baseline_config(tmp_path: Path) -> None:
    path = tmp_path / "summary.json"
    doc = {"format_version": 1, "kind": "perfsweep.summary", **summary(None, [])}
    g = read_result(write(path, doc))
    assert (g.throughput_rps, g.sample_basis, g.error_rate) == (100.0, "single", None)
    assert any("judging the baseline config" in n for n in g.notes)


def test_unknown_summary_version_is_refused(tmp_path: Path) -> None:
    doc = {"format_version": 2, "kind": "perfsweep.summary", **summary(3, [])}
    with pytest.raises(ResultFormatError, match="format_version 2"):
        read_result(write(tmp_path / "summary.json", doc))


def test_a_validation_repeat_that_missed_the_goals_is_named(tmp_path: Path) -> None:
    run = RunDirectory(tmp_path / "run")
    validation = [
        candidate(3, [400.0, 420.0, 415.0], [31.0, 2.0, 30.0], meets_goals=[True, False, True])
    ]
    doc = summary(3, validation)
    doc["baseline"]["meets_goals"] = False
    run.write_summary(doc)
    g = read_result(run.root)
    assert any("repeat(s) 2 of trial 3 missed the sweep's goals" in n for n in g.notes), g.notes
    assert not any("judged config missed" in n for n in g.notes)
    doc["best"]["meets_goals"] = False
    run.write_summary(doc)
    assert any("judged config missed" in n for n in read_result(run.root).notes)


@pytest.mark.parametrize("objective", ["throughput", "latency"])
def test_validation_repeats_are_judged_by_their_worst_repeat(
    objective: str, tmp_path: Path
) -> None:
    """Objective.repeat_figure, the rule the report's headline uses: the lowest throughput and
    the highest p99 over the repeats (not their median), whichever the objective ranks by."""
    validation = [candidate(3, [400.0, 380.0, 415.0], [29.0, 31.0, 35.0])]
    doc = {"format_version": 1, "kind": "perfsweep.summary", **summary(3, validation)}
    doc["objective"] = objective
    doc["scenario"] = {"traffic": {"rate_rps": 60}}
    g = read_result(write(tmp_path / "summary.json", doc))
    assert (g.throughput_rps, g.p99_ms, g.sample_basis) == (380.0, 35.0, "repeats")
    assert g.p99_samples == (29.0, 31.0, 35.0)
    expected = "fixed load 60" if objective == "latency" else "capacity at p99 <= 40 ms"
    assert g.environment["measure"] == expected


def test_a_generative_run_directory_gives_the_trials_token_figures(tmp_path: Path) -> None:
    run = RunDirectory(tmp_path / "run")
    run.write_summary(summary(3, [candidate(3, [6.0, 5.5], [900.0, 950.0])]))
    point = streamed(measurement(6, 6, 900.0), 250.0, 18.0, 190.0)
    run.write_trial(
        {
            "number": 3,
            "source": "search",
            "state": "complete",
            "config": CONFIG,
            "error_rate": 0.0,
            "measurement": point.to_dict(),
        }
    )
    g = read_result(run.root)
    assert g.tokens is not None
    assert (g.tokens.ttft_p99_ms, g.tokens.itl_p99_ms, g.tokens.output_tokens_per_s) == (
        250.0,
        18.0,
        190.0,
    )
    assert g.tokens.ttft_p99_samples == (250.0,)
    assert any("token figures are trial 3's search step" in n for n in g.notes)


def test_one_streamed_level_is_sampled_by_its_windows_ttft_and_itl(tmp_path: Path) -> None:
    windows = tuple(
        dataclasses.replace(window(i, 4, 900.0), ttft_p99_ms=ttft, itl_p99_ms=itl)
        for i, (ttft, itl) in enumerate([(110.0, 10.0), (130.0, 12.0), (120.0, 11.0)])
    )
    m = streamed(measurement(4, 4, 900.0, windows), 125.0, 11.5, 128.0)
    g = read_result(write(tmp_path / "r.json", load_output_dict([m], environment=ENV)))
    assert g.tokens is not None
    assert g.tokens.ttft_p99_samples == (110.0, 130.0, 120.0)
    assert g.tokens.itl_p99_samples == (10.0, 12.0, 11.0)
    # The headline is the level's own (all its requests), tokens/s one sample.
    assert (g.tokens.ttft_p99_ms, g.tokens.tokens_per_s_samples) == (125.0, (128.0,))


def test_a_summary_alone_gives_its_entrys_token_figures(tmp_path: Path) -> None:
    doc = summary(3, [])
    doc["best"]["tokens"] = {
        "ttft_p99_ms": 240.0,
        "itl_p99_ms": 17.0,
        "output_tokens_per_s": 210.0,
        "goodput_rps": 6.0,
    }
    run = RunDirectory(tmp_path / "run")  # no trial records beside it
    run.write_summary(doc)
    g = read_result(run.root / "summary.json")
    assert g.tokens is not None
    assert (g.tokens.ttft_p99_ms, g.tokens.itl_p99_ms, g.tokens.output_tokens_per_s) == (
        240.0,
        17.0,
        210.0,
    )
    assert g.tokens.itl_p99_samples == (17.0,)
