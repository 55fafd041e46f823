"""Measure-and-gate planning: criteria precedence, the load level, compatibility fingerprint."""

from __future__ import annotations

from pathlib import Path

import pytest

from analyzer.commands.gate import parse_fraction
from analyzer.config.scenario import Scenario, load_scenario
from analyzer.config.sections import GateSection
from analyzer.errors import InputError
from analyzer.gate.plan import (
    FLOOR_HEADROOM,
    GateFlags,
    MeasureRequest,
    measurement_hash,
    plan_measurement,
    project_gate_table,
    resolve_criteria,
)
from analyzer.measure.arrivals import CONSTANT, POISSON
from analyzer.measure.specs import LoadMode


def scenario(tmp_path: Path, text: str) -> Scenario:
    path = tmp_path / "s.toml"
    path.write_text(text)
    return load_scenario(path, env={})


def test_parse_fraction() -> None:
    assert parse_fraction("5%") == pytest.approx(0.05)
    assert parse_fraction(" 0.1 ") == pytest.approx(0.1)
    with pytest.raises(InputError):
        parse_fraction("five")


def test_flags_win_over_the_table_and_goals_are_only_a_fallback(tmp_path: Path) -> None:
    s = scenario(tmp_path, "[goals]\np99_ms = 40\nmax_error_rate = 0.02\n")
    table = GateSection(p99_ms=80, max_regression_pct=5, alpha=0.1)
    c = resolve_criteria(GateFlags(p99_ms=60), table, goals_fallback=s)
    assert (c.p99_ms, c.max_regression, c.alpha, c.max_error_rate) == (60, 0.05, 0.1, None)
    fallback = resolve_criteria(GateFlags(), None, goals_fallback=s)
    assert (fallback.p99_ms, fallback.max_error_rate, fallback.min_throughput_rps) == (
        40,
        0.02,
        None,
    )
    # A regression-only gate does not silently pick up the scenario's absolute goals.
    only = resolve_criteria(GateFlags(max_regression=0.05), None, goals_fallback=s)
    assert not only.absolute


def test_level_from_flags_scenario_or_floor(tmp_path: Path) -> None:
    s = scenario(tmp_path, "[traffic]\nrate_rps = 30\n[budget]\nwarmup_s = 0.5\nwindow_s = 2\n")
    plan = plan_measurement(
        s, resolve_criteria(GateFlags(p99_ms=9), None), 3, None, None, None, None, None, 2
    )
    spec = plan.spec
    assert (spec.mode, spec.target, spec.arrival) == (LoadMode.REQUEST_RATE, 30.0, CONSTANT)
    assert (spec.warmup_s, spec.window_s, spec.stable_windows, spec.max_windows) == (0.5, 2.0, 2, 2)
    assert plan.repeats == 3
    flagged = plan_measurement(
        s, resolve_criteria(GateFlags(p99_ms=9), None), 1, 12.0, None, "poisson", 1.0, 1.0, 3
    )
    assert (flagged.spec.target, flagged.spec.arrival, flagged.spec.max_windows) == (
        12.0,
        POISSON,
        3,
    )
    bare = scenario(tmp_path, "")
    floor = resolve_criteria(GateFlags(min_throughput_rps=100), None)
    assert plan_measurement(
        bare, floor, 1, None, None, None, None, None, 2
    ).spec.target == pytest.approx(100 * FLOOR_HEADROOM)
    with pytest.raises(InputError, match="needs a load level"):
        plan_measurement(
            bare, resolve_criteria(GateFlags(p99_ms=5), None), 1, None, None, None, None, None, 2
        )
    closed = plan_measurement(bare, floor, 1, None, 8, None, None, None, 2)
    assert (closed.spec.mode, closed.spec.target) == (LoadMode.CONCURRENCY, 8.0)


def test_scenario_arrival_is_kept_when_the_file_sets_it(tmp_path: Path) -> None:
    s = scenario(tmp_path, '[traffic]\nrate_rps = 30\narrival = "poisson"\n')
    plan = plan_measurement(
        s, resolve_criteria(GateFlags(p99_ms=9), None), 1, None, None, None, None, None, 2
    )
    assert plan.spec.arrival == POISSON


