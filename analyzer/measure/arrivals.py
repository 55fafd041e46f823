"""Open-loop arrival processes: when each request of a load level is sent. Pure and seeded.

One :class:`ArrivalProcess` describes the shape of the traffic; :meth:`ArrivalProcess.gaps`
turns it into the gaps between sends at a given mean rate. The load generator and the simulator
both draw from it, so a prediction and a measurement of one shape see the same arrivals, and the
capacity search scales the rate while the shape stays:

- ``poisson``: exponential gaps (CV 1), the default;
- ``constant``: equal gaps (CV 0);
- ``gamma``: gamma gaps with coefficient of variation ``cv`` (above 1 is bursty, below 1
  smoother than Poisson; AIPerf's and vLLM's ``burstiness`` is ``1 / cv**2``);
- ``mmpp``: a Markov-modulated Poisson process: states visited in turn, each with a relative
  rate and an exponential sojourn of mean ``sojourn_s`` seconds (on/off bursts: ``4@0.5,0.25@2``
  is four times the base rate for half a second, then a quarter of it for two seconds);
- ``ramp``: Poisson whose rate climbs linearly from ``start`` to ``end`` (relative) over
  ``period_s`` seconds, then starts over (a sawtooth);
- ``diurnal``: Poisson whose rate follows ``1 + amplitude * sin(2 pi t / period_s)``;
- ``trace``: the gaps of a recorded trace (:mod:`analyzer.measure.traces` reads the files),
  scaled to the asked rate and looped where the level outlasts it.

Rates are relative: every process is normalised so that its long-run mean rate is the rate
asked for. Sojourns and periods are in seconds and do not scale with the rate (a burst lasts as
long at twice the traffic). Several generator processes share one stream:
:meth:`ArrivalProcess.send_times` gives each process every n-th send of the same seeded stream,
so their union is the stream itself (independent streams would smooth bursts away).
"""

from __future__ import annotations

import enum
import itertools
import math
import random
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from analyzer.errors import InputError


class Arrival(str, enum.Enum):
    """The kind of an open-loop arrival process."""

    CONSTANT = "constant"
    POISSON = "poisson"
    GAMMA = "gamma"
    MMPP = "mmpp"
    RAMP = "ramp"
    DIURNAL = "diurnal"
    TRACE = "trace"


@dataclass(frozen=True)
class MmppState:
    """One state of a Markov-modulated Poisson process."""

    #: Rate relative to the others (normalised: the time-average is the asked rate); 0 is "off".
    rate: float
    #: Mean time in the state, seconds (exponentially distributed).
    sojourn_s: float


@dataclass(frozen=True)
class Trace:
    """The send times of a recorded trace, as gaps (the first request at 0)."""

    gaps_s: tuple[float, ...]
    #: Where it came from (a file name; recorded so a run says what it replayed).
    source: str = ""
    #: The request data entry each send carries (its index), aligned with ``gaps_s``: the k-th
    #: send of the replay (at the end of gap k) sends ``payloads[k]``; empty: not recorded.
    payloads: tuple[int, ...] = ()
    #: A generative trace (mooncake's ``timestamp,input_length,output_length``): each send's
    #: (input tokens, output tokens), aligned as ``payloads``; empty: not recorded.
    lengths: tuple[tuple[int, int], ...] = ()

    def payload(self, send: int) -> int | None:
        """The entry the ``send``-th send of the (looped) replay carries; None: not recorded."""
        return self.payloads[send % len(self.payloads)] if self.payloads else None

    def length(self, send: int) -> tuple[int, int] | None:
        """The (input, output) tokens of the ``send``-th send; None: not recorded."""
        return self.lengths[send % len(self.lengths)] if self.lengths else None

    def __post_init__(self) -> None:
        if self.payloads and len(self.payloads) != len(self.gaps_s):
            raise InputError(
                f"trace {self.source!r}: {len(self.payloads)} payload indices for "
                f"{len(self.gaps_s)} sends"
            )
        if self.lengths and len(self.lengths) != len(self.gaps_s):
            raise InputError(
                f"trace {self.source!r}: {len(self.lengths)} lengths for {len(self.gaps_s)} sends"
            )
        if not self.gaps_s:
            raise InputError(f"trace {self.source!r}: needs at least one gap to have a rate")
        if any(g < 0 for g in self.gaps_s):
            raise InputError(f"trace {self.source!r}: its times must not go backwards")
        if not sum(self.gaps_s) > 0:
            raise InputError(f"trace {self.source!r}: all its requests are at one instant")

    @property
    def rate_rps(self) -> float:
        """The recorded mean rate (requests per second)."""
        return len(self.gaps_s) / sum(self.gaps_s)

    @property
    def duration_s(self) -> float:
        return sum(self.gaps_s)


