"""A discrete-event simulator of the reference server's dynamic batcher.

Batch formation is not re-implemented: every batcher step calls
:func:`reference_server.batching.decide.decide`, and the loop around it follows
:class:`reference_server.batching.scheduler.Scheduler` with prefetching (no priorities or queue
policies): steps run until one would wait, an open batch enters the instance queue with its
first request and keeps growing there until an instance takes it, at most ``2 * instances``
batches wait for an instance, an idle instance takes the oldest batch at once and absorbs
following batches whose oldest request waited longer than the queue delay (§3.6), and a
decision's ``wake_at_ns`` is the timer. Without dynamic batching every request is its own
batch (the default scheduler).

Executions follow the simulated backend: the input phase (host) overlaps across instances, the
device phase is serialised per device in the order instances reach it, the output phase
overlaps. With ``jitter`` each phase is scaled by ``max(0, 1 + jitter * N(0, 1))``.

Assumptions (:data:`ASSUMPTIONS`, printed by ``perfsweep predict``): Poisson arrivals of
batch-1 requests; no network, protocol or thread hand-over cost (latency = queue + execution);
one device shared by all instances; all requests shape-compatible.
"""

from __future__ import annotations

import heapq
import math
import random
from collections import deque
from dataclasses import dataclass, field
from itertools import islice
from typing import TYPE_CHECKING, Any

from analyzer.predict import ExtrapolationError
from analyzer.predict.profile import Profile
from reference_server.batching.decide import BatchingParams, Candidate, OpenBatch, decide

if TYPE_CHECKING:
    from analyzer.trial import Knobs

ASSUMPTIONS = (
    "arrivals: Poisson (seeded), one item per request",
    "latency = queue + execution on the server; network, protocol and thread hand-overs are "
    "not modelled",
    "batching: reference_server.batching.decide.decide, with the reference server's prefetching "
    "(up to 2 batches per instance queued) and instance-side merging",
    "execution: compute_input and compute_output overlap across instances; compute_infer is "
    "serialised on one device shared by all instances",
)


@dataclass(frozen=True)
class SimConfig:
    """The config knobs the simulator honours.

    Attributes:
        max_batch_size: ``max_batch_size`` of the model (>= 1).
        max_queue_delay_us: ``dynamic_batching.max_queue_delay_microseconds``.
        preferred_batch_size: Preferred sizes; empty = Triton's normalisation ``[max_batch_size]``.
        instance_count: Instances on the one device.
        dynamic_batching: False = the default scheduler (every request its own batch).
    """

    max_batch_size: int
    max_queue_delay_us: int = 0
    preferred_batch_size: tuple[int, ...] = ()
    instance_count: int = 1
    dynamic_batching: bool = True

    @property
    def largest_batch(self) -> int:
        """The largest execution this config can produce."""
        return max(1, self.max_batch_size) if self.dynamic_batching else 1

    def params(self) -> BatchingParams:
        """The batcher's parameters after Triton's normalisation."""
        mbs = max(1, self.max_batch_size)
        preferred = frozenset(self.preferred_batch_size) or frozenset({mbs})
        return BatchingParams(mbs, preferred, self.max_queue_delay_us * 1000)

    @classmethod
    def from_knobs(cls, knobs: Knobs) -> SimConfig:
        """From a run's config (a record's :class:`analyzer.trial.Knobs`)."""
        return cls(
            max_batch_size=knobs.max_batch_size,
            max_queue_delay_us=knobs.max_queue_delay_us,
            preferred_batch_size=tuple(knobs.preferred_batch_size),
            instance_count=knobs.instance_count,
            dynamic_batching=knobs.dynamic_batching,
        )

    def describe(self) -> str:
        """One line, as the console prints it."""
        if not self.dynamic_batching:
            return f"no dynamic batching, {self.instance_count} instance(s)"
        pref = ",".join(map(str, self.preferred_batch_size)) or f"{self.max_batch_size} (default)"
        return (
            f"max_batch_size {self.max_batch_size}, max_queue_delay_us {self.max_queue_delay_us}, "
            f"preferred {pref}, {self.instance_count} instance(s)"
        )


