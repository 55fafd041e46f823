"""What to measure: how load is offered, the goals, one load level, one capacity search.

:class:`LoadMode`, :class:`Goals` (p99 and error-rate bounds, per request
class too), :class:`LoadSpec` (one level) and :class:`CapacitySpec` (a search for the highest
level that meets the goals). Pure records; every one round-trips through ``to_dict``.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field

from analyzer.errors import InputError
from analyzer.measure.arrivals import POISSON, ArrivalProcess
from analyzer.measure.stepping import StepTest

#: The end-to-end latency a level with only token goals (TTFT, ITL) is bounded by when it
#: counts requests in flight (:meth:`LoadSpec.in_flight_bound`), milliseconds.
TOKEN_STREAM_BOUND_MS = 30_000.0


class LoadMode(str, enum.Enum):
    """How load is offered."""

    #: Closed loop: N requests always outstanding (perf_analyzer ``--concurrency-range``).
    #: Latency is timed from the actual send, so a server stall is under-reported (coordinated omission).
    CONCURRENCY = "concurrency"
    #: Open loop: requests are sent on a schedule regardless of responses; latency is timed from the
    #: intended send time, so a stall shows in the tail.
    REQUEST_RATE = "request_rate"


@dataclass(frozen=True)
class Goals:
    """What a load level must achieve to count as meeting the service-level objective."""

    #: Client-side p99 latency limit, milliseconds.
    p99_ms: float
    #: Highest tolerated fraction of failed requests (0.01 = 1 %); with traffic classes, of
    #: each class's requests.
    max_error_rate: float = 0.0
    #: ``(class name, p99 goal ms)`` of the traffic classes with a goal of their own
    #: (``TrafficSection.class_goals()``); any other class is held to ``p99_ms``.
    classes: tuple[tuple[str, float], ...] = ()
    #: Generative models: p99 limit of the time to first token, milliseconds (None: no goal).
    ttft_p99_ms: float | None = None
    #: Generative models: p99 limit of the inter-token latency over tokens, milliseconds.
    itl_p99_ms: float | None = None

    def __post_init__(self) -> None:
        if self.p99_ms is None:  # type: ignore[comparison-overlap]
            # JSON has no infinity: a record writes token goals' open end-to-end goal as null.
            object.__setattr__(self, "p99_ms", math.inf)
        if not self.p99_ms > 0:
            raise InputError(f"p99 goal must be positive, got {self.p99_ms} ms")
        for name, goal in (("TTFT", self.ttft_p99_ms), ("ITL", self.itl_p99_ms)):
            if goal is not None and not goal > 0:
                raise InputError(f"{name} p99 goal must be positive, got {goal} ms")
        if not 0 <= self.max_error_rate < 1:
            raise InputError(
                f"error-rate goal must be in [0, 1), got {self.max_error_rate}; pass a fraction"
            )
        # A record read back from JSON has lists; the frozen object holds tuples.
        classes = tuple((str(name), float(goal)) for name, goal in self.classes)
        object.__setattr__(self, "classes", classes)
        for name, goal in classes:
            if not goal > 0:
                raise InputError(f"p99 goal of class {name!r} must be positive, got {goal} ms")
            if goal > self.p99_ms:
                # The overall p99 is judged against p99_ms (a sequential step's test, the
                # fail-fast rule): it must be the loosest goal, or it fails levels that every
                # class passes.
                raise InputError(
                    f"p99 goal of class {name!r} ({goal:g} ms) is above the run's p99 goal "
                    f"({self.p99_ms:g} ms): make goals.p99_ms the loosest goal (the rest of "
                    "the traffic) and give the stricter classes their own p99_ms"
                )

    @property
    def token_goals(self) -> bool:
        """A TTFT or ITL goal is set (the level must be a token stream)."""
        return self.ttft_p99_ms is not None or self.itl_p99_ms is not None

    def describe(self) -> str:
        """The goals in one phrase: ``p99 <= 100 ms``, ``TTFT p99 <= 500 ms, ITL p99 <= 50 ms``
        (an end-to-end goal of infinity, the token goals' companion, is left out)."""
        parts = [f"p99 <= {self.p99_ms:g} ms"] if math.isfinite(self.p99_ms) else []
        if self.ttft_p99_ms is not None:
            parts.append(f"TTFT p99 <= {self.ttft_p99_ms:g} ms")
        if self.itl_p99_ms is not None:
            parts.append(f"ITL p99 <= {self.itl_p99_ms:g} ms")
        return ", ".join(parts) or "no latency goal"

    def class_p99_ms(self, name: str) -> float:
        """The p99 goal of traffic class ``name``: its own, else ``p99_ms``."""
        return next((goal for n, goal in self.classes if n == name), self.p99_ms)


@dataclass(frozen=True)
class LoadSpec:
    """One load level and how to measure it."""

    mode: LoadMode
    #: Concurrency (requests outstanding) in closed-loop mode, requests/second in open-loop mode.
    target: float
    #: Open loop: when requests are sent (the shape; ``target`` sets its mean rate).
    arrival: ArrivalProcess = POISSON
    #: Warm-up before the first window; its requests are never part of any result.
    warmup_s: float = 1.0
    #: Window length in seconds (time windows). Ignored when ``window_requests`` is set.
    window_s: float = 3.0
    #: Window length in completed requests (count windows); each window also lasts >= ``min_window_s``.
    window_requests: int | None = None
    min_window_s: float = 1.0
    #: A count window closes after this many seconds even short of ``window_requests`` (at a low
    #: rate the seconds bound it), once it holds ``min_window_requests``. None: the load
    #: engine's own ceiling.
    max_window_s: float | None = None
    min_window_requests: int = 1
    #: Stability rule: the last ``stable_windows`` windows agree within this percentage.
    stability_pct: float = 10.0
    stable_windows: int = 3
    #: At most this many windows per level; a level that has not stabilised by then is marked unstable.
    max_windows: int = 10
    #: Seed of the arrival schedule and of random input data.
    seed: int = 0
    #: When set, stop the level early once it clearly fails these goals (capacity search).
    fail_fast: Goals | None = None
    #: Upper bound on requests in flight (open loop); beyond it the level fails fast when
    #: ``fail_fast`` is set. ``None``: derived from the rate (see ``in_flight_bound``).
    max_in_flight: int | None = None
    #: When set, the level is a sequential step: it stops as soon as this test decides
    #: ``p{quantile} <= goal_ms`` (PASS or FAIL), else at ``sequential.max_requests`` or at
    #: ``max_windows`` windows, whichever comes first (BOUNDARY). Its verdict is
    #: ``Measurement.step``; the stability rule is then a recorded check, not the stopping rule.
    #: In a capacity search (``CapacitySpec.step``) the goal is the search's ``goals.p99_ms``,
    #: and only the first step after the config load keeps ``warmup_s``. None: today's stopping.
    sequential: StepTest | None = None

    def __post_init__(self) -> None:
        if not self.target > 0:
            raise InputError(f"load target must be positive, got {self.target}")
        if self.mode is LoadMode.CONCURRENCY and self.target != int(self.target):
            raise InputError(f"concurrency must be a whole number, got {self.target}")
        if self.window_requests is None and not self.window_s > 0:
            raise InputError(f"--window-s must be positive, got {self.window_s}")
        if self.window_requests is not None and self.window_requests < 1:
            raise InputError(f"--window-requests must be >= 1, got {self.window_requests}")
        if self.max_window_s is not None and not self.max_window_s >= self.min_window_s:
            raise InputError(
                f"max_window_s ({self.max_window_s}) must be >= min_window_s ({self.min_window_s})"
            )
        if self.stable_windows < 1 or self.max_windows < self.stable_windows:
            raise InputError(
                f"max_windows ({self.max_windows}) must be >= stable_windows ({self.stable_windows}) >= 1"
            )

    def window_closes(self, completed: int, elapsed_s: float, ceiling_s: float) -> bool:
        """Whether a window of ``completed`` requests after ``elapsed_s`` seconds is over: a
        time window at ``window_s``; a count window at ``window_requests`` (and at least
        ``min_window_s``), at ``max_window_s`` once it holds ``min_window_requests``, and at
        the engine's ``ceiling_s`` whatever it holds."""
        if self.window_requests is None:
            return elapsed_s >= self.window_s
        return (
            (completed >= self.window_requests and elapsed_s >= self.min_window_s)
            or (
                self.max_window_s is not None
                and elapsed_s >= self.max_window_s
                and completed >= self.min_window_requests
            )
            or elapsed_s >= ceiling_s
        )

    def window_requests_at(self, rate_rps: float) -> int:
        """Requests a window holds at ``rate_rps`` (open loop): ``window_requests`` bounded by
        ``min_window_s`` and ``max_window_s`` (with ``min_window_requests``), or the rate times ``window_s`` for time windows."""
        if self.window_requests is None:
            return max(1, round(rate_rps * self.window_s))
        count = max(self.window_requests, round(rate_rps * self.min_window_s))
        if self.max_window_s is not None:
            count = min(count, max(self.min_window_requests, round(rate_rps * self.max_window_s)))
        return max(1, count)

    def in_flight_bound(self) -> int:
        """Requests allowed in flight before an open-loop level counts as overloaded.

        Little's law: in-flight = rate x latency. At the goal's p99 the in-flight count is about
        ``rate * p99``; four times that (at least 64) means the server is clearly not keeping up.
        """
        if self.max_in_flight is not None:
            return self.max_in_flight
        p99_ms = self.fail_fast.p99_ms if self.fail_fast else 1000.0
        if not math.isfinite(p99_ms):
            # Token goals alone: a generative request lasts its whole stream, seconds at most
            # as a rule; the bound only catches a backlog that grows without end.
            p99_ms = TOKEN_STREAM_BOUND_MS
        return max(64, math.ceil(4 * self.target * p99_ms / 1000.0))


@dataclass(frozen=True)
class CapacitySpec:
    """Find the highest open-loop request rate that meets ``goals``."""

    goals: Goals
    #: First rate tried; the search doubles from here until a rate fails.
    start_rps: float = 10.0
    #: Never offer more than this.
    max_rps: float = 100_000.0
    #: When even ``start_rps`` fails the search descends, but not below this.
    min_rps: float = 1.0
    #: Bisection stops when the bracket is narrower than this fraction of its lower end.
    resolution: float = 0.05
    #: Bracketing growth factor.
    growth: float = 2.0
    #: Template for every step (mode and target are overridden by the search).
    step: LoadSpec = field(
        default_factory=lambda: LoadSpec(LoadMode.REQUEST_RATE, 1.0, window_s=2.0, max_windows=4)
    )
    #: Wait at most this long for the server to drain (pending requests back to 0) between steps.
    drain_timeout_s: float = 30.0
    #: Repeat a failing step once before it counts (real servers have rare outliers).
    confirm_failures: bool = False
    #: A rate already seen failing (validation: the winner's failed check): the search starts
    #: bracketed below it instead of growing past it.
    fails_at_rps: float | None = None
    #: The search checks a forecast instead of searching for it: ``start_rps`` (below the
    #: forecast) must pass and ``start_rps * growth`` (above it) must fail, and then the search
    #: is over with that bracket, whatever ``resolution`` says. Any other outcome (the forecast
    #: was wrong, by an amount it cannot tell) goes on as a full search: steps of
    #: :data:`FULL_SEARCH_GROWTH`, then bisection to ``resolution``.
    forecast_check: bool = False
    #: The capacity a prediction expects (the profile's simulation, or the baseline's forecast;
    #: None: no prediction): a step failing above it failed where the prediction said it would,
    #: so no repeat confirms it (:func:`~analyzer.measure.capacity.needs_confirmation`).
    expected_rps: float | None = None

    def __post_init__(self) -> None:
        if self.fails_at_rps is not None and not self.start_rps < self.fails_at_rps:
            raise InputError(
                f"capacity search starting at {self.start_rps} req/s cannot be bounded by a "
                f"failing rate {self.fails_at_rps} req/s at or below it"
            )
        if not 0 < self.min_rps <= self.start_rps <= self.max_rps:
            raise InputError(
                f"capacity search needs 0 < min ({self.min_rps}) <= start ({self.start_rps}) "
                f"<= max ({self.max_rps}) req/s"
            )
        if not 0 < self.resolution < 1:
            raise InputError(f"resolution must be a fraction in (0, 1), got {self.resolution}")
        if not self.growth > 1:
            raise InputError(f"growth must be > 1, got {self.growth}")