@dataclass(frozen=True)
class ArrivalProcess:
    """An arrival process and its parameters (the defaults of the others are unused)."""

    kind: Arrival = Arrival.POISSON
    #: gamma: coefficient of variation of the gaps.
    cv: float = 1.0
    #: mmpp: the states, visited in turn.
    states: tuple[MmppState, ...] = ()
    #: ramp: relative rate at the start and end of each period.
    start: float = 0.5
    end: float = 1.5
    #: diurnal: relative swing of the rate (0 <= amplitude < 1).
    amplitude: float = 0.5
    #: ramp, diurnal: the period, seconds.
    period_s: float = 60.0
    #: trace: the recorded gaps.
    trace: Trace | None = None

    def __post_init__(self) -> None:
        k = self.kind
        if k is Arrival.GAMMA and not self.cv > 0:
            raise InputError(f"gamma arrivals need cv > 0, got {self.cv:g}")
        if k is Arrival.MMPP:
            if len(self.states) < 2:
                raise InputError("mmpp arrivals need at least two states (rate@sojourn_s, ...)")
            for s in self.states:
                if s.rate < 0 or not s.sojourn_s > 0:
                    raise InputError(
                        f"mmpp state {s.rate:g}@{s.sojourn_s:g}: the rate must be >= 0 and the "
                        "sojourn positive"
                    )
            if not any(s.rate > 0 for s in self.states):
                raise InputError("mmpp arrivals need a state with a positive rate")
        if k is Arrival.RAMP and (self.start < 0 or self.end < 0 or self.start + self.end <= 0):
            raise InputError(
                f"ramp arrivals need start, end >= 0, not both 0 ({self.start:g}, {self.end:g})"
            )
        if k is Arrival.DIURNAL and not 0 <= self.amplitude < 1:
            raise InputError(f"diurnal arrivals need 0 <= amplitude < 1, got {self.amplitude:g}")
        if k in (Arrival.RAMP, Arrival.DIURNAL) and not self.period_s > 0:
            raise InputError(f"{k.value} arrivals need a positive period_s, got {self.period_s:g}")
        if (k is Arrival.TRACE) != (self.trace is not None):
            raise InputError("a trace is given with trace arrivals, and only with them")

    # -- the stream ---------------------------------------------------------------------------

    def gaps(self, rate_rps: float, seed: int) -> Iterator[float]:
        """The gaps between consecutive sends, seconds, at mean rate ``rate_rps`` (endless)."""
        if not rate_rps > 0:
            raise InputError(f"arrival rate must be positive, got {rate_rps:g}")
        rng = random.Random(seed)
        k = self.kind
        if k is Arrival.CONSTANT:
            return itertools.repeat(1.0 / rate_rps)
        if k is Arrival.POISSON:
            return (rng.expovariate(rate_rps) for _ in itertools.count())
        if k is Arrival.GAMMA:
            shape = 1.0 / (self.cv * self.cv)
            scale = 1.0 / (shape * rate_rps)
            return (rng.gammavariate(shape, scale) for _ in itertools.count())
        if k is Arrival.TRACE:
            assert self.trace is not None
            factor = self.trace.rate_rps / rate_rps
            return (g * factor for g in itertools.cycle(self.trace.gaps_s))
        return _modulated_gaps(self, rate_rps, seed)

    def send_times(
        self, rate_rps: float, seed: int, index: int = 0, of: int = 1
    ) -> Iterator[float]:
        """Send times (seconds from the stream's start) of the ``index``-th of ``of`` processes
        sharing one stream of mean rate ``rate_rps``: its sends ``index``, ``index + of``, ..."""
        return (t for _, t in self.indexed_send_times(rate_rps, seed, index, of))

    def indexed_send_times(
        self, rate_rps: float, seed: int, index: int = 0, of: int = 1
    ) -> Iterator[tuple[int, float]]:
        """:meth:`send_times` with each send's place in the one stream (what picks a replayed
        trace's payload: :meth:`Trace.payload`)."""
        if not 0 <= index < of:
            raise InputError(f"process {index} of {of} does not exist")
        times = enumerate(itertools.accumulate(self.gaps(rate_rps, seed)))
        return itertools.islice(times, index, None, of)

    def _multiplier(self, t: float) -> float:
        """Relative rate at time ``t`` (ramp, diurnal), mean 1 over a period (:func:`_segments`
        samples it)."""
        phase = (t % self.period_s) / self.period_s
        if self.kind is Arrival.RAMP:
            mean = (self.start + self.end) / 2
            return (self.start + (self.end - self.start) * phase) / mean
        return 1.0 + self.amplitude * math.sin(2 * math.pi * phase)

    # -- what it is ---------------------------------------------------------------------------

    @property
    def gap_cv(self) -> float | None:
        """The coefficient of variation of the gaps where it is known in closed form."""
        return {Arrival.CONSTANT: 0.0, Arrival.POISSON: 1.0, Arrival.GAMMA: self.cv}.get(self.kind)

    @property
    def count_dispersion(self) -> float | None:
        """Variance over mean of the number of sends in a long window (a renewal process:
        ``cv**2``); None where it depends on the window (bursts, periods, a trace)."""
        cv = self.gap_cv
        return None if cv is None else cv * cv

    def describe(self) -> str:
        """One line for a console or a report: ``gamma (cv 2)``."""
        k = self.kind
        if k is Arrival.GAMMA:
            return f"gamma (cv {self.cv:g})"
        if k is Arrival.MMPP:
            states = ", ".join(f"x{s.rate:g} for {s.sojourn_s:g} s" for s in self.states)
            return f"mmpp ({states}, rates relative)"
        if k is Arrival.RAMP:
            return f"ramp (x{self.start:g} to x{self.end:g} every {self.period_s:g} s)"
        if k is Arrival.DIURNAL:
            return f"diurnal (+/-{self.amplitude:.0%} every {self.period_s:g} s)"
        if k is Arrival.TRACE:
            assert self.trace is not None
            t = self.trace
            return (
                f"trace {t.source or '(inline)'} ({len(t.gaps_s)} requests over "
                f"{t.duration_s:.3g} s, {t.rate_rps:.4g} req/s recorded)"
            )
        return k.value

    def to_text(self) -> str:
        """The short form :func:`parse_arrival` reads (a trace: ``trace:FILE``)."""
        k = self.kind
        if k is Arrival.GAMMA:
            return f"gamma:cv={self.cv:g}"
        if k is Arrival.MMPP:
            return "mmpp:" + ",".join(f"{s.rate:g}@{s.sojourn_s:g}" for s in self.states)
        if k is Arrival.RAMP:
            return f"ramp:start={self.start:g},end={self.end:g},period_s={self.period_s:g}"
        if k is Arrival.DIURNAL:
            return f"diurnal:amplitude={self.amplitude:g},period_s={self.period_s:g}"
        if k is Arrival.TRACE:
            assert self.trace is not None
            return f"trace:{self.trace.source}"
        return k.value

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: the short form, and a trace's gaps (a record replays without the file)."""
        out: dict[str, Any] = {"process": self.to_text()}
        if self.trace is not None:
            out["trace_gaps_s"] = list(self.trace.gaps_s)
            if self.trace.payloads:
                out["trace_payloads"] = list(self.trace.payloads)
            if self.trace.lengths:
                out["trace_lengths"] = [list(pair) for pair in self.trace.lengths]
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | str) -> ArrivalProcess:
        """Inverse of :meth:`to_dict`; a plain string is the short form."""
        if isinstance(data, str):
            return parse_arrival(data)
        text = str(data["process"])
        if text.startswith("trace:"):
            payloads = tuple(int(p) for p in data.get("trace_payloads", ()))
            lengths = tuple((int(a), int(b)) for a, b in data.get("trace_lengths", ()))
            trace = Trace(tuple(data["trace_gaps_s"]), text[6:], payloads, lengths)
            return cls(Arrival.TRACE, trace=trace)
        return parse_arrival(text)


