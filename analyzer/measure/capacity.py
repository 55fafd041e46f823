"""The capacity search, a pure state machine, and its result.

:class:`CapacitySearch`: the engine asks for the next rate and reports pass or fail
(bracketing, then bisection); :func:`find_capacity`: that search driven by a load generator's
``measure`` (the Locust one's and the virtual one's alike); :class:`CapacityResult`: the highest
rate that met the goals and every point tried on the way.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from analyzer.measure.goals import meets_goals, sequential_verdict
from analyzer.measure.measurement import Measurement, goals_dict
from analyzer.measure.specs import CapacitySpec, Goals, LoadMode, LoadSpec
from analyzer.measure.stepping import StepVerdict


@dataclass(frozen=True)
class CapacityResult:
    """Highest request rate that met the goals, and every point tried on the way."""

    goals: Goals
    #: Highest passing rate, requests/second; 0.0 when even the first step failed.
    capacity_rps: float
    #: Every step, in the order it ran.
    points: tuple[Measurement, ...]
    #: The measurement at ``capacity_rps`` (None when nothing passed).
    best: Measurement | None
    #: True when the search bracketed the capacity (a failing rate was found above a passing one).
    bracketed: bool
    message: str = ""
    #: The step at ``capacity_rps`` was sequential and ended at the boundary (BOUNDARY): its p99
    #: is within the test's resolution of the goal, neither shown below nor above it.
    at_boundary: bool = False
    #: A rate known to fail before the search (``CapacitySpec.fails_at_rps``: a validation
    #: check that failed there), which bounds the capacity as a failing point would.
    fails_at_rps: float | None = None

    @property
    def lowest_fail_rps(self) -> float | None:
        """The lowest rate above the capacity known to fail (a failing point, or
        :attr:`fails_at_rps`); None when every rate offered met the goals."""
        failing = [
            p.target
            for p in self.points
            if p.target > self.capacity_rps and not meets_goals(p, self.goals)[0]
        ]
        if self.fails_at_rps is not None and self.fails_at_rps > self.capacity_rps:
            failing.append(self.fails_at_rps)
        return min(failing, default=None)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        out = {
            "goals": goals_dict(self.goals),
            "capacity_rps": self.capacity_rps,
            "bracketed": self.bracketed,
            "at_boundary": self.at_boundary,
            "message": self.message,
            "best": self.best.to_dict() if self.best else None,
            "points": [p.to_dict() for p in self.points],
        }
        if self.fails_at_rps is not None:
            out["fails_at_rps"] = self.fails_at_rps
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CapacityResult:
        """Inverse of ``to_dict``."""
        return cls(
            goals=Goals(**data["goals"]),
            capacity_rps=float(data["capacity_rps"]),
            points=tuple(Measurement.from_dict(p) for p in data["points"]),
            best=Measurement.from_dict(data["best"]) if data.get("best") else None,
            bracketed=bool(data["bracketed"]),
            message=str(data.get("message", "")),
            at_boundary=bool(data.get("at_boundary", False)),
            fails_at_rps=data.get("fails_at_rps"),
        )


#: Bracketing growth of a search whose forecast check disagreed with the forecast: a looser
#: guess than a prediction, as a neighbour's capacity is, without dropping to rates where one
#: step takes many times longer.
FULL_SEARCH_GROWTH = 1.5


class CapacitySearch:
    """Bracket upward from a low rate, then bisect to a relative resolution.

    Usage::

        search = CapacitySearch(spec)
        while (rate := search.next_rate()) is not None:
            search.record(rate, passed=run_step(rate))
        search.capacity_rps

    Bracketing multiplies the rate by ``growth`` while it passes (up to ``max_rps``). Once a rate
    fails, bisection runs between the highest pass and the lowest fail until the gap is at most
    ``resolution`` x the lower end. A failing first step divides the rate by ``growth`` until one
    passes (then bisects) or the rate would drop below ``min_rps``. ``spec.fails_at_rps`` is a
    failure known beforehand: the search starts with it as the lowest failing rate.
    ``spec.forecast_check``: a pass at ``start_rps`` then a fail at ``start_rps * growth`` ends
    the search (:attr:`confirmed`); any other first outcome makes it a full search with growth
    :data:`FULL_SEARCH_GROWTH`.

    A sequential step that ends undecided at its cap (BOUNDARY) passes or fails on its point p99
    (:func:`meets_goals`); one that passes is recorded with ``boundary=True``, and the result
    says so (:attr:`at_boundary`): its capacity rests on the point estimate, not on the test.
    """

    def __init__(self, spec: CapacitySpec) -> None:
        self.spec = spec
        self.highest_pass: float | None = None
        self.lowest_fail: float | None = spec.fails_at_rps
        self.history: list[tuple[float, bool]] = []
        self._boundary: dict[float, bool] = {}
        self._next: float | None = spec.start_rps
        self._growth = spec.growth
        #: The forecast check ended as forecast: a pass below it, a fail above it.
        self.confirmed = False

    @property
    def capacity_rps(self) -> float:
        """Highest passing rate so far (0.0 when none passed)."""
        return self.highest_pass or 0.0

    @property
    def bracketed(self) -> bool:
        """A failing rate above the highest passing one has been found."""
        return self.lowest_fail is not None and self.highest_pass is not None

    def next_rate(self) -> float | None:
        """The next rate to measure, or None when the search is done."""
        return self._next

    @property
    def at_boundary(self) -> bool:
        """The highest passing rate passed at the boundary (a BOUNDARY sequential step)."""
        return self.highest_pass is not None and self._boundary.get(self.highest_pass, False)

    def record(self, rate: float, passed: bool, *, boundary: bool = False) -> None:
        """Report the verdict for ``rate`` (the value ``next_rate`` returned); ``boundary``: it
        passed at the boundary (a BOUNDARY sequential step, counted as passed)."""
        self.history.append((rate, passed))
        if passed:
            self._boundary[rate] = boundary
        if passed:
            self.highest_pass = max(rate, self.highest_pass or 0.0)
        else:
            self.lowest_fail = rate if self.lowest_fail is None else min(rate, self.lowest_fail)
        self._next = self._decide()

    def _decide(self) -> float | None:
        spec = self.spec
        if spec.forecast_check and self._growth == spec.growth:
            outcomes = [passed for _, passed in self.history]
            if outcomes == [True, False]:
                self.confirmed = True
                return None
            if outcomes != [True]:  # the forecast was wrong: by how much, nothing tells yet
                self._growth = FULL_SEARCH_GROWTH
        low, high = self.highest_pass, self.lowest_fail
        if high is None:  # still bracketing upwards
            assert low is not None
            if low >= spec.max_rps:
                return None
            return min(low * self._growth, spec.max_rps)
        if low is None:  # even the lowest rate failed: search below it
            candidate = high / self._growth
            return candidate if candidate >= spec.min_rps else None
        # A relative tolerance: a bracket grown in steps of exactly 1 + resolution (a search
        # from a prediction: EXPECTED_GROWTH) is done, whatever the rounding of the product says.
        if high - low <= spec.resolution * low * (1 + 1e-9):
            return None
        return (low + high) / 2.0


def needs_confirmation(spec: CapacitySpec, search: CapacitySearch, failed: Measurement) -> bool:
    """Whether a failing step must repeat before it counts (with ``spec.confirm_failures``).

    A repeat guards against a latency spike failing a rate the config serves; it is skipped
    where the evidence is in already:

    * the step's sequential test decided FAIL far beyond the goal
      (:attr:`~analyzer.measure.stepping.StepRecord.far_beyond`): the test's estimate of the
      autocorrelation already discounts a burst of slow requests, and a spike leaves a share
      over the goal near the allowed one, not twice it;
    * a step above the capacity a prediction expects (``spec.expected_rps``: the profile's
      simulation, the baseline's forecast): the failure the prediction predicted, so two
      sources agree, as they do on the upper step of a forecast check (``spec.forecast_check``:
      a pass at the start, then this failure). A step undecided at its cap failed on a p99
      near the goal, i.e. near the capacity, which the bracket holds; a spike that failed a
      rate the config serves leaves the capacity within one step of the prediction's, where a
      predicted search stops anyway (its band).
    """
    step = failed.step
    if failed.valid and step is not None and step.far_beyond:
        return False
    if failed.valid and spec.expected_rps is not None and failed.target > spec.expected_rps:
        return False
    return not (spec.forecast_check and [p for _, p in search.history] == [True])


def find_capacity(
    spec: CapacitySpec,
    measure: Callable[[LoadSpec], Measurement],
    drain: Callable[[], object] = lambda: None,
) -> CapacityResult:
    """Bracket, then bisect, the highest open-loop rate meeting ``spec.goals``.

    With ``spec.step.sequential`` set, every step is a sequential step against
    ``spec.goals.p99_ms`` (PASS and FAIL as pass and fail; BOUNDARY on its point p99, labelled
    at the boundary when it passes: :func:`~analyzer.measure.goals.meets_goals`), and only the
    first step warms up.
    """
    search = CapacitySearch(spec)
    points: list[Measurement] = []
    template = spec.step
    if template.sequential is not None:
        template = replace(
            template, sequential=replace(template.sequential, goal_ms=spec.goals.p99_ms)
        )
    steps_run = 0

    def run(step: LoadSpec) -> tuple[Measurement, bool]:
        nonlocal steps_run
        if template.sequential is not None and steps_run > 0:
            # One warm-up per config load, not per step. The warm-up pays for what a config
            # load and a cold generator cost (instances, allocations, connections); by the
            # second step the server is warm, and drain() has emptied it, so no backlog of
            # the previous rate leaks in. No settle period replaces it: what is left is the
            # queue filling from empty at the new rate, and a settle of a second or so is no
            # cure for that near capacity (the queue's relaxation time there is longer than
            # any warm-up), while far from capacity it is over in a few service times. The
            # test itself needs >= ~500 requests before it can pass a p99, so those first
            # requests weigh little, and a step near the goal runs longest of all.
            step = replace(step, warmup_s=0.0)
        steps_run += 1
        m = measure(step)
        points.append(m)
        drain()
        return m, meets_goals(m, spec.goals)[0]

    def run_valid(step: LoadSpec) -> tuple[Measurement, bool]:
        m, passed = run(step)
        if not m.valid:  # the generator, not the server, failed: that says nothing yet
            m, passed = run(step)
        return m, passed

    while (rate := search.next_rate()) is not None:
        step = replace(template, mode=LoadMode.REQUEST_RATE, target=rate, fail_fast=spec.goals)
        m, passed = run_valid(step)
        if not passed and spec.confirm_failures and needs_confirmation(spec, search, m):
            # Real servers have rare outliers: a failure must repeat, in a valid measurement.
            m, passed = run_valid(step)
        boundary = passed and sequential_verdict(m, spec.goals) is StepVerdict.BOUNDARY
        search.record(rate, passed, boundary=boundary)
    capacity = search.capacity_rps
    best = None
    for m in points:
        if m.target == capacity and meets_goals(m, spec.goals)[0]:
            best = m
    invalid = [m for m in points if not m.valid]
    if capacity == 0:
        message = (
            f"no rate from {spec.min_rps:g} req/s up met {spec.goals.describe()}; "
            "check the server or relax the goal"
        )
    elif not search.bracketed:
        message = f"every rate up to the limit {spec.max_rps:g} req/s met the goal; raise it"
    else:
        message = f"capacity {capacity:.1f} req/s at {spec.goals.describe()}"
    if capacity > 0 and search.at_boundary:
        message += (
            " (at the boundary: at that rate the sequential test could not tell the p99 "
            "from the goal within its cap)"
        )
    if invalid:
        message += f"; {len(invalid)} step(s) were invalid (generator saturated): add --workers"
    return CapacityResult(
        goals=spec.goals,
        capacity_rps=capacity,
        points=tuple(points),
        best=best,
        bracketed=search.bracketed,
        message=message,
        at_boundary=search.at_boundary,
        fails_at_rps=spec.fails_at_rps,
    )
