"""What "better" means: one class per objective, asked by the sweep, the search, the report and
the gate alike.

Like Optuna's samplers (one ABC, one class per algorithm), each objective is an
:class:`Objective`; :func:`objective_for` turns the scenario's ``objective`` name into one::

    Objective                   metric          measures                  answer
    ├── ThroughputObjective     throughput_rps  capacity search           one winner
    ├── LatencyObjective        p99_ms          one fixed level           one winner
    └── ParetoObjective         throughput_rps  capacity + fixed level    a front (multi)

Each objective owns what a trial's values are, the Optuna directions (names only: optuna stays
in ``analyzer.search.study``), the throughput the slack asks for, how the best of completed trials
is chosen, which candidates are validated and how the winner is picked after validation, the one
rule that turns a validated config's repeats into its headline figure, the gain and the
headline. Nothing outside this module branches on the objective's name.

No optuna, gevent or I/O here: everything is pure and tested in milliseconds.
"""

from __future__ import annotations

import abc
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Protocol, TypeVar

from analyzer.config.pipeline import config_cost
from analyzer.config.traffic import TrafficMode
from analyzer.errors import InputError
from analyzer.measure.gain import GainSample
from analyzer.measure.measurement import gentlest
from analyzer.measure.specs import LoadMode

if TYPE_CHECKING:  # annotations only: the records are what the objective reads
    from analyzer.rundir.measurements import TrialMeasurement
    from analyzer.rundir.validation import ValidationCandidate

__all__ = [
    "OBJECTIVES",
    "Direction",
    "LatencyObjective",
    "Objective",
    "ParetoObjective",
    "ThroughputObjective",
    "UnknownObjectiveError",
    "gentlest",
    "objective_for",
    "prefer_lighter",
    "worst_value",
]

Direction = Literal["maximize", "minimize"]


class UnknownObjectiveError(InputError):
    """The scenario names an objective that does not exist (the message lists the valid ones)."""


class Result(Protocol):
    """What the objective reads from a trial (``analyzer.rundir.trial_record.TrialRecord`` is one)."""

    @property
    def number(self) -> int: ...

    @property
    def state(self) -> str: ...

    @property
    def throughput_rps(self) -> float: ...

    @property
    def p99_ms(self) -> float: ...

    @property
    def meets_goals(self) -> bool: ...

    @property
    def measurement(self) -> TrialMeasurement | None: ...


#: The summary.json ``validation`` key holding each metric's :meth:`Objective.repeat_figure`.
_WORST_KEY = {"throughput_rps": "worst_rps", "p99_ms": "worst_p99_ms"}

R = TypeVar("R", bound=Result)
C = TypeVar("C", bound="ValidationCandidate")


#: Metrics where a larger value is better (the rest: smaller is better).
HIGHER_IS_BETTER = frozenset({"throughput_rps"})


def worst_value(metric: str, values: Sequence[float]) -> float:
    """The worst of a config's repeats on ``metric`` (``throughput_rps``: the lowest; ``p99_ms``:
    the highest): :meth:`Objective.repeat_figure` for any metric, e.g. the p99 beside a
    throughput winner's headline.

    Raises:
        ValueError: ``values`` is empty.
    """
    if not values:
        raise ValueError("no repeats to reduce")
    return min(values) if metric in HIGHER_IS_BETTER else max(values)


def _metric_of(point: Mapping[str, Any] | object, metric: str) -> float:
    value = point.get(metric) if isinstance(point, Mapping) else getattr(point, metric, None)
    if value is None:
        raise KeyError(f"{metric!r} is not recorded in {point!r}")
    return float(value)


