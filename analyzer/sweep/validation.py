"""Validation: re-measuring the best configs before one is chosen.

At the winner's capacity (``budget.validation = "check"``) or by repeats; each candidate
becomes a :class:`~analyzer.rundir.validation.ValidationCandidate` of ``summary.json``.
"""

from __future__ import annotations

import math
import random
from dataclasses import replace
from typing import Any

from analyzer.config.objective import worst_value
from analyzer.config.pipeline import config_cost
from analyzer.rundir.trial_record import TrialRecord
from analyzer.rundir.validation import Validation, ValidationCandidate
from analyzer.sweep.finish import gain_interval
from analyzer.sweep.state import SweepState
from analyzer.sweep.trials import run_trial


def validate_winners(state: SweepState) -> list[ValidationCandidate]:
    """Re-measure the best configs before one is chosen: at the winner's capacity
    (``budget.validation = "check"``, a capacity objective in open loop:
    :func:`_validate_at_capacity`), else every top config ``budget.validate_repeats`` times
    with longer windows."""
    objective = state.objective
    if not objective.validates or state.scenario.budget.validate_top == 0:
        return []
    check = state.scenario.budget.validation == "check"
    if check and objective.checks_at_capacity and state.evaluator.plan.open_loop:
        return _validate_at_capacity(state)
    return _validate_repeats(state)


def _validate_at_capacity(state: SweepState) -> list[ValidationCandidate]:
    """Validation proportionate to the doubt: a capacity is re-measured only where the choice
    depends on it.

    * A tie decided by cost. When the runner-up is tied with the winner in the search (within
      the capacity search's resolution) and the tie rule (:meth:`Objective.choose`) prefers it
      (the cheaper config), the choice rests on one question: does it hold the winner's rate,
      within the resolution that defines a tie? It gets one sequential check there, at the
      winner's capacity less the resolution (:meth:`Evaluator.check`, longer windows). It held:
      it is the choice, and nothing else is measured. Its headline is the rate it held, measured
      again, not a search figure (the winner's curse: the best of several noisy searches reads
      high). It missed: the steps below.
    * Otherwise each candidate is checked once. The winner (alone when it is the one feasible
      config, or ``budget.validate_top`` is 1) at its capacity less the resolution: the search's
      best reads high (the winner's curse), so a check at the search figure itself misses by
      noise about half the time, and the resolution is what the search claims. The runner-up
      at the winner's capacity: does it beat the winner's search figure? A step far from the
      goal ends after a few hundred requests. Whole capacities are re-measured (a capacity
      search near each) only when the two are within noise: the runner-up serves the winner's
      capacity (it may have missed the search's best by luck), or the winner does not hold its
      own less the resolution (its search capacity was luck).

    The baseline is measured once (its baseline measurement); it competes only when its capacity
    beat the winner's in the search. The gain's interval rests on these measurements: each
    side's capacity within its search bracket, and a check's rate as its lower end.

    Nothing is measured when no outcome could change the recommendation
    (:func:`_choice_is_settled`): the winner's search figure is not significantly better than
    the baseline's, so the model's own config is recommended whatever a check reads.
    """
    scenario, objective = state.scenario, state.objective
    b = scenario.budget
    feasible = [r for r in state.results.values() if r.state == "complete" and r.meets_goals]
    top = objective.validation_candidates(feasible, min(b.validate_top, 2))
    top = with_cheapest_tie(top, feasible, b.capacity_resolution)
    if not top:
        return []
    winner = top[0]
    if (settled := _choice_is_settled(state, winner)) is not None:
        state.note(settled)
        return []
    rate = winner.throughput_rps

    def measure(r: TrialRecord, index: int, total: int, **how: Any) -> TrialRecord:
        state.observer.on_trial_start(r.number, "validation", r.config, index, total)
        result = run_trial(
            state,
            r.number,
            "validation",
            r.config,
            state.tuned.configs(r.config),
            factor=b.validate_window_factor,
            **how,
        )
        state.observer.on_validation(r.number, index, result, how.get("check_rps"))
        return result

    checks: dict[int, TrialRecord] = {}
    resolution = b.capacity_resolution
    # The winner's capacity less the resolution: what a tie, or the winner itself, must hold.
    edge = (1.0 - resolution) * rate
    check_rps = {r.number: rate for r in top} | {winner.number: edge}
    if (tie := _tie_by_cost(state, top)) is not None:
        tie_record, why = tie
        check_rps[tie_record.number] = edge
        checks[tie_record.number] = measure(tie_record, 1, 1, check_rps=edge)
        if checks[tie_record.number].meets_goals:
            held = (
                f"held {edge:.1f} req/s (trial {winner.number}'s {rate:.1f} req/s less the "
                f"capacity search's resolution, {resolution:.0%})"
            )
            state.observer.on_phase(
                f"trial {tie_record.number} {held}: the tie is decided by cost, no capacity "
                "re-measured"
            )
            state.tie_break = (
                f"{why} Validation: it {held} in one check, so no capacity was re-measured."
            )
            top = [tie_record]
    for r in top:
        if r.number not in checks:
            checks[r.number] = measure(r, 1, 2, check_rps=check_rps[r.number])
    winner_held = winner.number not in [r.number for r in top] or checks[winner.number].meets_goals
    # A runner-up whose check did not complete is not known to be slower: within noise too.
    close = [
        r for r in top[1:] if checks[r.number].state != "complete" or checks[r.number].meets_goals
    ]
    remeasured: dict[int, list[TrialRecord]] = {}
    if close or not winner_held:
        state.observer.on_phase("within noise: re-measuring the whole capacities")
        for r in top:
            # A failed check bounds the re-measurement: it need not climb past that rate again.
            failed = checks[r.number].state == "complete" and not checks[r.number].meets_goals
            fails_at = check_rps[r.number] if failed else None
            remeasured[r.number] = [
                measure(r, 2, 2, near_rps=r.throughput_rps, fails_at_rps=fails_at)
            ]
    candidates = []
    for r in top:
        check = checks[r.number]
        # The check is the one repeat, unless the whole capacity was measured again: that
        # measurement then says what the config serves, and the check is kept beside it.
        runs = remeasured.get(r.number, [check])
        state.validated[r.number] = runs
        candidates.append(
            replace(
                _candidate(r, runs),
                check_rps=check_rps[r.number],
                check_met=check.meets_goals if check.state == "complete" else None,
                check=check.measurement,
            )
        )
    baseline = state.baseline
    if baseline is not None and baseline.meets_goals and baseline.throughput_rps > rate:
        # The starting config competes too (its one measurement): a sweep must never recommend
        # a config worse than what the model already had.
        state.validated.setdefault(baseline.number, []).append(baseline)
        candidates.append(_candidate(baseline, [baseline]))
    state.run_dir.write_validation(Validation(tuple(candidates)))
    return candidates


