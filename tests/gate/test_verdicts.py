"""Gate verdicts on planted data: the rank test, regression significance, absolute criteria."""

from __future__ import annotations

import dataclasses
import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import analyzer.gate.verdict as gate
from analyzer.errors import InputError
from analyzer.gate import significance
from analyzer.gate.significance import mann_whitney_greater, relative_change
from analyzer.gate.verdict import (
    Criteria,
    GateInput,
    Outcome,
    compare_metric,
    evaluate,
    incompatibilities,
)

ENV = {"model": "m", "device": "sim", "scenario_hash": "abc", "measure": "request_rate 50"}


def planted(
    throughput: float, p99: float, n: int, noise: float, seed: int, label: str = "x", **env: str
) -> GateInput:
    """n repeats with relative gaussian noise around the given throughput and p99."""
    rng = np.random.default_rng(seed)
    tp = tuple(float(v) for v in throughput * (1 + noise * rng.standard_normal(n)))
    lat = tuple(float(v) for v in p99 * (1 + noise * rng.standard_normal(n)))
    return GateInput(
        label=label,
        throughput_rps=float(np.median(tp)),
        p99_ms=float(np.median(lat)),
        error_rate=0.0,
        throughput_samples=tp,
        p99_samples=lat,
        sample_basis="repeats" if n > 1 else "single",
        environment={**ENV, **env},
    )


def by_name(report: gate.GateReport) -> dict[str, Outcome]:
    return {r.name: r.outcome for r in report.results}


# -- the rank test ---------------------------------------------------------------------------------


def brute_force_p(x: list[float], y: list[float]) -> float:
    """P(U >= observed) by enumerating every relabelling of the pooled values."""
    pooled = [*x, *y]

    def u(xs: list[float], ys: list[float]) -> float:
        return sum((a > b) + 0.5 * (a == b) for a in xs for b in ys)

    observed = u(x, y)
    hits = total = 0
    for chosen in itertools.combinations(range(len(pooled)), len(x)):
        xs = [pooled[i] for i in chosen]
        ys = [pooled[i] for i in range(len(pooled)) if i not in chosen]
        hits += u(xs, ys) >= observed - 1e-9
        total += 1
    return hits / total


@pytest.mark.parametrize(
    ("x", "y"),
    [
        ([4, 5, 6], [1, 2, 3]),
        ([1, 2, 3], [4, 5, 6]),
        ([3, 3, 5, 7], [1, 3, 3]),  # ties across the samples
        ([2.0, 2.0], [2.0, 2.0, 2.0]),
        ([10, 1, 7, 3, 9], [2, 8, 4, 6, 5]),
    ],
)
def test_exact_p_value_matches_enumeration(x: list[float], y: list[float]) -> None:
    assert mann_whitney_greater(x, y) == pytest.approx(brute_force_p(x, y), abs=1e-12)


