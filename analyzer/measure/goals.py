"""Judging one measurement: stability, whether the generator kept up, slacks against the goals.

perf_analyzer's stability rule (:func:`is_stable`), the generator's own limits
(:func:`generator_problems`), and the goal checks the sweep, the evaluator and the gate share:
:func:`meets_goals`, the slacks (overall, per class, p99 and errors), the sequential verdict.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from analyzer.measure.arrivals import ArrivalProcess
from analyzer.measure.measurement import Measurement, WindowStats
from analyzer.measure.specs import Goals, LoadMode
from analyzer.measure.stepping import StepVerdict


def is_stable(windows: Sequence[WindowStats], stability_pct: float = 10.0, needed: int = 3) -> bool:
    """perf_analyzer's rule: the last ``needed`` windows agree on throughput and p99.

    Agreement means max/min <= 1 + stability_pct/100 for both; a window with no completed request
    (zero throughput) is never stable.

    Generative windows (token figures measured) agree on throughput and ITL p99, over the
    window's tokens: their end-to-end p99 is the longest outputs' length, not a latency of the
    server. (At a few requests a second a short window's throughput is a Poisson count of a
    dozen arrivals, which no rule can call stable within 10 %: such levels want longer
    windows.)
    """
    if len(windows) < needed:
        return False
    last = windows[-needed:]
    limit = 1.0 + stability_pct / 100.0
    tokens = all(w.itl_p99_ms is not None for w in last)
    latency = [(w.itl_p99_ms or 0.0) if tokens else w.p99_ms for w in last]
    for values in ([w.throughput_rps for w in last], latency):
        low, high = min(values), max(values)
        if low <= 0 or high / low > limit:
            return False
    return True


@dataclass(frozen=True)
class GeneratorLimits:
    """Above these the generator, not the server, decided a measurement (it is then invalid)."""

    #: Busiest generator process's CPU over a window, percent of one core.
    max_cpu_pct: float = 90.0
    #: A request sent later than this after its intended time counts as late.
    max_send_lag_ms: float = 10.0
    #: Late requests tolerated: this fraction of those sent (and always at least 2).
    max_late_fraction: float = 0.01
    #: Open loop: requests offered must reach this fraction of the schedule (beyond Poisson noise).
    min_offered_ratio: float = 0.95


def generator_problems(
    limits: GeneratorLimits,
    open_loop: bool,
    cpu_pct: float,
    sent: int,
    late: int,
    expected_sent: float,
    arrival: ArrivalProcess,
) -> list[str]:
    """Why a measurement is invalid (empty when the generator kept up).

    Args:
        limits: the thresholds.
        open_loop: request-rate mode (lag and offered-rate rules apply only there).
        cpu_pct: busiest generator process's CPU, percent of one core.
        sent: requests dispatched in the measured windows.
        late: how many of them left more than ``limits.max_send_lag_ms`` after their intended time.
        expected_sent: requests the schedule asked for in those windows (0: skip that rule).
        arrival: the schedule's process: how much its count in a window varies (Poisson by
            sqrt(n), gamma by cv * sqrt(n)); a shape whose count swings with its bursts or its
            period (mmpp, ramp, diurnal, a trace) skips the offered-count rule, and the lag
            rule alone tells a generator that falls behind.
    """
    problems = []
    if cpu_pct > limits.max_cpu_pct:
        problems.append(f"generator CPU {cpu_pct:.0f}% of a core > {limits.max_cpu_pct:g}%")
    if not open_loop:
        return problems
    # One OS scheduling hiccup on a busy machine is not saturation: with few samples p99 is the
    # maximum, so the rule counts late requests rather than reading the lag's p99.
    if late > max(limits.max_late_fraction * sent, 2):
        problems.append(f"{late} of {sent} requests sent over {limits.max_send_lag_ms:g} ms late")
    dispersion = arrival.count_dispersion
    if (
        expected_sent > 0
        and dispersion is not None
        and short_beyond_noise(sent, expected_sent, limits.min_offered_ratio, dispersion)
    ):
        problems.append(f"offered {sent} requests where the schedule asked for {expected_sent:.0f}")
    return problems


def short_beyond_noise(count: float, expected: float, ratio: float, dispersion: float) -> bool:
    """Whether ``count`` fell short of ``expected`` by more than chance: below ``ratio`` of it
    and beyond three sigmas of a count whose variance is ``dispersion x expected`` (Poisson:
    1; a deterministic count, 0: two of slack)."""
    if dispersion == 0:
        slack = (1 - ratio) * expected + 2
    else:
        slack = max((1 - ratio) * expected, 3 * math.sqrt(dispersion * expected))
    return count < expected - slack


def unusable(m: Measurement) -> str | None:
    """Why ``m`` cannot be judged against any goal (None when it can).

    A measurement in which nothing completed, or whose generator was saturated (``valid`` is
    False), describes the load generator, not the server.
    """
    if m.request_count == 0:
        return "no request completed"
    if not m.valid:
        return "invalid measurement (generator saturated)"
    return None


#: An open-loop generative level must complete this share of the requests it sent (beyond
#: Poisson noise): :func:`falls_behind`.
MIN_COMPLETED_RATIO = 0.9


def falls_behind(m: Measurement) -> str | None:
    """Why an open-loop generative level did not keep up with its offered rate (None if it did).

    A generative request lasts seconds, and an engine that batches per iteration admits the
    requests it cannot serve into a running set that keeps growing (or a queue): the level's
    latencies are of the streams that finished, the early ones, so an overloaded level of a
    few seconds reads like a feasible one while it completes half of what it was sent. At a
    steady state completions match sends; here fewer than ``MIN_COMPLETED_RATIO`` of them, and
    fewer than three sigmas below, means the level is not one.

    The sigma is that of a steady state's shortfall: completions in a span are the sends of the
    span shifted by a request's lifetime ``L`` (the level's mean end-to-end time), so they fall
    short of the sends by the change of the in-flight count, whose variance is ``2 R min(T, L)``
    at rate ``R`` over a span ``T`` (the arrivals of two lifetimes, overlapping when ``T < L``),
    not the ``R T`` of a Poisson count: on a level of several lifetimes an engine that does not
    keep up shows, on a short one the noise is as large as ever.
    """
    if m.tokens is None or m.mode is not LoadMode.REQUEST_RATE or m.duration_s <= 0:
        return None
    sent = m.offered_rps * m.duration_s
    lifetime_s = m.mean_ms / 1000.0
    dispersion = 2 * min(m.duration_s, lifetime_s) / m.duration_s if lifetime_s > 0 else 1.0
    if sent <= 0 or not short_beyond_noise(m.request_count, sent, MIN_COMPLETED_RATIO, dispersion):
        return None
    done = m.request_count / m.duration_s
    return (
        f"completed {done:.1f} of the {m.offered_rps:.1f} req/s sent: the engine does not keep "
        "up (its running set grows; the finished streams understate TTFT and ITL)"
    )


def goals_met(problem: str | None, slacks: Mapping[str, float]) -> bool:
    """The one rule behind every "meets the goals" in perfsweep.

    A result meets the goals when the measurement it rests on is usable (``problem`` is None,
    see :func:`unusable`) and every slack is satisfied (<= 0). :func:`meets_goals` (one load
    level) and the sweep's trial records (``TrialRecord.meets_goals``, whatever the objective)
    both apply it.
    """
    return problem is None and all(v <= 0 for v in slacks.values())


def goal_slacks(p99_ms: float, error_rate: float, goals: Goals) -> dict[str, float]:
    """Continuous slacks of one level against ``goals`` (<= 0: satisfied; an infinite p99
    goal, token goals alone, is met by any p99)."""
    return {
        "p99_slack": _relative(p99_ms, goals.p99_ms),
        "err_slack": error_rate - goals.max_error_rate,
    }


def _relative(value: float, goal: float) -> float:
    return (value - goal) / goal if math.isfinite(goal) else -1.0


def token_slacks(m: Measurement, goals: Goals) -> dict[str, float]:
    """A generative level's slacks against the TTFT and ITL goals (<= 0: satisfied); a level
    without token streams misses them (slack 1). Empty without token goals."""
    out: dict[str, float] = {}
    for key, goal, value in (
        ("ttft_slack", goals.ttft_p99_ms, m.tokens.ttft_p99_ms if m.tokens else None),
        ("itl_slack", goals.itl_p99_ms, m.tokens.itl_p99_ms if m.tokens else None),
    ):
        if goal is not None:
            out[key] = _relative(value, goal) if value is not None else 1.0
    return out


def _token_text(m: Measurement, goals: Goals) -> str:
    """``, TTFT p99 120.00 ms, ITL p99 9.50 ms`` for a level with token goals (else "")."""
    if not goals.token_goals or m.tokens is None:
        return ""
    return f", TTFT p99 {m.tokens.ttft_p99_ms:.2f} ms, ITL p99 {m.tokens.itl_p99_ms:.2f} ms"


def meets_goals(m: Measurement, goals: Goals) -> tuple[bool, str]:
    """Whether a measurement meets ``goals``, and a one-line reason either way.

    An invalid measurement (saturated generator) never meets a goal: its numbers describe the
    generator, not the server. The verdict is :func:`goals_met` on :func:`unusable` and
    :func:`goal_slacks`; a level stopped early (capacity search) is unusable too, and so is an
    open-loop generative level that completed well under what it sent (:func:`falls_behind`).

    A sequential step (``m.step``, its goal that of ``goals``) is judged on the latency goal by
    its test, not by its point p99: PASS meets it, FAIL misses it. BOUNDARY (undecided at its
    cap) is judged on its point p99, as a fixed-window level is: an undecided test may mean "near
    the goal" (the request cap reached) but also "too few effective samples" (the window cap
    reached under heavy autocorrelation), and a p99 of twice the goal must not pass for want of
    evidence. A BOUNDARY step whose point p99 meets the goal meets it *at the boundary*.
    The error-rate goal and usability apply as for any level.

    With traffic classes (``m.classes``) a level meets the goals only when every class meets
    its own p99 goal (:meth:`Goals.class_p99_ms`) and the error budget on its own requests
    (:func:`class_slacks`). The sequential test stays on the overall p99 against
    ``goals.p99_ms`` (one test per step): FAIL misses the goals, while PASS and BOUNDARY are
    then judged class by class on the classes' point p99s.
    """
    problem = unusable(m)
    if problem is None and m.stopped_early is not None:
        problem = f"stopped early: {m.stopped_early}"
    if problem is None:
        problem = falls_behind(m)
    step = sequential_verdict(m, goals)
    per_class = class_slacks(m, goals)
    if per_class:
        return _meets_class_goals(m, goals, problem, step, per_class)
    if step is not None:
        slacks = {**goal_slacks(m.p99_ms, m.error_rate, goals), "p99_slack": p99_slack(m, goals)}
        if goals_met(problem, slacks):
            where = "at the boundary of" if step is StepVerdict.BOUNDARY else "meets"
            return True, (
                f"p99 {m.p99_ms:.2f} ms {where} the goal {goals.p99_ms:g} ms (sequential test: "
                f"{step.value}), error rate {m.error_rate:.2%}"
            )
        if problem is not None:
            return False, problem
        if step is StepVerdict.FAIL:
            return False, (
                f"p99 {m.p99_ms:.2f} ms over the goal {goals.p99_ms:g} ms (sequential test: fail)"
            )
        if m.p99_ms > goals.p99_ms:
            return False, (
                f"p99 {m.p99_ms:.2f} ms > goal {goals.p99_ms:g} ms (sequential test undecided at "
                "its cap: judged on the point p99)"
            )
        return False, f"error rate {m.error_rate:.2%} > goal {goals.max_error_rate:.2%}"
    tokens = token_slacks(m, goals)
    if goals_met(problem, {**goal_slacks(m.p99_ms, m.error_rate, goals), **tokens}):
        if not tokens:
            return True, (
                f"p99 {m.p99_ms:.2f} ms <= {goals.p99_ms:g} ms, error rate {m.error_rate:.2%}"
            )
        return True, (
            f"p99 {m.p99_ms:.2f} ms{_token_text(m, goals)} within {goals.describe()}, "
            f"error rate {m.error_rate:.2%}"
        )
    if problem is not None:
        return False, problem
    if tokens and m.tokens is None:
        return False, "TTFT/ITL goals need a token stream; this level measured none"
    for key, name, goal in (
        ("ttft_slack", "TTFT", goals.ttft_p99_ms),
        ("itl_slack", "ITL", goals.itl_p99_ms),
    ):
        if tokens.get(key, 0.0) > 0 and m.tokens is not None:
            value = m.tokens.ttft_p99_ms if key == "ttft_slack" else m.tokens.itl_p99_ms
            return False, f"{name} p99 {value:.2f} ms > goal {goal:g} ms"
    if m.p99_ms > goals.p99_ms:
        return False, f"p99 {m.p99_ms:.2f} ms > goal {goals.p99_ms:g} ms"
    return False, f"error rate {m.error_rate:.2%} > goal {goals.max_error_rate:.2%}"


def _meets_class_goals(
    m: Measurement,
    goals: Goals,
    problem: str | None,
    step: StepVerdict | None,
    per_class: Mapping[str, Mapping[str, float]],
) -> tuple[bool, str]:
    """:func:`meets_goals` of a level with traffic classes."""
    slacks = {"p99_slack": p99_slack(m, goals), "err_slack": error_slack(m, goals)}
    test = f" (sequential test on the overall p99: {step.value})" if step is not None else ""
    if goals_met(problem, slacks):
        where = "at the boundary of" if step is StepVerdict.BOUNDARY else "meets"
        parts = ", ".join(
            f"{c.name} p99 {c.p99_ms:.2f} ms <= {goals.class_p99_ms(c.name):g} ms"
            for c in m.classes
            if c.request_count
        )
        return True, f"every class {where} its goal: {parts}{test}"
    if problem is not None:
        return False, problem
    if step is StepVerdict.FAIL:
        return False, (
            f"p99 {m.p99_ms:.2f} ms over the goal {goals.p99_ms:g} ms (sequential test: fail)"
        )
    by_name = {c.name: c for c in m.classes}
    name, worst = max(per_class.items(), key=lambda kv: kv[1]["p99_slack"])
    if worst["p99_slack"] > 0:
        c = by_name[name]
        return False, (
            f"class {name}: p99 {c.p99_ms:.2f} ms > goal {goals.class_p99_ms(name):g} ms{test}"
        )
    name, worst = max(per_class.items(), key=lambda kv: kv[1]["err_slack"])
    c = by_name[name]
    return False, (
        f"class {name}: error rate {c.error_rate:.2%} > goal {goals.max_error_rate:.2%}"
        f" ({c.error_count} of {c.request_count} failed)"
    )


def class_slacks(m: Measurement, goals: Goals) -> dict[str, dict[str, float]]:
    """Per traffic class that got requests: its ``p99_slack`` against its own goal and its
    ``err_slack`` against the error budget (<= 0: satisfied). Empty without classes."""
    out: dict[str, dict[str, float]] = {}
    for c in m.classes:
        if c.request_count:
            goal = goals.class_p99_ms(c.name)
            out[c.name] = {
                "p99_slack": (c.p99_ms - goal) / goal,
                "err_slack": c.error_rate - goals.max_error_rate,
            }
    return out


def error_slack(m: Measurement, goals: Goals) -> float:
    """``error rate - allowed rate`` of one level: the worst class's with traffic classes (a
    class the server refuses fails however small its share), else the level's."""
    overall = m.error_rate - goals.max_error_rate
    per_class = class_slacks(m, goals)
    return max([overall, *(s["err_slack"] for s in per_class.values())])