def _choice_is_settled(state: SweepState, winner: TrialRecord) -> str | None:
    """Why validating cannot change the recommendation, or None when it can.

    The recommendation is the model's own config unless the chosen config's gain over the
    baseline is significant (:func:`analyzer.sweep.finish._recommend`). A check can only lower
    the winner's figure (to the rate it held) and its runner-up's cannot raise it, so when the
    interval from the two searches' brackets already contains 1.0 no check makes the winner
    recommended: re-measuring would only chase a lucky reading. (An interval wholly below 1.0 is
    not settled here, nor one where the baseline leads: validation puts it among the candidates.)
    """
    objective, baseline = state.objective, state.baseline
    if baseline is None or not baseline.meets_goals or not objective.has_gain(baseline, winner):
        return None
    if objective.gain(objective.value(baseline), objective.value(winner)) < 1.0:
        return None  # the baseline leads: validation makes it a candidate, so it can be chosen
    estimate = gain_interval(state, winner, baseline)  # nothing validated yet: the searches'
    if estimate is None or estimate.ci_low is None or estimate.ci_high is None:
        return None
    if not estimate.ci_low <= 1.0 <= estimate.ci_high:
        return None
    return (
        f"validation not needed: trial {winner.number} is not significantly better than the "
        f"baseline in the search ({estimate.gain:.2f}x, 95% interval {estimate.ci_low:.2f}-"
        f"{estimate.ci_high:.2f}x over the two capacity brackets), so the model's own config is "
        "the recommendation whatever a re-measurement reads; its figures are the search's"
    )