def test_normal_approximation_agrees_with_the_exact_test(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(3)
    x, y = list(rng.normal(0.6, 1, 25)), list(rng.normal(0, 1, 25))
    exact = mann_whitney_greater(x, y)
    monkeypatch.setattr(significance, "EXACT_LIMIT", 0)
    approx = mann_whitney_greater(x, y)
    assert 0.001 < exact < 0.2
    assert approx == pytest.approx(exact, rel=0.35)


def test_smallest_p_values_by_sample_size() -> None:
    assert mann_whitney_greater([1.0], [0.0]) == 0.5
    assert mann_whitney_greater([2.0, 3.0], [0.0, 1.0]) == pytest.approx(1 / 6)
    assert mann_whitney_greater([3.0, 4.0, 5.0], [0.0, 1.0, 2.0]) == pytest.approx(1 / 20)


# -- regression verdicts -----------------------------------------------------------------------------


def test_identical_distributions_pass() -> None:
    base = planted(500, 20, n=10, noise=0.03, seed=1)
    cand = planted(500, 20, n=10, noise=0.03, seed=2)
    report = evaluate(cand, Criteria(max_regression=0.05), baseline=base)
    assert report.passed
    assert set(by_name(report).values()) == {Outcome.PASS}


def test_planted_ten_percent_regression_with_low_noise_fails() -> None:
    base = planted(500, 20, n=6, noise=0.01, seed=1)
    cand = planted(450, 22, n=6, noise=0.01, seed=2)  # 10 % less throughput, 10 % more p99
    report = evaluate(cand, Criteria(max_regression=0.05), baseline=base)
    assert not report.passed
    assert by_name(report) == {
        "throughput_rps regression <= 5%": Outcome.FAIL,
        "p99_ms regression <= 5%": Outcome.FAIL,
    }
    tp = report.results[0]
    assert tp.change == "-10.5%"
    assert tp.p_value is not None and tp.p_value <= 0.05
    assert "significant" in tp.detail and "not significant" not in tp.detail


def test_planted_ten_percent_regression_under_heavy_noise_is_not_significant() -> None:
    base = planted(500, 20, n=3, noise=0.3, seed=11)
    cand = planted(450, 22, n=3, noise=0.3, seed=12)
    # The planted shift is visible in the medians, but three noisy repeats cannot confirm it.
    tp = compare_metric(
        "throughput_rps",
        cand.throughput_samples,
        base.throughput_samples,
        0.05,
        0.05,
        higher_is_better=True,
        unit="req/s",
    )
    assert tp.outcome is Outcome.NOT_SIGNIFICANT, tp.detail
    assert "not significant" in tp.detail
    report = evaluate(cand, Criteria(max_regression=0.05), baseline=base)
    assert set(by_name(report).values()) == {Outcome.NOT_SIGNIFICANT}
    assert report.passed  # "not significant" never fails the gate


def test_change_within_tolerance_passes_even_when_significant() -> None:
    base = planted(500, 20, n=8, noise=0.002, seed=1)
    cand = planted(490, 20.4, n=8, noise=0.002, seed=2)  # 2 % worse, very clearly
    report = evaluate(cand, Criteria(max_regression=0.05), baseline=base)
    assert set(by_name(report).values()) == {Outcome.PASS}


def test_improvement_passes() -> None:
    base = planted(500, 20, n=5, noise=0.01, seed=1)
    cand = planted(700, 10, n=5, noise=0.01, seed=2)
    report = evaluate(cand, Criteria(max_regression=0.05), baseline=base)
    assert report.passed
    assert all(r.detail.endswith("no regression") for r in report.results)


@settings(max_examples=200, deadline=None)
@given(
    cand=st.floats(0.001, 1e6),
    base=st.lists(st.floats(0.001, 1e6), min_size=1, max_size=30),
    flip=st.booleans(),
)
def test_a_single_sample_comparison_is_never_significant(
    cand: float, base: list[float], flip: bool
) -> None:
    one, many = [cand], base
    if flip:
        one, many = many, one
    for higher in (True, False):
        r = compare_metric("m", one, many, 0.05, 0.05, higher_is_better=higher, unit="ms")
        assert r.outcome is not Outcome.FAIL


def test_false_alarm_rate_is_at_most_alpha_and_power_is_high() -> None:
    """Calibration on many planted repetitions (seeded, so the counts are deterministic)."""
    rng = np.random.default_rng(2024)
    trials, n = 400, 6
    false_alarms = detected = 0
    for _ in range(trials):
        base = list(500 * (1 + 0.05 * rng.standard_normal(n)))
        same = list(500 * (1 + 0.05 * rng.standard_normal(n)))
        worse = list(400 * (1 + 0.05 * rng.standard_normal(n)))  # a 20 % regression
        for cand, counter in ((same, "null"), (worse, "alt")):
            r = compare_metric("t", cand, base, 0.05, 0.05, higher_is_better=True, unit="req/s")
            if r.outcome is Outcome.FAIL:
                if counter == "null":
                    false_alarms += 1
                else:
                    detected += 1
    # Testing against the threshold-shifted baseline makes the gate conservative under no change.
    assert false_alarms / trials <= 0.05
    assert detected / trials >= 0.9


# -- absolute criteria, compatibility, input errors ---------------------------------------------------


def test_absolute_criteria() -> None:
    cand = GateInput("c", 480.0, 95.0, 0.002, (480.0,), (95.0,), "single", ENV)
    report = evaluate(cand, Criteria(p99_ms=100, min_throughput_rps=500, max_error_rate=0.001))
    assert by_name(report) == {
        "p99_ms <= 100": Outcome.PASS,
        "throughput_rps >= 500": Outcome.FAIL,
        "error_rate <= 0.001": Outcome.FAIL,
    }
    assert [r.name for r in report.failures] == ["throughput_rps >= 500", "error_rate <= 0.001"]


def test_a_result_without_error_rate_cannot_be_gated_on_it() -> None:
    cand = GateInput("summary.json", 480.0, 95.0, None, (480.0,), (95.0,), "single", ENV)
    with pytest.raises(InputError, match="does not record an error rate"):
        evaluate(cand, Criteria(max_error_rate=0.01))


def test_incompatible_environments_are_refused_with_reasons_unless_forced() -> None:
    base = planted(500, 20, n=3, noise=0.01, seed=1, device="cuda", scenario_hash="111")
    cand = planted(500, 20, n=3, noise=0.01, seed=2, device="sim", scenario_hash="222")
    reasons = incompatibilities(cand, base)
    assert reasons == [
        "device differs: baseline 'cuda', candidate 'sim'",
        "scenario_hash differs: baseline '111', candidate '222'",
    ]
    with pytest.raises(InputError, match=r"refusing to compare.*device differs.*--force") as info:
        evaluate(cand, Criteria(max_regression=0.05), baseline=base)
    assert info.value.exit_code == 2
    forced = evaluate(cand, Criteria(max_regression=0.05), baseline=base, force=True)
    assert forced.forced == tuple(reasons)


def test_a_baseline_hashed_by_an_older_perfsweep_is_refused_saying_why() -> None:
    base = planted(500, 20, n=3, noise=0.01, seed=1, scenario_hash="0123456789abcdef")
    cand = planted(500, 20, n=3, noise=0.01, seed=2, scenario_hash="v2-fedcba9876543210")
    [reason] = incompatibilities(cand, base)
    assert reason.startswith("scenario_hash differs: baseline '0123456789abcdef'")
    assert "hash version 1 vs 2" in reason and "measure the baseline again" in reason
    with pytest.raises(InputError, match=r"hash version 1 vs 2.*--force"):
        evaluate(cand, Criteria(max_regression=0.05), baseline=base)


def test_unknown_facts_do_not_block_a_comparison() -> None:
    base = planted(500, 20, n=3, noise=0.01, seed=1, scenario_hash=None)  # type: ignore[arg-type]
    cand = planted(500, 20, n=3, noise=0.01, seed=2)
    assert incompatibilities(cand, base) == []


@pytest.mark.parametrize(
    ("criteria", "with_baseline", "message"),
    [
        (Criteria(), False, "nothing to gate on"),
        (Criteria(p99_ms=10), True, "go together"),
        (Criteria(max_regression=0.05), False, "go together"),
    ],
)
def test_inconsistent_requests_are_input_errors(
    criteria: Criteria, with_baseline: bool, message: str
) -> None:
    c = planted(500, 20, n=3, noise=0.01, seed=1)
    with pytest.raises(InputError, match=message):
        evaluate(c, criteria, baseline=c if with_baseline else None)


@pytest.mark.parametrize(
    "kwargs",
    [{"p99_ms": 0}, {"max_error_rate": 1.0}, {"max_regression": 0.0}, {"alpha": 0.6}],
)
def test_criteria_validation(kwargs: dict[str, float]) -> None:
    with pytest.raises(InputError):
        Criteria(**kwargs)


def test_zero_baseline_change_is_infinite() -> None:
    assert math.isinf(relative_change(1.0, 0.0))
    assert relative_change(0.0, 0.0) == 0.0


def test_too_few_repeats_to_ever_be_significant_say_so() -> None:
    r = compare_metric("p99_ms", [30, 31], [10, 11], 0.05, 0.05, higher_is_better=False, unit="ms")
    assert r.outcome is Outcome.NOT_SIGNIFICANT
    assert r.p_value == pytest.approx(1 / 6)
    assert "can never reach p <= 0.05" in r.detail


# -- token streams (generative models) -----------------------------------------------------------


def streamed(
    ttft: float, itl: float, tokens_per_s: float, n: int, noise: float, seed: int, label: str = "x"
) -> GateInput:
    """``planted`` requests plus n repeats of token figures with relative gaussian noise."""
    rng = np.random.default_rng(seed + 1000)

    def around(value: float) -> tuple[float, ...]:
        return tuple(float(v) for v in value * (1 + noise * rng.standard_normal(n)))

    t, i, r = around(ttft), around(itl), around(tokens_per_s)
    figures = gate.TokenFigures(
        float(np.median(t)), float(np.median(i)), float(np.median(r)), t, i, r
    )
    return dataclasses.replace(planted(4, 900, n, noise, seed, label), tokens=figures)


def test_absolute_token_criteria_judge_the_headline_figures() -> None:
    cand = streamed(ttft=180, itl=22, tokens_per_s=240, n=1, noise=0.0, seed=1)
    report = evaluate(cand, Criteria(ttft_p99_ms=200, itl_p99_ms=20, min_tokens_per_s=250))
    assert by_name(report) == {
        "ttft_p99_ms <= 200": Outcome.PASS,
        "itl_p99_ms <= 20": Outcome.FAIL,
        "tokens_per_s >= 250": Outcome.FAIL,
    }
    rows = {r.name: r for r in report.results}
    assert rows["ttft_p99_ms <= 200"].measured == "180.00 ms"
    assert rows["itl_p99_ms <= 20"].detail == "ITL p99 22.00 ms above the 20 ms limit"
    assert rows["tokens_per_s >= 250"].limit == ">= 250 tok/s"
    assert rows["tokens_per_s >= 250"].measured == "240.0 tok/s"


def test_token_criteria_alone_are_something_to_gate_on() -> None:
    cand = streamed(ttft=180, itl=22, tokens_per_s=240, n=1, noise=0.0, seed=1)
    assert evaluate(cand, Criteria(ttft_p99_ms=500)).passed


def test_token_criteria_on_a_result_without_streams_say_what_to_gate() -> None:
    plain = planted(500, 20, n=3, noise=0.01, seed=1, label="resnet.json")
    with pytest.raises(InputError, match=r"resnet.json measured no token streams.*--protocol"):
        evaluate(plain, Criteria(itl_p99_ms=20))


def test_token_regressions_are_judged_with_significance_like_requests() -> None:
    base = streamed(ttft=100, itl=10, tokens_per_s=300, n=8, noise=0.02, seed=1, label="b")
    # Slower prefill (TTFT +40 %) is a significant regression; ITL within tolerance; tokens/s
    # 20 % lower is one too.
    cand = streamed(ttft=140, itl=10.2, tokens_per_s=240, n=8, noise=0.02, seed=2, label="c")
    report = evaluate(cand, Criteria(max_regression=0.05), baseline=base)
    verdicts = by_name(report)
    assert verdicts["ttft_p99_ms regression <= 5%"] is Outcome.FAIL
    assert verdicts["itl_p99_ms regression <= 5%"] is Outcome.PASS
    assert verdicts["tokens_per_s regression <= 5%"] is Outcome.FAIL
    # The request figures are judged as always, beside the token ones.
    assert {"throughput_rps regression <= 5%", "p99_ms regression <= 5%"} <= set(verdicts)
    rows = {r.name: r for r in report.results}
    assert rows["tokens_per_s regression <= 5%"].baseline.endswith("tok/s")


def test_one_token_sample_a_side_is_never_a_significant_regression() -> None:
    base = streamed(ttft=100, itl=10, tokens_per_s=300, n=1, noise=0.0, seed=1)
    cand = streamed(ttft=200, itl=10, tokens_per_s=300, n=1, noise=0.0, seed=2)
    report = evaluate(cand, Criteria(max_regression=0.05), baseline=base)
    assert by_name(report)["ttft_p99_ms regression <= 5%"] is Outcome.NOT_SIGNIFICANT


def test_a_streamed_result_and_one_without_streams_do_not_compare() -> None:
    base = planted(4, 900, n=3, noise=0.01, seed=1)
    cand = streamed(ttft=100, itl=10, tokens_per_s=300, n=3, noise=0.01, seed=2)
    assert incompatibilities(cand, base) == [
        "only the candidate measured token streams (a generative model)"
    ]
    with pytest.raises(InputError, match="only the candidate measured token streams"):
        evaluate(cand, Criteria(max_regression=0.05), baseline=base)


@pytest.mark.parametrize(
    "kwargs", [{"ttft_p99_ms": 0}, {"itl_p99_ms": -1.0}, {"min_tokens_per_s": -5.0}]
)
def test_token_criteria_validation(kwargs: dict[str, float]) -> None:
    with pytest.raises(InputError, match="--"):
        Criteria(**kwargs)