def test_measurement_hash_ignores_where_but_not_what(tmp_path: Path) -> None:
    a = scenario(tmp_path, '[model]\nname = "m"\nrepository = "/tmp/a"\n[traffic]\nrate_rps = 30\n')
    b = scenario(tmp_path, '[model]\nname = "m"\nrepository = "/tmp/b"\n[traffic]\nrate_rps = 30\n')
    c = scenario(tmp_path, '[model]\nname = "m"\n[traffic]\nrate_rps = 31\n')
    crit = resolve_criteria(GateFlags(p99_ms=9), None)

    def fingerprint(s: Scenario, device: str = "sim") -> str:
        return measurement_hash(
            s, plan_measurement(s, crit, 1, None, None, None, None, None, 2), device
        )

    assert fingerprint(a) == fingerprint(b)
    assert fingerprint(a) != fingerprint(c)
    assert fingerprint(a) != fingerprint(a, "cuda")
    mix = (
        '[model]\nname = "m"\n[traffic]\nrate_rps = 30\n'
        '[[traffic.classes]]\nname = "urgent"\nshare = 0.3\npriority = 1\n'
        '[[traffic.classes]]\nname = "bulk"\nshare = 0.7\n'
    )
    assert fingerprint(scenario(tmp_path, mix)) != fingerprint(a)  # a priority mix is "what"


def test_project_file_gate_table(tmp_path: Path) -> None:
    path = tmp_path / "perfsweep.toml"
    assert project_gate_table(path) is None
    path.write_text("[other]\nx = 1\n")
    assert project_gate_table(path) is None
    path.write_text("[gate]\np99_ms = 12\nrepeats = 4\n")
    assert project_gate_table(path) == GateSection(p99_ms=12, repeats=4)
    path.write_text("[gate]\nrepeats = 0\n")
    with pytest.raises(InputError, match=r"perfsweep\.toml \[gate\]"):
        project_gate_table(path)


def test_live_only_flags_are_named() -> None:
    request = MeasureRequest(baseline=Path("b.json"), url="http://x", windows=3)
    assert request.live_flags() == ["--url", "--windows"]


def test_token_criteria_come_from_flags_the_table_or_the_token_goals(tmp_path: Path) -> None:
    table = GateSection(ttft_p99_ms=400, min_tokens_per_s=50)
    c = resolve_criteria(GateFlags(ttft_p99_ms=300, itl_p99_ms=25), table)
    assert (c.ttft_p99_ms, c.itl_p99_ms, c.min_tokens_per_s) == (300, 25, 50)
    # A generative scenario's goals: TTFT and ITL, with the end-to-end p99 left open (a
    # stream's length is not its latency) unless the scenario sets one.
    llm = scenario(tmp_path, "[goals]\nttft_p99_ms = 300\nitl_p99_ms = 20\n")
    fallback = resolve_criteria(GateFlags(), None, goals_fallback=llm)
    assert (fallback.ttft_p99_ms, fallback.itl_p99_ms, fallback.p99_ms) == (300, 20, None)
    capped = scenario(tmp_path, "[goals]\nttft_p99_ms = 300\np99_ms = 2000\n")
    assert resolve_criteria(GateFlags(), None, goals_fallback=capped).p99_ms == 2000
    # A token criterion given is a criterion: the scenario's goals are not added.
    only = resolve_criteria(GateFlags(itl_p99_ms=30), None, goals_fallback=llm)
    assert (only.itl_p99_ms, only.ttft_p99_ms, only.max_error_rate) == (30, None, None)


def test_measurement_hash_tells_token_streams_by_their_lengths(tmp_path: Path) -> None:
    crit = resolve_criteria(GateFlags(ttft_p99_ms=300), None)

    def fingerprint(traffic: str) -> str:
        s = scenario(
            tmp_path,
            f'[model]\nname = "llm"\nprotocol = "openai"\n[traffic]\nrate_rps = 4\n{traffic}',
        )
        return measurement_hash(
            s, plan_measurement(s, crit, 1, None, None, None, None, None, 2), "sim"
        )

    base = fingerprint('input_tokens = "128"\noutput_tokens = "32"\n')
    assert base == fingerprint('input_tokens = "128"\noutput_tokens = "32"\n')
    assert base != fingerprint('input_tokens = "128"\noutput_tokens = "64"\n')
    data = tmp_path / "requests.jsonl"
    data.write_text('{"input_tokens": 10, "output_tokens": 5}\n')
    moved = tmp_path / "elsewhere.jsonl"
    moved.write_text(data.read_text())
    assert fingerprint(f'dataset = "{data}"\n') == fingerprint(f'dataset = "{moved}"\n')
    data.write_text('{"input_tokens": 10, "output_tokens": 6}\n')
    assert fingerprint(f'dataset = "{data}"\n') != fingerprint(f'dataset = "{moved}"\n')


def test_request_lengths_are_live_only_flags() -> None:
    request = MeasureRequest(input_tokens="128", dataset=Path("r.jsonl"))
    assert request.live_flags() == ["--input-tokens", "--dataset"]