POISSON = ArrivalProcess()
CONSTANT = ArrivalProcess(Arrival.CONSTANT)


def parse_arrival(text: str, trace: Trace | None = None) -> ArrivalProcess:
    """Read the short form: ``poisson``, ``constant``, ``gamma:cv=2``, ``mmpp:4@0.5,0.25@2``,
    ``ramp:start=0.5,end=1.5,period_s=60``, ``diurnal:amplitude=0.5,period_s=60``; ``trace``
    with the ``trace`` read from its file (:func:`analyzer.measure.traces.read_trace`)."""
    name, _, rest = text.strip().partition(":")
    try:
        kind = Arrival(name.strip().lower())
    except ValueError:
        known = ", ".join(a.value for a in Arrival)
        raise InputError(f"unknown arrival process {name!r}: use one of {known}") from None
    if kind is Arrival.TRACE:
        if trace is None:
            raise InputError("trace arrivals replay a file: pass --trace FILE")
        return ArrivalProcess(kind, trace=trace)
    if kind is Arrival.MMPP:
        return ArrivalProcess(kind, states=_mmpp_states(rest))
    fields = {"gamma": ("cv",), "ramp": ("start", "end", "period_s")}
    fields["diurnal"] = ("amplitude", "period_s")
    allowed = fields.get(kind.value, ())
    values: dict[str, float] = {}
    for part in filter(None, (p.strip() for p in rest.split(","))):
        key, eq, value = part.partition("=")
        if not eq or key.strip() not in allowed:
            hint = f"its parameters: {', '.join(allowed)}" if allowed else "it takes no parameters"
            raise InputError(f"arrival {text!r}: cannot read {part!r} ({kind.value}: {hint})")
        values[key.strip()] = _number(value, text)
    if kind is Arrival.GAMMA and "cv" not in values:
        raise InputError(f"arrival {text!r}: gamma needs its cv (gamma:cv=2)")
    return ArrivalProcess(kind, **values)  # type: ignore[arg-type]