@dataclass(frozen=True)
class Prediction:
    """What the simulator predicts at one rate.

    Attributes:
        rate_rps: Offered Poisson rate.
        requests: Requests measured (after the warm-up ones).
        p50_ms / p99_ms / mean_ms: Latency of the measured requests (arrival to completion).
        throughput_rps: Measured requests / the span from the first measured arrival to the
            last completion.
        batch_sizes: Executions per batch size over the whole simulation.
        saturated: Throughput below 90 % of the rate: the rate is above what the config serves.
        stopped_early: The run stopped once the p99 goal could no longer be met.
    """

    rate_rps: float
    requests: int
    p50_ms: float
    p99_ms: float
    mean_ms: float
    throughput_rps: float
    batch_sizes: dict[int, int]
    saturated: bool = False
    stopped_early: bool = False

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (batch sizes keyed by strings)."""
        return {
            "rate_rps": self.rate_rps,
            "requests": self.requests,
            "p50_ms": _json_float(self.p50_ms),
            "p99_ms": _json_float(self.p99_ms),
            "mean_ms": _json_float(self.mean_ms),
            "throughput_rps": self.throughput_rps,
            "batch_sizes": {str(k): v for k, v in sorted(self.batch_sizes.items())},
            "saturated": self.saturated,
            "stopped_early": self.stopped_early,
        }


@dataclass(frozen=True)
class CapacityPrediction:
    """The highest rate whose simulated p99 meets the goal.

    Attributes:
        p99_ms: The goal.
        capacity_rps: Highest passing rate found (0 when even ``min_rps`` fails).
        at_capacity: The prediction at that rate (None when nothing passed).
        upper_rps: Lowest failing rate found (the bracket's top).
        steps: Every simulated rate in order, with its p99 (inf when it stopped early).
    """

    p99_ms: float
    capacity_rps: float
    at_capacity: Prediction | None
    upper_rps: float
    steps: tuple[tuple[float, float], ...] = field(default=())

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        return {
            "p99_ms": self.p99_ms,
            "capacity_rps": self.capacity_rps,
            "upper_rps": self.upper_rps,
            "at_capacity": self.at_capacity.to_dict() if self.at_capacity else None,
            "steps": [[r, _json_float(p)] for r, p in self.steps],
        }


def _json_float(x: float) -> float | None:
    return x if math.isfinite(x) else None


class _Batch:
    __slots__ = ("arrivals", "oldest", "queued", "sealed", "size", "started")

    def __init__(self) -> None:
        self.arrivals: list[int] = []
        self.size = 0
        self.oldest = 0
        self.sealed = False
        self.started = False
        self.queued = False


def simulate(
    profile: Profile,
    config: SimConfig,
    rate_rps: float,
    *,
    requests: int = 20000,
    warmup: int | None = None,
    seed: int = 0,
    stop_above_ms: float | None = None,
) -> Prediction:
    """Simulate ``requests`` Poisson arrivals at ``rate_rps`` through ``config``.

    Args:
        profile: Execution times; must cover batch sizes ``1..config.largest_batch``.
        config: The config.
        rate_rps: Offered rate.
        requests: Arrivals simulated (warm-up included).
        warmup: Leading arrivals left out of the latency figures (default: 10 %).
        seed: Seeds the arrivals and the jitter (same seed, same answer).
        stop_above_ms: Stop as soon as more than 1 % of the measured requests are certain to
            take longer than this (the capacity search's shortcut); p99 is then ``inf``.

    Raises:
        ExtrapolationError: the config can execute batches the profile does not cover.
    """
    if rate_rps <= 0:
        raise ValueError("rate_rps must be positive")
    if config.instance_count < 1:
        raise ValueError("instance_count must be >= 1")
    table = profile.table(config.largest_batch)
    ins = [round(t.input_ms * 1e6) for t in table]
    dev = [round(t.infer_ms * 1e6) for t in table]
    outs = [round(t.output_ms * 1e6) for t in table]
    jitter = profile.jitter
    rng = random.Random(seed)
    warm = requests // 10 if warmup is None else warmup
    if warm >= requests:
        raise ValueError("warmup must leave some requests to measure")

    # Arrival times (ns, integers: decide() compares integer ns as the server does).
    mean_gap_ns = 1e9 / rate_rps
    arrivals: list[int] = []
    t = 0.0
    expo = rng.expovariate
    for _ in range(requests):
        t += expo(1.0) * mean_gap_ns
        arrivals.append(int(t))
    arrivals_rng = random.Random(seed + 1)  # jitter draws, independent of the arrival count

    def scaled(ns: int) -> int:
        if jitter <= 0:
            return ns
        return max(0, round(ns * (1.0 + jitter * arrivals_rng.gauss(0.0, 1.0))))

    dynamic = config.dynamic_batching
    params = config.params()
    mbs = params.max_batch_size
    delay_ns = params.max_queue_delay_ns
    merge = delay_ns > 0 and mbs > 1
    scan_limit = mbs + 1
    slots = 2 * config.instance_count
    n_inst = config.instance_count

    queue: deque[Candidate] = deque()
    open_b = _Batch()
    iq: deque[_Batch] = deque()
    idle = n_inst
    device_busy = False
    device_wait: deque[_Batch] = deque()  # batches whose input phase ended, device busy
    events: list[tuple[int, int, int, _Batch]] = []  # (time, seq, kind, batch)
    seq = 0
    timer: int | None = None
    histogram: dict[int, int] = {}
    latencies: list[int] = []
    measured_needed = requests - warm
    too_slow_ns = None if stop_above_ms is None else stop_above_ms * 1e6
    too_slow = 0
    too_slow_limit = measured_needed // 100  # more than 1 % over the goal: p99 over it
    last_completion = 0
    done_count = 0
    stopped = False
    KIND_INPUT_DONE, KIND_DEVICE_DONE, KIND_DONE = 0, 1, 2
    NEVER = 1 << 62

    def start_execution(now: int, batch: _Batch) -> None:
        nonlocal seq
        b = batch.size
        histogram[b] = histogram.get(b, 0) + 1
        seq += 1
        heapq.heappush(events, (now + scaled(ins[b]), seq, KIND_INPUT_DONE, batch))

    def pop_batches(now: int) -> bool:
        nonlocal idle
        popped = False
        while idle and iq:
            batch = iq.popleft()
            batch.started = True
            if merge:
                while iq:
                    nxt = iq[0]
                    if now - nxt.oldest <= delay_ns or batch.size + nxt.size > mbs:
                        break
                    iq.popleft()
                    batch.arrivals.extend(nxt.arrivals)
                    batch.size += nxt.size
                    nxt.started = True
            idle -= 1
            start_execution(now, batch)
            popped = True
        return popped

    def run_steps(now: int) -> tuple[int | None, bool]:
        """Scheduler._run_steps: returns (wake time, whether anything changed)."""
        nonlocal open_b
        changed = False
        while True:
            if open_b.sealed or open_b.started:
                open_b = _Batch()
            if not queue or len(iq) >= slots:
                return None, changed
            head = list(islice(queue, scan_limit))
            d = decide(head, OpenBatch(open_b.size, None), params, now)
            if d.take:
                if not open_b.size:
                    open_b.oldest = queue[0].enqueue_ns
                for _ in range(d.take):
                    c = queue.popleft()
                    open_b.arrivals.append(c.enqueue_ns)
                    open_b.size += 1
                if not open_b.queued:
                    open_b.queued = True
                    iq.append(open_b)
            if d.seal:
                open_b.sealed = True
            if d.take or (d.seal and open_b.size):
                changed = True
                continue
            return d.wake_at_ns, changed

    def settle(now: int) -> None:
        """Everything the server does at one instant, under its lock, until it would wait."""
        nonlocal timer
        if not dynamic:
            pop_batches(now)
            return
        while True:
            pop_batches(now)
            wake, changed = run_steps(now)
            if not changed:
                timer = wake
                return

    next_arrival = 0
    now = 0
    while True:
        # The earliest of: execution event, arrival, batcher timer (ties in that order).
        t_event = events[0][0] if events else NEVER
        t_arrival = arrivals[next_arrival] if next_arrival < requests else NEVER
        now = t_event if t_event <= t_arrival else t_arrival
        if timer is not None and timer < now:
            now = timer
        if now == NEVER:
            break
        if t_event == now:
            _, _, kind, batch = heapq.heappop(events)
            if kind == KIND_INPUT_DONE:
                if device_busy:
                    device_wait.append(batch)
                else:
                    device_busy = True
                    seq += 1
                    heapq.heappush(
                        events, (now + scaled(dev[batch.size]), seq, KIND_DEVICE_DONE, batch)
                    )
                continue
            if kind == KIND_DEVICE_DONE:
                seq += 1
                heapq.heappush(events, (now + scaled(outs[batch.size]), seq, KIND_DONE, batch))
                if device_wait:
                    waiting = device_wait.popleft()
                    seq += 1
                    heapq.heappush(
                        events, (now + scaled(dev[waiting.size]), seq, KIND_DEVICE_DONE, waiting)
                    )
                else:
                    device_busy = False
                continue
            # KIND_DONE: responses delivered, the instance is idle again.
            for a in batch.arrivals:
                done_count += 1
                if a >= arrivals[warm]:
                    lat = now - a
                    latencies.append(lat)
                    if too_slow_ns is not None and lat > too_slow_ns:
                        too_slow += 1
            last_completion = now
            idle += 1
            if too_slow_ns is not None and too_slow > too_slow_limit:
                stopped = True
                break
            settle(now)
            continue
        if t_arrival == now:
            if too_slow_ns is not None and next_arrival >= warm:
                # Requests still queued that are already older than the goal count as over it.
                waited = now - too_slow_ns
                if queue and queue[0].enqueue_ns < waited and queue[0].enqueue_ns >= arrivals[warm]:
                    late = sum(
                        1 for c in islice(queue, too_slow_limit + 1) if c.enqueue_ns < waited
                    )
                    if late + too_slow > too_slow_limit:
                        stopped = True
                        break
            next_arrival += 1
            if dynamic:
                queue.append(Candidate(1, now))
            else:
                single = _Batch()
                single.arrivals.append(now)
                single.size = 1
                single.oldest = now
                iq.append(single)
            settle(now)
            continue
        # The batcher's timer.
        timer = None
        settle(now)

    first = arrivals[warm]
    measured = len(latencies)
    if stopped or measured == 0:
        return Prediction(
            rate_rps=rate_rps,
            requests=measured,
            p50_ms=math.inf,
            p99_ms=math.inf,
            mean_ms=math.inf,
            throughput_rps=0.0,
            batch_sizes=dict(sorted(histogram.items())),
            saturated=True,
            stopped_early=True,
        )
    latencies.sort()
    span = max(1, last_completion - first)
    throughput = measured / (span / 1e9)
    return Prediction(
        rate_rps=rate_rps,
        requests=measured,
        p50_ms=_quantile(latencies, 0.50) / 1e6,
        p99_ms=_quantile(latencies, 0.99) / 1e6,
        mean_ms=sum(latencies) / measured / 1e6,
        throughput_rps=throughput,
        batch_sizes=dict(sorted(histogram.items())),
        # Every arrival is served before the run ends, so a rate above capacity shows as a
        # throughput (measured / span until the last completion) well below the rate.
        saturated=throughput < 0.9 * rate_rps,
    )


def _quantile(sorted_ns: list[int], q: float) -> float:
    # The nearest-rank quantile, as HDR histograms report it.
    k = max(0, min(len(sorted_ns) - 1, math.ceil(q * len(sorted_ns)) - 1))
    return float(sorted_ns[k])


def capacity(
    profile: Profile,
    config: SimConfig,
    p99_ms: float,
    *,
    requests: int = 3000,
    seed: int = 0,
    resolution: float = 0.02,
    min_rps: float | None = None,
) -> CapacityPrediction:
    """Bisect the rate for the highest one whose simulated p99 is <= ``p99_ms``.

    The bracket is ``(0, peak]`` where ``peak`` is the profile's noise-free throughput bound
    for the config (no rate above it can be sustained); every rate is simulated with the same
    seed (common random numbers, so p99 is monotone in the rate up to jitter).

    Args:
        profile: Execution times.
        config: The config.
        p99_ms: The goal.
        requests: Arrivals per simulated rate.
        seed: Seed of every simulation.
        resolution: Stop when the bracket is narrower than this share of the capacity.
        min_rps: Lowest rate tried (default: 1 % of the peak).

    Raises:
        ExtrapolationError: the config needs batch sizes beyond the profile.
    """
    if p99_ms <= 0:
        raise ValueError("p99_ms must be positive")
    peak = profile.peak_rps(config.largest_batch, config.instance_count)
    lo_rate = min_rps if min_rps is not None else peak * 0.01
    steps: list[tuple[float, float]] = []

    def passes(rate: float) -> tuple[bool, Prediction]:
        pred = simulate(profile, config, rate, requests=requests, seed=seed, stop_above_ms=p99_ms)
        steps.append((rate, pred.p99_ms))
        # A rate the system cannot keep up with never passes, whatever the sample's p99.
        ok = pred.p99_ms <= p99_ms and not pred.saturated
        return ok, pred

    ok, pred = passes(lo_rate)
    if not ok:
        return CapacityPrediction(p99_ms, 0.0, None, lo_rate, tuple(steps))
    lo, best = lo_rate, pred
    hi = peak
    ok, pred = passes(hi)
    if ok:
        return CapacityPrediction(p99_ms, hi, pred, hi, tuple(steps))
    while hi - lo > resolution * lo:
        mid = (lo + hi) / 2
        ok, pred = passes(mid)
        if ok:
            lo, best = mid, pred
        else:
            hi = mid
    return CapacityPrediction(p99_ms, lo, best, hi, tuple(steps))


__all__ = [
    "ASSUMPTIONS",
    "CapacityPrediction",
    "ExtrapolationError",
    "Prediction",
    "SimConfig",
    "capacity",
    "simulate",
]
