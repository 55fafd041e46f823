"""What a generative trial records and says: token figures in the record, the summary and the
trial line; window stability judged on ITL (pure: planted records)."""

from __future__ import annotations

from analyzer.commands.run_view import latency_text
from analyzer.config.knobs import EngineKnobs
from analyzer.measure.goals import is_stable
from analyzer.measure.measurement import Measurement, WindowStats
from analyzer.measure.specs import LoadMode
from analyzer.measure.tokens import TokenStats
from analyzer.rundir.measurements import FixedMeasurement
from analyzer.rundir.summary import ConfigEntry
from analyzer.rundir.trial_record import TrialRecord

TOKENS = TokenStats(40.0, 120.0, 10.0, 18.0, 10.5, 12.0, 100, 0, 12800, 6400, 640.0, 9.5, 95)


def _window(index: int, rps: float, p99: float, itl: float | None) -> WindowStats:
    return WindowStats(index, 3.0, 30, 0, rps, 300.0, p99, 310.0, itl_p99_ms=itl)


def test_a_generative_window_is_stable_on_its_itl_not_its_end_to_end_p99() -> None:
    # End to end p99 varies with the longest outputs (400 vs 900 ms); ITL agrees.
    token_windows = [_window(i, 10.0, p99, 18.0) for i, p99 in enumerate((400.0, 900.0, 650.0))]
    assert is_stable(token_windows)
    assert not is_stable([_window(i, 10.0, 18.0 * (1 + i), 18.0 * (1 + i)) for i in range(3)])
    # Windows answered once keep perf_analyzer's rule.
    plain = [_window(i, 10.0, p99, None) for i, p99 in enumerate((400.0, 900.0, 650.0))]
    assert not is_stable(plain)
    assert "itl_p99_ms" not in plain[0].to_dict()
    assert WindowStats.from_dict(token_windows[0].to_dict()) == token_windows[0]


def _record(tokens: TokenStats | None) -> TrialRecord:
    level = Measurement(
        LoadMode.REQUEST_RATE,
        10.0,
        9.8,
        300.0,
        320.0,
        330.0,
        350.0,
        100,
        0,
        True,
        True,
        0.5,
        None,
        tokens=tokens,
    )
    return TrialRecord(
        number=3,
        source="search",
        state="complete",
        config=EngineKnobs(8, 2048),
        throughput_rps=9.8,
        p99_ms=350.0,
        meets_goals=True,
        measurement=FixedMeasurement(level),
    )


def test_a_generative_trial_carries_its_token_figures_to_the_summary_and_its_line() -> None:
    record = _record(TOKENS)
    assert record.token_figures() == {
        "ttft_p99_ms": 120.0,
        "itl_p99_ms": 18.0,
        "output_tokens_per_s": 640.0,
        "goodput_rps": 9.5,
    }
    assert TrialRecord.from_dict(record.to_dict()).token_figures() == record.token_figures()
    entry = ConfigEntry.from_trial(record, config_path=None, search_throughput_rps=9.8)
    assert ConfigEntry.from_dict(entry.to_dict()).tokens == record.token_figures()
    assert latency_text(record) == (
        "TTFT p99 120.0 ms, ITL p99 18.0 ms, 640 tok/s, goodput 9.5 req/s"
    )
    plain = _record(None)
    assert plain.token_figures() == {} and latency_text(plain) == "p99 350.0 ms"
    assert (
        "tokens"
        not in ConfigEntry.from_trial(plain, config_path=None, search_throughput_rps=9.8).to_dict()
    )


def test_a_windows_preemptions_are_the_engine_counters_rise_for_its_model() -> None:
    from analyzer.target.server_stats import ServerSnapshot, parse_metrics, server_view

    def page(ours: int, theirs: int) -> str:
        return (
            "# HELP vllm:num_preemptions Cumulative number of preemption from the engine.\n"
            "# TYPE vllm:num_preemptions counter\n"
            f'vllm:num_preemptions_total{{engine="0",model_name="tinyllm"}} {ours}.0\n'
            f'vllm:num_preemptions_total{{engine="0",model_name="other"}} {theirs}.0\n'
        )

    before = ServerSnapshot(None, parse_metrics(page(3, 0), "tinyllm"))
    after = ServerSnapshot(None, parse_metrics(page(10, 50), "tinyllm"))
    view = server_view(before, after)
    assert view is not None and view.preemptions == 7
    assert type(view).from_dict(view.to_dict()) == view
    plain = server_view(
        ServerSnapshot(None, parse_metrics("", "m")), ServerSnapshot(None, parse_metrics("", "m"))
    )
    assert plain is not None and plain.preemptions is None
    assert "preemptions" not in plain.to_dict()


def test_a_generative_level_that_completes_half_of_what_it_sent_misses_its_goals() -> None:
    from dataclasses import replace

    from analyzer.measure.goals import meets_goals
    from analyzer.measure.specs import Goals

    goals = Goals(p99_ms=float("inf"), ttft_p99_ms=500.0, itl_p99_ms=40.0)
    # 31 req/s sent for 3 s, 14.8 completed: the finished streams' TTFT and ITL look fine.
    level = Measurement(
        LoadMode.REQUEST_RATE,
        31.0,
        14.8,
        300.0,
        320.0,
        330.0,
        350.0,
        44,
        0,
        True,
        True,
        0.5,
        None,
        tokens=TOKENS,
        duration_s=3.0,
        offered_rps=31.0,
    )
    ok, why = meets_goals(level, goals)
    assert not ok and why.startswith("completed 14.7 of the 31.0 req/s sent")
    # Completions within Poisson noise of the sends: a steady state, judged on its latencies.
    steady = replace(level, throughput_rps=29.0, request_count=80)
    assert meets_goals(steady, goals)[0]
    # Without token streams (a request of milliseconds) the rule does not apply.
    assert meets_goals(replace(level, tokens=None), Goals(p99_ms=400.0))[0]
    # 18 req/s sent to an engine that completes 16, each stream lasting 1.1 s: over 30 s the
    # shortfall (60) is beyond the in-flight count's noise (3 sigma = 19), though within three
    # sigmas of a Poisson count of 540 (70); over 3 s it is not (6 against 19).
    long = replace(
        level, target=18.0, offered_rps=18.0, duration_s=30.0, request_count=480, mean_ms=1100.0
    )
    ok, why = meets_goals(long, goals)
    assert not ok and why.startswith("completed 16.0 of the 18.0 req/s sent")
    short = replace(long, duration_s=3.0, request_count=48)
    assert meets_goals(short, goals)[0]