def classes_text(m: Measurement, goals: Goals | None) -> str:
    """One line of ``m``'s traffic classes for the console: each class's p99 against its own
    goal (no goal: the p99 and its requests), and its errors when it had any (``""`` without
    classes)::

        urgent p99 9.0/12.5 ms, bulk p99 22.0/25 ms (40 errors, 5.0%)
        a p99 9.0 ms of 1200, b p99 22.0 ms of 400
    """
    parts = []
    for c in m.classes:
        if goals is None:
            text = f"{c.name} p99 {c.p99_ms:.1f} ms of {c.request_count}"
        else:
            text = f"{c.name} p99 {c.p99_ms:.1f}/{goals.class_p99_ms(c.name):g} ms"
        if c.error_count:
            text += f" ({c.error_count} errors, {c.error_rate:.1%})"
        parts.append(text)
    return ", ".join(parts)


#: A sequential FAIL whose point p99 is not above the goal still gets this (tiny) positive slack.
FAIL_SLACK_FLOOR = 1e-6


def p99_slack(m: Measurement, goals: Goals) -> float:
    """``(p99 - goal) / goal`` of one level, with a sequential step's verdict over its point p99.

    PASS gives at most 0, FAIL at least ``FAIL_SLACK_FLOOR``, BOUNDARY (undecided) its point
    p99's slack, as a fixed-window level. Anything that turns a trial's operating point into a p99 slack (the
    sweep's constraints) should use this, so it agrees with :func:`meets_goals`.

    With traffic classes it is the worst class's slack against its own goal
    (:func:`class_slacks`); the sequential test is of the overall p99, so FAIL still gives at
    least ``FAIL_SLACK_FLOOR``, while PASS and BOUNDARY leave the classes' point slacks.
    """
    verdict = sequential_verdict(m, goals)
    per_class = class_slacks(m, goals)
    if per_class:
        worst = max(s["p99_slack"] for s in per_class.values())
        return max(worst, FAIL_SLACK_FLOOR) if verdict is StepVerdict.FAIL else worst
    raw = _relative(m.p99_ms, goals.p99_ms)
    if verdict is None:
        return raw
    if verdict is StepVerdict.FAIL:
        return max(raw, FAIL_SLACK_FLOOR)
    if verdict is StepVerdict.BOUNDARY:
        return raw
    return min(raw, 0.0)