def _mmpp_states(text: str) -> tuple[MmppState, ...]:
    states = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        rate, at, sojourn = part.partition("@")
        if not at:
            raise InputError(f"mmpp state {part!r}: write rate@sojourn_s (e.g. 4@0.5)")
        states.append(MmppState(_number(rate, part), _number(sojourn.rstrip("s"), part)))
    return tuple(states)


def _number(value: str, context: str) -> float:
    try:
        number = float(value)
    except ValueError:
        raise InputError(f"arrival {context!r}: {value.strip()!r} is not a number") from None
    if not math.isfinite(number):
        raise InputError(f"arrival {context!r}: {value.strip()!r} is not a finite number")
    return number


#: Steps per period of a ramp's or a diurnal shape's rate (piecewise constant in between).
PERIOD_STEPS = 600


def _segments(process: ArrivalProcess, rng: random.Random) -> Iterator[tuple[float, float]]:
    """The modulated shapes' rate over time: ``(seconds, relative rate)`` in turn, endless,
    with a time-average of 1."""
    if process.kind is Arrival.MMPP:
        states = process.states
        mean = sum(s.rate * s.sojourn_s for s in states) / sum(s.sojourn_s for s in states)
        for state in itertools.cycle(states):
            yield rng.expovariate(1.0 / state.sojourn_s), state.rate / mean
    step = process.period_s / PERIOD_STEPS
    # The rate at each step's midpoint: a ramp's mean is then exactly 1, and a sine's too.
    period = [(step, process._multiplier((i + 0.5) * step)) for i in range(PERIOD_STEPS)]
    yield from itertools.cycle(period)