def _tie_by_cost(state: SweepState, top: list[TrialRecord]) -> tuple[TrialRecord, str] | None:
    """The runner-up the tie rule would choose over the winner on the search's numbers (tied
    within the capacity search's resolution, and cheaper), with the rule's sentence; None when
    the winner would stay the choice or there is no runner-up."""
    if len(top) < 2:
        return None
    winner = top[0]
    resolution = state.scenario.budget.capacity_resolution
    floor = (1.0 - resolution) * winner.throughput_rps
    for r in top[1:]:
        if r.throughput_rps < floor:
            continue
        chosen, why = state.objective.choose(
            [_candidate(winner, [winner]), _candidate(r, [r])], resolution
        )
        if chosen.trial_number == r.number and why is not None:
            return r, why
    return None


def with_cheapest_tie(
    top: list[TrialRecord], feasible: list[TrialRecord], resolution: float
) -> list[TrialRecord]:
    """``top`` with the cheapest config tied with the best in the search in place of its last
    runner-up, when that config is cheaper than every one of them.

    Capacities within the search's ``resolution`` of the best cannot be told apart, and among
    tied configs the cheapest wins (:func:`~analyzer.config.objective.prefer_lighter`); the
    choice is made among validated configs only, so the cheapest tie must be validated. A
    single validated config (``validate_top`` 1) is kept as it is.
    """
    if len(top) < 2:
        return top
    floor = (1.0 - resolution) * top[0].throughput_rps
    tied = [r for r in feasible if r.throughput_rps >= floor]
    cheapest = min(tied, key=lambda r: (config_cost(r.config), -r.throughput_rps))
    if config_cost(cheapest.config) >= min(config_cost(t.config) for t in top):
        return top
    return [*top[:-1], cheapest]


def _candidate(r: TrialRecord, runs: list[TrialRecord]) -> ValidationCandidate:
    """A validated config: every repeat's numbers and the one repeat rule's worst case."""
    ok = [x for x in runs if x.state == "complete"]
    # The one repeat rule (Objective.repeat_figure): the worst repeat, a repeat that missed
    # the goals counting as 0 req/s.
    worst_rps = (
        worst_value("throughput_rps", [x.throughput_rps if x.meets_goals else 0.0 for x in ok])
        if ok
        else 0.0
    )
    worst_p99 = worst_value("p99_ms", [x.p99_ms for x in ok]) if ok else math.inf
    return ValidationCandidate(
        trial_number=r.number,
        config=r.config,
        search_throughput_rps=r.throughput_rps,
        throughput_rps=tuple(x.throughput_rps for x in runs),
        p99_ms=tuple(x.p99_ms for x in runs),
        meets_goals=tuple(x.meets_goals for x in runs),
        worst_rps=worst_rps,
        worst_p99_ms=worst_p99 if math.isfinite(worst_p99) else None,
        all_meet_goals=bool(ok) and len(ok) == len(runs) and all(x.meets_goals for x in ok),
        p99_n=tuple(x.request_count() for x in runs),
        measurements=tuple(x.measurement for x in runs),
    )


def _validate_repeats(state: SweepState) -> list[ValidationCandidate]:
    """Re-measure the top feasible configs with longer windows; keep every repeat's numbers."""
    scenario, objective = state.scenario, state.objective
    b = scenario.budget
    feasible = [r for r in state.results.values() if r.state == "complete" and r.meets_goals]
    top = objective.validation_candidates(feasible, b.validate_top)
    if objective.capacity:
        top = with_cheapest_tie(top, feasible, b.capacity_resolution)
    baseline = state.baseline
    if top and baseline and baseline.meets_goals and baseline.config not in [t.config for t in top]:
        # The starting config competes too: a sweep must never recommend a config that is
        # worse than what the model already had, just because one search measurement was lucky.
        top.append(baseline)
    order = [(r, i) for i in range(b.validate_repeats) for r in top]
    random.Random(scenario.run.seed).shuffle(order)  # interleaved: drift hits all alike
    repeats: dict[int, list[TrialRecord]] = {r.number: [] for r in top}
    for r, i in order:
        state.observer.on_trial_start(r.number, "validation", r.config, i + 1, b.validate_repeats)
        configs = state.tuned.originals() if r.number < 0 else state.tuned.configs(r.config)
        result = run_trial(
            state,
            r.number,
            "validation",
            r.config,
            configs,
            factor=b.validate_window_factor,
            near_rps=r.throughput_rps,
        )
        repeats[r.number].append(result)
        state.validated.setdefault(r.number, []).append(result)
        state.observer.on_validation(r.number, i + 1, result)
    candidates = [_candidate(r, repeats[r.number]) for r in top]
    state.run_dir.write_validation(Validation(tuple(candidates)))
    return candidates