def sequential_verdict(m: Measurement, goals: Goals) -> StepVerdict | None:
    """The final verdict of ``m``'s sequential test when it tested ``goals.p99_ms`` at p99.

    None when ``m`` was not a sequential step, its test was about another goal or quantile (a
    record judged against other goals is judged on its p99), or it has no final verdict.
    """
    step = m.step
    if step is None or not step.verdict.final or step.goal_ms != goals.p99_ms:
        return None
    if not math.isclose(step.target_share, 0.01, rel_tol=1e-9):
        return None
    return step.verdict


def clearly_fails(
    latency_p90_ms: float,
    request_count: int,
    error_count: int,
    in_flight: int,
    goals: Goals,
    in_flight_bound: int,
    min_requests: int = 50,
    *,
    latency_rule: bool = True,
    ttft_p90_ms: float | None = None,
) -> str | None:
    """Whether a level in progress has already failed its goals, so it can stop early.

    Returns the reason, or None to keep measuring. Used by capacity search so an overloaded step
    ends quickly (and leaves less backlog for the next step to inherit). "Clearly" means
    systematic: the backlog passed its bound, or at least 10 % of the requests so far (p90) are
    beyond the p99 goal. A p99 over the goal alone is not enough, since with a few hundred
    samples it is one or two outliers (a machine hiccup), which the full level may absorb.

    A generative level (``ttft_p90_ms``: its time to first token so far) fails the same way
    when 10 % of its first tokens came later than the TTFT goal.

    ``latency_rule=False`` (a sequential step) leaves out the p90 rule: the step's sequential
    test owns the latency verdict (and, unlike a p90 over 50 requests, accounts for a burst
    putting many consecutive requests over the goal); the backlog and error-rate guards stay.
    """
    if in_flight > in_flight_bound:
        return f"{in_flight} requests in flight > bound {in_flight_bound}"
    if request_count >= min_requests:
        if latency_rule and latency_p90_ms > goals.p99_ms:
            return f"p90 {latency_p90_ms:.1f} ms already beyond the p99 goal {goals.p99_ms:g} ms"
        ttft_goal = goals.ttft_p99_ms
        if ttft_goal is not None and ttft_p90_ms is not None and ttft_p90_ms > ttft_goal:
            return (
                f"TTFT p90 {ttft_p90_ms:.1f} ms already beyond the TTFT p99 goal {ttft_goal:g} ms"
            )
        if goals.max_error_rate < 1 and error_count / request_count > max(
            goals.max_error_rate * 2, 0.05
        ):
            return f"error rate {error_count / request_count:.1%} already beyond goal"
    return None