class Objective(abc.ABC):
    """What a sweep optimises, and every decision that depends on it.

    Attributes:
        name: The scenario's ``objective`` value.
        metric: The number a run ranks by and its headline shows (``throughput_rps``/``p99_ms``).
        higher_is_better: True when a larger ``metric`` is better.
        multi: True when the answer is a front of configs, not one winner.
        validates: The best configs are re-measured before one is chosen (not for a front).
        gain_label: What the gain is a ratio of (shown beside it).
        directions: One Optuna direction per trial value (names only).
        metric_names: One name per trial value (optuna-dashboard's labels).
        capacity: Each trial runs a capacity search (the highest load within the goals).
        fixed: Each trial measures one fixed load level (``traffic.rate_rps``/``concurrency``,
            or the reference level).
        checks_at_capacity: Validation measures the winner at its capacity less the
            resolution and the runner-up at the winner's capacity with the sequential test,
            and whole capacities only when the two are within noise (open loop); a runner-up
            tied and cheaper, once, alone; else every top config ``validate_repeats`` times.
    """

    name: ClassVar[str]
    metric: ClassVar[str]
    higher_is_better: ClassVar[bool]
    multi: ClassVar[bool] = False
    validates: ClassVar[bool] = True
    gain_label: ClassVar[str]
    directions: ClassVar[tuple[Direction, ...]]
    metric_names: ClassVar[tuple[str, ...]]
    capacity: ClassVar[bool]
    fixed: ClassVar[bool]
    checks_at_capacity: ClassVar[bool] = False

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self)

    def __hash__(self) -> int:
        return hash(type(self))

    # -- one point -------------------------------------------------------------------------------

    def value(self, point: Mapping[str, Any] | object) -> float:
        """Its :attr:`metric` from a mapping or an object with ``throughput_rps``/``p99_ms``."""
        return _metric_of(point, self.metric)

    def score(self, result: Result) -> float:
        """:meth:`value` of a trial, as bad as it gets when it missed the goals (a repeat that
        missed them, e.g. an invalid measurement with a low p99, is the worst case whatever
        its numbers read)."""
        if not result.meets_goals:
            return 0.0 if self.higher_is_better else math.inf
        return self.value(result)

    @abc.abstractmethod
    def values(self, numbers: Mapping[str, float]) -> tuple[float, ...]:
        """A trial's values for the study, in :attr:`directions` order, from its numbers."""

    def required_throughput(
        self,
        numbers: Mapping[str, float],
        min_throughput_rps: float,
        *,
        open_loop: bool,
        min_rate_rps: float,
    ) -> float:
        """The throughput the trial must reach to meet the goals (``throughput_slack``).

        Args:
            numbers: The trial's numbers (``throughput_rps``, ``offered_rps``).
            min_throughput_rps: The goal ``goals.min_throughput_rps``.
            open_loop: The load is a request rate (``traffic.mode = "rate"``).
            min_rate_rps: The lowest rate a capacity search tries.

        A capacity search that found nothing must at least reach the lowest rate searched, so
        its slack is positive.
        """
        if numbers["throughput_rps"] <= 0:
            return max(min_throughput_rps, min_rate_rps)
        return min_throughput_rps

    # -- choosing among trials --------------------------------------------------------------------

    def better(self, a: Result, b: Result | None) -> bool:
        """``a`` beats ``b`` on :attr:`metric` (anything beats None)."""
        if b is None:
            return True
        if self.higher_is_better:
            return self.value(a) > self.value(b)
        return self.value(a) < self.value(b)

    def best(self, results: Iterable[R]) -> R | None:
        """The best complete trial that met the goals (the first of equals), None when none did."""
        best: R | None = None
        for r in results:
            if r.state == "complete" and r.meets_goals and self.better(r, best):
                best = r
        return best

    def improved(self, result: Result, best: Result | None, min_improvement: float) -> bool:
        """``result`` beats ``best`` by at least ``min_improvement`` (a fraction): stagnation."""
        if best is None:
            return True
        if self.higher_is_better:
            return self.value(result) > self.value(best) * (1 + min_improvement)
        return self.value(result) < self.value(best) * (1 - min_improvement)

    def ranked(self, results: Iterable[R]) -> list[R]:
        """``results`` best first (a stable sort: equals keep their order)."""
        return sorted(results, key=self.value, reverse=self.higher_is_better)

    # -- validation -------------------------------------------------------------------------------

    def validation_candidates(self, feasible: Iterable[R], top: int) -> list[R]:
        """The configs to re-measure: the ``top`` best feasible trials, one per config.

        Args:
            feasible: Complete trials that met the goals.
            top: How many (``budget.validate_top``); 0 validates nothing.
        """
        if top <= 0 or not self.validates:
            return []
        picked: list[R] = []
        seen: list[Any] = []
        for r in self.ranked(feasible):
            knobs = getattr(r, "config", r.number)
            if knobs not in seen:
                picked.append(r)
                seen.append(knobs)
            if len(picked) == top:
                break
        return picked

    def repeat_figure(self, values: Sequence[float]) -> float:
        """THE one rule reducing a validated config's repeats to its headline figure: the worst
        repeat (lowest throughput, highest p99).

        The worst repeat is the figure every repeat reached, so the headline is a promise the
        config kept each time it was measured, not a typical value it missed in some repeats.
        The sweep chooses the best worst case, the report states it and the gate judges it;
        one rule keeps the three from disagreeing (they once read the median and the worst).
        A repeat that missed the goals counts as 0 req/s (or an infinite p99): pass
        :meth:`score` values.

        Raises:
            ValueError: ``values`` is empty.
        """
        return worst_value(self.metric, values)

    def worst_repeat(self, runs: Sequence[R]) -> R:
        """The repeat :meth:`repeat_figure` picks (a repeat that missed the goals first)."""
        if not runs:
            raise ValueError("no repeats")
        if self.higher_is_better:
            return min(runs, key=self.score)
        return max(runs, key=lambda r: (not r.meets_goals, self.value(r)))

    def choose(self, passing: Sequence[C], resolution: float) -> tuple[C, str | None]:
        """The winner among validated candidates that met the goals in every repeat.

        Candidates are the ``validation`` entries of summary.json
        (:class:`~analyzer.rundir.validation.ValidationCandidate`); ``worst_rps`` and
        ``worst_p99_ms`` hold their :meth:`repeat_figure` values. The best worst case wins.

        Args:
            passing: The candidates (at least one).
            resolution: The capacity search's resolution (``budget.capacity_resolution``).

        Returns:
            (the winner, why a tie-break chose it, or None when there was none)
        """
        if not passing:
            raise ValueError("no passing candidate")
        key = _WORST_KEY[self.metric]

        def figure(c: C) -> float:
            return float(getattr(c, key))

        if self.higher_is_better:
            return max(passing, key=figure), None
        return min(passing, key=figure), None

    # -- the gain and the headline --------------------------------------------------------------

    def gain(self, baseline_value: float, best_value: float) -> float:
        """How much better ``best_value`` is than ``baseline_value``: >1 means better.

        Raises:
            ZeroDivisionError: The denominator is 0 (callers state no gain then).
        """
        if self.higher_is_better:
            return best_value / baseline_value
        return baseline_value / best_value

    def has_gain(self, baseline: Result, best: Result) -> bool:
        """A gain can be stated: the baseline met the goals and the ratio is defined."""
        denominator = self.value(baseline) if self.higher_is_better else self.value(best)
        return baseline.meets_goals and denominator > 0

    @abc.abstractmethod
    def gain_sample(self, result: Result) -> GainSample:
        """One measurement of one side of the gain, with the range its truth lies in."""

    @abc.abstractmethod
    def headline(
        self,
        best: Any,
        baseline: Any | None,
        gain_text: str | None,
        p99_goal_ms: float | None,
    ) -> str:
        """The report's one-sentence answer when a config met the goals.

        Args:
            best: The chosen config (``throughput_rps``, ``p99_ms`` and optionally
                ``validated_throughput_rps``).
            baseline: The baseline (same fields), or None.
            gain_text: The gain sentence, None when no gain is stated.
            p99_goal_ms: The p99 goal.
        """

    @abc.abstractmethod
    def measure_text(self, goals: Mapping[str, Any], traffic: Mapping[str, Any]) -> str:
        """What one measurement of a config is (gate provenance): ``fixed load 60`` or
        ``capacity at p99 <= 100 ms``."""

    def reference_rps(
        self, configured: float | None, baseline_rps: float, min_rate_rps: float
    ) -> float | None:
        """The fixed level trials are measured at, once the baseline is known (None: none)."""
        return configured

    def traffic_problem(self, traffic: Any) -> str | None:
        """Why the scenario's ``traffic`` cannot run this objective (None: it can).

        Args:
            traffic: The scenario's traffic section (``mode``, ``rate_rps``, ``concurrency``,
                ``shapes``).
        """
        if len(traffic.shapes) > 1 and not (self.capacity and not self.fixed):
            # Several shapes rank a config by its worst capacity: one number, one search each.
            return (
                f'objective "{self.name}" measures one arrival shape; several '
                f'(traffic.arrival = {list(traffic.shapes)}) need objective "throughput"'
            )
        return None


