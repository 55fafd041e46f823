"""The load plan: which load specs a trial runs, from the scenario alone (pure, no load).

::

    step(factor, arrival)     the template of every load level (search: factor 1; validation:
                              windows ``budget.validate_window_factor`` times longer), in one
                              of the scenario's arrival shapes (default: the first)
    warm_up()                 the discarded light load right after a config load (None: none)
    reference_target(rps)     the fixed level: traffic.concurrency users, else the reference rate
    capacity_spec(...)        the capacity search: open loop (request rates) or closed loop
                              (user counts), its start and growth; open-loop steps are
                              sequential with ``budget.sequential``
    check(rate)               one sequential step at a rate (validation: does a config serve
                              the winner's capacity?)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from analyzer.config.scenario import Scenario
from analyzer.config.traffic import TrafficMode
from analyzer.measure.arrivals import ArrivalProcess
from analyzer.measure.specs import CapacitySpec, Goals, LoadMode, LoadSpec
from analyzer.measure.stepping import StepTest, window_samples

#: Windows a sequential step may take: the window is the unit of the stability check and of the
#: batch means, not the stopping rule. An undecided step usually ends here, not at its request
#: cap (``budget.sequential_max_requests``), and such a BOUNDARY step is judged on its point p99.
#: A window holds the samples its percentile needs (:func:`~analyzer.measure.stepping.
#: window_samples`: 1,000 for a p99) or ``budget.window_s`` of requests where the rate is too
#: low for that, whichever comes first, so a step at a high rate is not held for seconds its
#: evidence does not need.
SEQUENTIAL_WINDOWS = 3

#: The shortest window of a sequential step, seconds: its throughput spans at least this long.
SEQUENTIAL_MIN_WINDOW_S = 1.0

#: Growth of a capacity search that starts at a predicted capacity: small steps bracket it.
EXPECTED_GROWTH = 1.2

#: Growth when the expectation is a neighbouring config's capacity (a looser guess: a config
#: one knob away can serve twice as much, which steps of 1.2 would take four levels to reach).
NEIGHBOUR_GROWTH = 1.5

#: Where such a search starts, as a share of the expected capacity: one step below it, so the
#: usual first step passes and the second brackets.
EXPECTED_START = 0.9

#: Growth of a forecast check (the baseline): from :data:`EXPECTED_START` of the forecast to
#: 1.2x it, far enough above a forecast within its usual error that the step fails fast
#: instead of running to its cap at the boundary.
CHECK_GROWTH = 1.35


@dataclass(frozen=True)
class Expected:
    """What a capacity search knows before its first step.

    Attributes:
        rps: The expected capacity (a prediction, or the nearest finished trial's capacity).
        growth: The bracketing steps: :data:`EXPECTED_GROWTH` for a prediction,
            :data:`NEIGHBOUR_GROWTH` for a neighbour's capacity.
        check: Check the expectation instead of searching around it (the baseline's
            forecast): one step below it that must pass, one :data:`CHECK_GROWTH` above
            that must fail, a full search only when either disagrees
            (:attr:`~analyzer.measure.specs.CapacitySpec.forecast_check`).
        predicted: The expectation is a prediction (a simulation of the profile), not a
            neighbour's measured capacity: a failure above it needs no repeat
            (:attr:`~analyzer.measure.specs.CapacitySpec.expected_rps`).
    """

    rps: float
    growth: float = EXPECTED_GROWTH
    check: bool = False
    predicted: bool = True


@dataclass(frozen=True)
class LoadPlan:
    """The load specs of one scenario's trials.

    Attributes:
        scenario: The validated scenario (traffic, budget, goals and seed are read).
    """

    scenario: Scenario

    @property
    def goals(self) -> Goals:
        """What every load level must meet (p99 and error rate, per traffic class too).

        A generative model's token goals (``goals.ttft_p99_ms``, ``itl_p99_ms``) replace the
        end-to-end p99: a request's end-to-end time grows with its output length, so the
        time to its first token and the gaps between tokens are what it is held to."""
        g = self.scenario.goals
        tokens = g.ttft_p99_ms is not None or g.itl_p99_ms is not None
        return Goals(
            p99_ms=math.inf if tokens else g.p99_ms,
            max_error_rate=g.max_error_rate,
            # Traffic classes with a goal of their own (a priority mix): each is held to it.
            classes=self.scenario.traffic.class_goals(),
            ttft_p99_ms=g.ttft_p99_ms,
            itl_p99_ms=g.itl_p99_ms,
        )

    @property
    def open_loop(self) -> bool:
        """Requests are sent on a schedule (``traffic.mode = "rate"``), not by waiting users."""
        return self.scenario.traffic.mode is TrafficMode.RATE

    @property
    def unit(self) -> str:
        """What a load level's target counts: ``req/s`` or ``users``."""
        return "req/s" if self.open_loop else "users"

    @property
    def shapes(self) -> tuple[ArrivalProcess, ...]:
        """The arrival shapes a config is measured under (``traffic.arrival``; one unless it
        lists several, when a config stands for its worst capacity)."""
        return self.scenario.traffic.arrival_processes()

    def step(self, factor: float = 1.0, arrival: ArrivalProcess | None = None) -> LoadSpec:
        """The load-level template (windows ``factor`` times longer when validating), offered
        in ``arrival`` (default: the first of :attr:`shapes`)."""
        b = self.scenario.budget
        return LoadSpec(
            mode=LoadMode.REQUEST_RATE if self.open_loop else LoadMode.CONCURRENCY,
            target=1.0,
            arrival=arrival or self.shapes[0],
            warmup_s=b.warmup_s,
            window_s=b.window_s * factor,
            # Count windows: a window ends after min_requests requests (and at least window_s),
            # so a p99 always rests on enough samples, whatever the rate.
            window_requests=round(b.min_requests * factor),
            min_window_s=b.window_s * factor,
            # Two agreeing windows are enough for a search step; validation allows a third.
            stable_windows=2,
            max_windows=2 if factor == 1.0 else 3,
            seed=self.scenario.run.seed,
        )

    def warm_up(self) -> LoadSpec | None:
        """Light load right after a config load, discarded (None when ``budget.warmup_s`` is 0).

        The first requests after a reload pay for new instances, allocations and the
        generator's own start-up; measured, they made the first level of every capacity search
        fail. Each level still has its own ``warmup_s`` on top.
        """
        t, b = self.scenario.traffic, self.scenario.budget
        if b.warmup_s <= 0:
            return None
        target = float(t.concurrency or 1) if not self.open_loop else t.min_rate_rps
        if self.open_loop:
            target = min(max(t.start_rps or target, target), t.max_rate_rps)
        return replace(
            self.step(),
            target=target,
            warmup_s=0.0,
            window_s=b.warmup_s,
            window_requests=None,
            stable_windows=1,
            max_windows=1,
            fail_fast=None,
        )

    def reference_target(self, reference_rps: float | None) -> float:
        """The fixed level: ``traffic.concurrency`` users (closed loop), else ``reference_rps``
        (``traffic.rate_rps`` or the objective's reference), else the lowest rate."""
        t = self.scenario.traffic
        if not self.open_loop:
            return float(t.concurrency or 1)
        return float(reference_rps or t.min_rate_rps)

    def fixed(self, target: float, factor: float = 1.0) -> LoadSpec:
        """One fixed level at ``target`` (never stopped early: its numbers are the result)."""
        return replace(self.step(factor), target=target, fail_fast=None)

    @property
    def sequential(self) -> bool:
        """Capacity steps are sequential tests (``budget.sequential``, open loop only: a closed
        loop's level is a user count, whose throughput the test does not decide). The test is
        of the end-to-end p99: a generative level held to token goals instead runs its
        windows and is judged on their TTFT and ITL."""
        tokens = self.goals.ttft_p99_ms is not None or self.goals.itl_p99_ms is not None
        return self.scenario.budget.sequential and self.open_loop and not tokens

    def step_test(self) -> StepTest:
        """The sequential test of a step: p99 <= the goal, capped at
        ``budget.sequential_max_requests``."""
        b = self.scenario.budget
        return StepTest(
            goal_ms=self.goals.p99_ms,
            min_requests=min(b.min_requests, b.sequential_max_requests),
            max_requests=b.sequential_max_requests,
        )

    def sequential_step(
        self, factor: float = 1.0, arrival: ArrivalProcess | None = None
    ) -> LoadSpec:
        """:meth:`step` as a sequential step: its test, and windows of the samples the
        percentile needs (``factor`` times as many when validating), at most ``window_s``
        seconds long, at least :data:`SEQUENTIAL_MIN_WINDOW_S`."""
        step = self.step(factor, arrival)
        test = self.step_test()
        fewest = step.window_requests or 1
        longest = step.min_window_s
        return replace(
            step,
            sequential=test,
            window_requests=max(round(window_samples(test.quantile) * factor), fewest),
            min_window_s=min(SEQUENTIAL_MIN_WINDOW_S * factor, longest),
            # At a low rate the window ends at window_s, as a time window would, once it holds
            # budget.min_requests (as every window does).
            max_window_s=longest,
            min_window_requests=fewest,
            max_windows=max(step.max_windows, SEQUENTIAL_WINDOWS),
        )

    def capacity_step(self, factor: float = 1.0, arrival: ArrivalProcess | None = None) -> LoadSpec:
        """The template of a capacity search's levels: :meth:`step`, sequential
        (:meth:`sequential_step`) when :attr:`sequential`."""
        if not self.sequential:
            return self.step(factor, arrival)
        return self.sequential_step(factor, arrival)

    def check(
        self, rate_rps: float, factor: float = 1.0, arrival: ArrivalProcess | None = None
    ) -> LoadSpec:
        """One sequential step at ``rate_rps`` (validation at the winner's capacity): it ends
        as soon as p99 <= goal is decided, or at the boundary."""
        return replace(self.sequential_step(factor, arrival), target=rate_rps, fail_fast=None)

    def capacity_spec(
        self,
        factor: float = 1.0,
        near_rps: float | None = None,
        hint_rps: float | None = None,
        expected: Expected | None = None,
        fails_at_rps: float | None = None,
        arrival: ArrivalProcess | None = None,
    ) -> CapacitySpec:
        """The capacity search of one trial.

        Open loop: request rates from ``traffic.start_rps`` (default 10x the lowest rate),
        doubling. ``near_rps`` (validation of a known capacity) starts just below it and grows
        in small steps, so a re-measurement costs a few levels, not a full bracket; else
        ``expected`` (the config's predicted capacity, or the capacity of the nearest finished
        trial) starts :data:`EXPECTED_START` of it and brackets in its steps, or checks it
        (:attr:`Expected.check`: two steps when the forecast holds); else ``hint_rps`` (the
        best capacity so far) starts it near half of that. ``fails_at_rps`` (with ``near_rps``:
        the rate a validation check just failed at) bounds the search from above from its
        start. ``arrival``: the shape its levels are offered in (default: the first).

        Closed loop: user counts from 1 to ``traffic.max_concurrency``.

        A failing level counts only when its repeat fails too: a latency spike of 60-120 ms on
        a real server can fail one level at a rate the config serves.
        """
        t, b = self.scenario.traffic, self.scenario.budget
        if not self.open_loop:
            return CapacitySpec(
                goals=self.goals,
                start_rps=1,
                max_rps=t.max_concurrency,
                min_rps=1,
                resolution=max(b.capacity_resolution, 0.01),
                step=self.step(factor),
                confirm_failures=True,
            )
        start = t.start_rps or min(10 * t.min_rate_rps, t.max_rate_rps)
        growth = 2.0
        fails_at = None
        if near_rps:
            start, growth = min(max(0.85 * near_rps, t.min_rate_rps), t.max_rate_rps), 1.5
            if fails_at_rps is not None and start < fails_at_rps:
                fails_at = fails_at_rps
        elif expected is not None and expected.rps > 0:
            start = min(max(EXPECTED_START * expected.rps, t.min_rate_rps), t.max_rate_rps)
            growth = CHECK_GROWTH if expected.check else expected.growth
        elif hint_rps:
            # Near half the best capacity seen so far (two steps bracket most configs), but
            # not below the configured start: one unlucky early measurement must not make
            # every later search crawl up from a very low rate.
            start = min(max(hint_rps / 2, start), t.max_rate_rps)
        return CapacitySpec(
            goals=self.goals,
            start_rps=start,
            max_rps=t.max_rate_rps,
            min_rps=t.min_rate_rps,
            resolution=b.capacity_resolution,
            growth=growth,
            step=self.capacity_step(factor, arrival),
            confirm_failures=True,
            fails_at_rps=fails_at,
            forecast_check=bool(expected and expected.check and not near_rps),
            expected_rps=expected.rps
            if expected is not None and expected.predicted and not near_rps
            else None,
        )
