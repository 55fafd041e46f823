"""The gain's interval on planted brackets whose true ratio is known.

What the interval claims (``analyzer.measure.gain.gain_estimate``): the true ratio of the two
capacities lies in it with 95 % confidence, given that each capacity search only brackets its
capacity (the truth is somewhere between the highest passing and the lowest failing rate) and,
with repeats, their run-to-run spread. Each planted case draws two true capacities, brackets
each with a capacity search on a ladder of rates 20 % apart from a random start, whose every
pass/fail verdict sees the capacity with 2 % noise, as a real step does; then checks whether the
interval holds the true ratio. A winner that met the goals at every rate offered (a ceiling) is
censored: only a lower bound is known, and the gain must read as one.
"""

from __future__ import annotations

import numpy as np
import pytest

from analyzer.measure.gain import GainSample, gain_estimate, gain_sentence

CASES = 200


def bracket(capacity: float, rng: np.random.Generator, ceiling: float | None = None) -> GainSample:
    """A capacity search's result: the highest passing rate, the lowest failing one above it."""
    rate, passed = rng.uniform(5, 10), 0.0
    while True:
        if ceiling is not None and rate > ceiling:  # the generator offers no more
            return GainSample(passed, passed, passed, censored=True)
        if rate <= capacity * (1 + rng.normal(0, 0.02)):
            passed, rate = rate, rate * 1.2
        else:
            return GainSample(passed, passed, rate)


@pytest.mark.parametrize("repeats", [1, 3])
def test_the_interval_holds_the_true_ratio_in_at_least_90_percent_of_planted_cases(
    repeats: int,
) -> None:
    held = 0
    for seed in range(CASES):
        rng = np.random.default_rng(seed)
        best_capacity, base_capacity = rng.uniform(100, 1000), rng.uniform(50, 500)
        best = [bracket(best_capacity, rng) for _ in range(repeats)]
        base = [bracket(base_capacity, rng) for _ in range(repeats)]
        estimate = gain_estimate(best, base, seed=seed)
        assert estimate is not None and estimate.ci_low is not None and estimate.ci_high is not None
        assert estimate.ci_low <= estimate.gain <= estimate.ci_high
        held += estimate.ci_low <= best_capacity / base_capacity <= estimate.ci_high
    assert held / CASES >= 0.90, f"{held} of {CASES}"
    # Not a trivially wide interval: the brackets are 20 % wide, so is the ratio's about 33 %.
    assert held / CASES <= 0.999


def test_the_upper_end_is_not_the_estimate() -> None:
    # Both capacities bracketed: the truth may lie above the measured passing rates on either
    # side, so the interval reaches past the ratio of the passing rates, in both directions.
    best, base = GainSample(300, 300, 360), GainSample(100, 100, 120)
    estimate = gain_estimate([best], [base])
    assert estimate is not None and estimate.ci_low is not None and estimate.ci_high is not None
    assert estimate.ci_low < 300 / 120 * 1.05 and estimate.ci_high > 360 / 100 * 0.95
    assert estimate.ci_low < estimate.gain < estimate.ci_high


def test_a_censored_winner_gives_a_one_sided_lower_bound_that_holds() -> None:
    held = 0
    for seed in range(CASES):
        rng = np.random.default_rng(seed)
        best_capacity, base_capacity = rng.uniform(700, 2000), rng.uniform(50, 500)
        best = [bracket(best_capacity, rng, ceiling=600.0)]
        base = [bracket(base_capacity, rng)]
        assert best[0].censored
        estimate = gain_estimate(best, base, seed=seed)
        assert estimate is not None and estimate.ci_high is None and estimate.ci_low is not None
        held += estimate.ci_low <= best_capacity / base_capacity
    assert held / CASES >= 0.95


def test_the_sentence_of_a_censored_winner_is_a_lower_bound() -> None:
    estimate = gain_estimate(
        [GainSample(600, 600, 600, censored=True)], [GainSample(100, 100, 120)]
    )
    assert estimate is not None and estimate.significant
    text = estimate.sentence()
    assert text.startswith(f"gain over baseline: at least {estimate.ci_low:.2f}x (")
    assert "lower bound" in text and "interval" not in text
    # Both censored: nothing bounds the ratio.
    both = gain_estimate(
        [GainSample(600, 600, 600, censored=True)], [GainSample(500, 500, 500, censored=True)]
    )
    assert both is not None and both.ci_low is None and both.ci_high is None
    assert not both.significant and "no interval" in both.sentence()
    # A bound that does not clear 1.0 says so.
    weak = gain_sentence(1.1, [0.9, None], False, [1, 1])
    assert weak.startswith("gain over baseline: at least 0.90x, not significantly different")


def test_one_repeat_advises_the_setting_that_repeats_both_sides() -> None:
    """The advice names what changes the repeats: ``budget.validation = "repeats"`` (under the
    default ``check`` validation, ``validate_repeats`` alone changes nothing), a value the
    scenario accepts, with ``validate_repeats`` at its default of at least 2."""
    from analyzer.config.scenario import load_scenario

    text = gain_sentence(2.0, [1.8, 2.2], True, [1, 1])
    assert text.endswith('set budget.validation = "repeats" (budget.validate_repeats >= 2)')
    budget = load_scenario(None, {"budget.validation": "repeats"}, env={}).budget
    assert budget.validation == "repeats" and budget.validate_repeats >= 2
    assert "set budget" not in gain_sentence(2.0, [1.8, 2.2], True, [2, 2])