class _CapacityMixin:
    """Capacity objectives: the gain sample is the capacity, bracketed by the search; a tie
    within the search's resolution goes to the config using less GPU."""

    def choose(self, passing: Sequence[C], resolution: float) -> tuple[C, str | None]:
        """The best worst-case capacity; at equal capacity (within ``resolution``), the config
        using less GPU memory and device time (:func:`prefer_lighter`)."""
        if not passing:
            raise ValueError("no passing candidate")
        chosen = max(passing, key=lambda c: c.worst_rps)
        return prefer_lighter(chosen, list(passing), resolution)

    def gain_sample(self, result: Result) -> GainSample:
        """The capacity found (0 when the goals were missed), up to the lowest failing rate
        above it that the search measured (a search only brackets the capacity)."""
        value = result.throughput_rps if result.meets_goals else 0.0
        capacity = result.measurement.capacity if result.measurement is not None else None
        high = value
        # Closed loop: the levels are user counts, not rates, so they bound nothing here.
        closed_loop = capacity is not None and any(
            p.mode is LoadMode.CONCURRENCY for p in capacity.points
        )
        censored = False
        if value > 0 and capacity is not None and not closed_loop:
            lowest_fail = capacity.lowest_fail_rps
            high = value if lowest_fail is None else lowest_fail
            # No rate above it failed: the search met the goals up to its limit.
            censored = lowest_fail is None
        return GainSample(value, value, high, censored)

    def headline(
        self, best: Any, baseline: Any | None, gain_text: str | None, p99_goal_ms: float | None
    ) -> str:
        # Search numbers throughout (throughput, p99 and the gain come from one measurement);
        # the validation's worst case is stated beside them, not mixed in.
        text = (
            f"Best config serves {best.throughput_rps:.1f} req/s within p99 ≤ {p99_goal_ms} ms "
            f"(p99 {best.p99_ms:.1f} ms)"
        )
        if gain_text is not None and baseline is not None:
            text += f"; the baseline serves {baseline.throughput_rps:.1f} req/s — {gain_text}."
        else:
            text += "; the baseline missed the goals, so there is no gain to state."
        validated = getattr(best, "validated_throughput_rps", None)
        if validated is not None:
            text += f" Re-measured in validation: {validated:.1f} req/s (worst repeat)."
        return text

    def measure_text(self, goals: Mapping[str, Any], traffic: Mapping[str, Any]) -> str:
        return f"capacity at p99 <= {goals.get('p99_ms', '?'):g} ms"