def _modulated_gaps(process: ArrivalProcess, rate_rps: float, seed: int) -> Iterator[float]:
    """Gaps of a Poisson process whose rate is ``rate_rps`` times the relative rate of each
    segment (:func:`_segments`): unit-rate Poisson points mapped through the cumulative rate.

    The points and the segments come from two streams of the seed, both independent of
    ``rate_rps``: at a higher rate the same bursts carry proportionally more requests (common
    random numbers, so a capacity search sees p99 grow smoothly with the rate).
    """
    points = random.Random(seed)
    segments = _segments(process, random.Random(seed ^ 0x5EED))
    start = mass = last = 0.0  # the segment's start time and the cumulative rate there
    target = points.expovariate(1.0)
    for duration, relative in segments:
        rate = relative * rate_rps
        end_mass = mass + duration * rate
        while target <= end_mass:  # the next point falls in this segment
            now = start + (target - mass) / rate
            yield now - last
            last = now
            target += points.expovariate(1.0)
        start, mass = start + duration, end_mass


@dataclass(frozen=True)
class GapFit:
    """What a stream of gaps looks like, against the processes above (:func:`fit_gaps`)."""

    requests: int
    rate_rps: float
    #: Coefficient of variation of the gaps (0 constant, 1 Poisson, above 1 bursty).
    cv: float
    #: Variance over mean of the request counts in 1-second bins (1 for Poisson; bursts that
    #: last longer than a gap raise it above ``cv**2``); None with fewer than 10 bins.
    dispersion_1s: float | None

    @property
    def burstiness(self) -> float:
        """AIPerf's and vLLM's burstiness: the gamma shape ``1 / cv**2`` (1 Poisson)."""
        return 1.0 / (self.cv * self.cv) if self.cv > 1e-6 else math.inf

    def closest(self) -> str:
        """The short form of the parametric process nearest to these gaps."""
        if self.cv < 0.1:
            return "constant"
        if abs(self.cv - 1.0) <= 0.1:
            return "poisson"
        return f"gamma:cv={self.cv:.2g}"

    def describe(self) -> str:
        text = (
            f"{self.requests} requests at {self.rate_rps:.4g} req/s, gap CV {self.cv:.2f} "
            f"(burstiness {self.burstiness:.2f})"
        )
        if self.dispersion_1s is not None:
            text += f", counts per second dispersion {self.dispersion_1s:.2f}"
        text += f"; closest process: {self.closest()}"
        if self.dispersion_1s is not None and self.dispersion_1s > 3 * max(self.cv**2, 1.0):
            text += (
                " (its rate swings over seconds: an mmpp, ramp or diurnal shape follows it "
                "better than any renewal process)"
            )
        return text


def fit_gaps(gaps: tuple[float, ...] | list[float]) -> GapFit:
    """Rate, CV and count dispersion of ``gaps`` (seconds)."""
    n = len(gaps)
    if n < 2:
        raise InputError(f"need at least 2 gaps to fit a process, got {n}")
    mean = sum(gaps) / n
    var = sum((g - mean) ** 2 for g in gaps) / (n - 1)
    cv = math.sqrt(var) / mean if mean > 0 else 0.0
    counts: dict[int, int] = {}
    for t in itertools.accumulate(gaps):
        counts[int(t)] = counts.get(int(t), 0) + 1
    bins = int(sum(gaps))  # whole seconds only: a partial last bin undercounts
    dispersion = None
    if bins >= 10:
        series = [counts.get(b, 0) for b in range(bins)]
        m = sum(series) / bins
        v = sum((c - m) ** 2 for c in series) / (bins - 1)
        dispersion = v / m if m > 0 else None
    return GapFit(n, 1.0 / mean if mean > 0 else math.inf, cv, dispersion)