class ThroughputObjective(_CapacityMixin, Objective):
    """The highest load a config serves within the goals (a capacity search per trial)."""

    name = "throughput"
    metric = "throughput_rps"
    higher_is_better = True
    gain_label = "best / baseline throughput"
    directions = ("maximize",)
    metric_names = ("throughput_rps",)
    capacity = True
    fixed = False
    checks_at_capacity = True

    def values(self, numbers: Mapping[str, float]) -> tuple[float, ...]:
        return (numbers["throughput_rps"],)


class LatencyObjective(Objective):
    """The lowest p99 at one fixed offered load (``traffic.rate_rps`` or ``concurrency``)."""

    name = "latency"
    metric = "p99_ms"
    higher_is_better = False
    gain_label = "baseline p99 / best p99"
    directions = ("minimize",)
    metric_names = ("p99_ms",)
    capacity = False
    fixed = True

    def values(self, numbers: Mapping[str, float]) -> tuple[float, ...]:
        return (numbers["p99_ms"],)

    def required_throughput(
        self,
        numbers: Mapping[str, float],
        min_throughput_rps: float,
        *,
        open_loop: bool,
        min_rate_rps: float,
    ) -> float:
        """Open loop: it must serve (95 % of) the load offered, or a low p99 means nothing."""
        if open_loop:
            return max(min_throughput_rps, 0.95 * numbers["offered_rps"])
        return min_throughput_rps

    def gain_sample(self, result: Result) -> GainSample:
        """The p99 (infinite when the goals were missed), down to the best window's p99 and up
        to the worst's."""
        if not result.meets_goals:
            return GainSample(math.inf, math.inf, math.inf)
        m = result.measurement
        # The fixed level's own windows (a capacity search brackets no latency here).
        level = m.fixed if m is not None and m.capacity is None else None
        windows = level.windows if level is not None else ()
        p99s = [w.p99_ms for w in windows if w.request_count > 0] + [result.p99_ms]
        return GainSample(result.p99_ms, min(p99s), max(p99s))

    def headline(
        self,
        best: Any,
        baseline: Any | None,
        gain_text: str | None,
        p99_goal_ms: float | None,
    ) -> str:
        text = f"Best config: p99 {best.p99_ms:.1f} ms (goal ≤ {p99_goal_ms} ms)"
        if gain_text is not None and baseline is not None:
            text += f"; the baseline's is {baseline.p99_ms:.1f} ms — {gain_text}."
        else:
            text += "; the baseline missed the goals, so there is no gain to state."
        return text

    def measure_text(self, goals: Mapping[str, Any], traffic: Mapping[str, Any]) -> str:
        level = traffic.get("rate_rps") or traffic.get("concurrency")
        return f"fixed load {level}"

    def traffic_problem(self, traffic: Any) -> str | None:
        """The fixed level must be given: ``rate_rps`` (open loop) or ``concurrency``."""
        if problem := super().traffic_problem(traffic):
            return problem
        if traffic.mode is TrafficMode.RATE and traffic.rate_rps is None:
            return 'objective "latency" needs traffic.rate_rps (the offered load)'
        if traffic.mode is TrafficMode.CONCURRENCY and traffic.concurrency is None:
            return 'objective "latency" in closed-loop mode needs traffic.concurrency'
        return None


class ParetoObjective(_CapacityMixin, Objective):
    """The front of capacity against p99 at a reference load (both measured per trial).

    Its :attr:`metric` (what a run ranks by and the headline shows) is the throughput; the
    answer is the front, so nothing is validated (re-measuring would choose one point of it).
    """

    name = "pareto"
    metric = "throughput_rps"
    higher_is_better = True
    multi = True
    validates = False
    gain_label = "best / baseline throughput"
    directions = ("maximize", "minimize")
    metric_names = ("throughput_rps", "p99_ms")
    capacity = True
    fixed = True

    def values(self, numbers: Mapping[str, float]) -> tuple[float, ...]:
        return (numbers["throughput_rps"], numbers["reference_p99_ms"])

    def reference_rps(
        self, configured: float | None, baseline_rps: float, min_rate_rps: float
    ) -> float | None:
        """``traffic.rate_rps`` when set; else half the baseline's capacity (at least the
        lowest rate searched), so every trial's p99 is read at a load they all serve."""
        if configured is not None:
            return configured
        return max(0.5 * baseline_rps, min_rate_rps)


def _gpu_use(candidate: ValidationCandidate) -> tuple[float, float] | None:
    """(peak memory of the fullest GPU, mean utilisation) over a candidate's validation repeats;
    None when a repeat recorded no GPU figure."""
    peaks, utils = [], []
    for m in candidate.measurements:
        gpus = m.gpus() if m is not None else ()
        mem = [g.memory_used_peak_mb for g in gpus if g.memory_used_peak_mb is not None]
        util = [g.utilization_pct_mean for g in gpus if g.utilization_pct_mean is not None]
        if not mem or not util:
            return None
        peaks.append(max(mem))
        utils.append(sum(util) / len(util))
    return (max(peaks), sum(utils) / len(utils)) if peaks else None


def prefer_lighter(chosen: C, passing: Sequence[C], tolerance: float) -> tuple[C, str | None]:
    """At equal throughput, the cheapest config.

    Candidates whose worst validated capacity is within ``tolerance`` (the capacity search's
    resolution: it cannot order capacities closer than that) of ``chosen``'s tie. Where every
    tied candidate has GPU figures, the one holding the least GPU memory at its operating point
    wins, then the least busy GPU; otherwise (the model's own config then only when it is
    ``chosen``), and among equals, the cheapest config
    (:func:`~analyzer.config.pipeline.config_cost`: fewest instances, then smallest max batch
    size, then shortest delay), then the higher throughput. The same traffic on less memory,
    fewer instances and smaller batches leaves room for other models and for bursts.

    Returns:
        (the winner, a sentence saying why it won over ``chosen``, or None when it is ``chosen``)
    """
    best_rps = chosen.worst_rps
    tied = [c for c in passing if c.worst_rps >= (1.0 - tolerance) * best_rps]
    known = {c.trial_number: _gpu_use(c) for c in tied}
    gpu = all(u is not None for u in known.values())
    if not gpu:
        # The model's own config is not chosen for its size alone: whether a searched config
        # is better than it is the recommendation rule's question (the gain and its interval).
        tied = [c for c in tied if c.trial_number >= 0 or c is chosen]
    if len(tied) < 2:
        return chosen, None

    def key(c: C) -> tuple[Any, ...]:
        # Measured GPU use, where every tied config has it, is the cost itself; the config's
        # size stands in for it where it was not measured.
        use = known[c.trial_number] if gpu else None
        return (*(use or ()), config_cost(c.config), -c.worst_rps)

    winner = min(tied, key=key)
    if winner is chosen:
        return chosen, None
    name = "the baseline" if winner.trial_number < 0 else f"trial {winner.trial_number}"
    other = "the baseline" if chosen.trial_number < 0 else f"trial {chosen.trial_number}"
    why = f"their capacities are within the capacity search's resolution ({tolerance:.0%})"
    if gpu:
        (w_mem, w_util), (c_mem, c_util) = known[winner.trial_number], known[chosen.trial_number]  # type: ignore[misc]
        return winner, (
            f"Chose {name} ({winner.worst_rps:.1f} req/s, {w_mem:.0f} MiB, GPU {w_util:.0f} % "
            f"busy) over {other} ({best_rps:.1f} req/s, {c_mem:.0f} MiB, {c_util:.0f} %): "
            f"{why}, and at equal throughput the config using less GPU memory and device time "
            "wins."
        )
    return winner, (
        f"Chose {name} [{winner.config.label()}] ({winner.worst_rps:.1f} req/s) among "
        f"{len(tied)} tied configs over {other} [{chosen.config.label()}] ({best_rps:.1f} "
        f"req/s): {why}, and among tied configs the cheapest wins (fewest instances, then "
        "smallest max_batch_size, then shortest delay)."
    )


#: Every objective by name (the scenario's ``objective`` values), in documentation order.
OBJECTIVES: Mapping[str, Callable[[], Objective]] = {
    cls.name: cls for cls in (ThroughputObjective, LatencyObjective, ParetoObjective)
}


def objective_for(name: str) -> Objective:
    """The objective called ``name``.

    Raises:
        UnknownObjectiveError: No objective has that name (the message lists the valid ones).
    """
    factory = OBJECTIVES.get(name)
    if factory is None:
        valid = ", ".join(repr(n) for n in OBJECTIVES)
        raise UnknownObjectiveError(f"unknown objective {name!r}; use one of {valid}")
    return factory()
