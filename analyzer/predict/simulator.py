"""A discrete-event simulator of the reference server's dynamic batcher.

This module holds :func:`simulate` (one rate); its config and results are
:mod:`analyzer.predict.sim_records`, the capacity search over it :mod:`analyzer.predict.capacity`.

Batch formation is not re-implemented: every batcher step calls
:func:`reference_server.batching.decide.decide`, and the loop around it follows
:class:`reference_server.batching.scheduler.Scheduler` with prefetching (no priorities or queue
policies): steps run until one would wait, an open batch enters the instance queue with its
first request and keeps growing there until an instance takes it, at most ``2 * instances``
batches wait for an instance, an idle instance takes the oldest batch at once and absorbs
following batches whose oldest request waited longer than the queue delay (§3.6), and a
decision's ``wake_at_ns`` is the timer. The batcher steps only when something wakes it, by
Triton's rule (``Scheduler.arrival_wakes``): an instance taking a batch, its timer, or an arrival
while the open batch is sealed or started or the queue holds the decision's ``next_preferred``
items (with a queue delay, later arrivals then stay queued instead of joining the batch that
waits for a busy instance). Without dynamic batching every request is its own batch (the
default scheduler).

Executions follow the simulated backend: the input phase (host) overlaps across instances, the
device phase is serialised per device in the order instances reach it, the output phase
overlaps. With ``jitter`` each phase is scaled by ``max(0, 1 + jitter * N(0, 1))``.

Requests of several sizes (the profile's :class:`~analyzer.predict.profile.RequestMix`): each
arrival's kind is drawn by its share of the load's data (seeded, the same draws at every rate
and config), a request carries the mix's items per request, and a batch is timed at the size
of its largest member (``Profile.size_tables``: linear between the sizes and batch sizes the
profile timed), as a batch padded to its longest member runs. Kinds with different batching
keys never share a batch (``Candidate.shape_key``, as the reference server and Triton keep
inputs of unequal shapes apart unless ``allow_ragged_batch``; an arrival then always wakes the
batcher, as ``Scheduler.arrival_wakes`` says). A one-class profile runs exactly as before.

Speed (``benchmarks/simulator_speed.py``): one event loop with no per-event calls besides
``decide()`` and the heap; the batcher's queue is a run of consecutive arrivals (two indices),
and the unit exponential gaps and the jitter's normal draws are drawn once per seed and
reused by every rate and config. :func:`capacities` visits a space's configs neighbour after
neighbour and starts each capacity search at the previous answer.

Assumptions (:data:`ASSUMPTIONS`, printed by ``perfsweep predict``): arrivals of the
scenario's process (``analyzer.measure.arrivals``: Poisson by default) of requests of the
profile's mix (batch-1 requests of one size without one), independent of each
other; network, protocol and thread hand-overs are one constant offset (latency = queue +
execution + ``Profile.latency_offset_ms``, calibrated by :func:`latency_offset`); one device
shared by all instances.

Not modelled: priority levels and queue policies (timeouts, REJECT/DELAY, queue bounds). The
batcher here is one FIFO without timeouts, so a config that sets them (``SimConfig.queue_policy``)
is refused (:func:`check_modelled`) rather than predicted as if it had none: the sweep's
predict strategy leaves such configs unpredicted, and ``perfsweep predict`` says why.
"""

from __future__ import annotations

import bisect
import functools
import heapq
import itertools
import math
import random
from collections import deque
from collections.abc import Generator, Iterator, Sequence
from dataclasses import dataclass
from itertools import accumulate
from typing import Any

from analyzer.measure.arrivals import POISSON, Arrival, ArrivalProcess
from analyzer.predict.profile import Profile
from analyzer.predict.sim_records import Prediction, SimConfig, check_modelled
from reference_server.batching.decide import IDLE_WAIT_S, Candidate, OpenBatch, decide

ASSUMPTIONS = (
    "arrivals: the scenario's process (Poisson unless traffic.arrival says otherwise; seeded, "
    "the load generator's stream); each request's size drawn from the load's data (the profile's "
    "request mix; one size and one item per request without one), a batch timed at its "
    "largest member",
    "latency = queue + execution on the server + one constant offset for what the server does "
    "not see (network, protocol, the load generator), calibrated on measured operating points "
    "(0 until a run has measured one)",
    "batching: reference_server.batching.decide.decide, with the reference server's prefetching "
    "(up to 2 batches per instance queued), instance-side merging and Triton's rule for what "
    "wakes the batcher",
    "execution: compute_input and compute_output overlap across instances; compute_infer is "
    "serialised on one device shared by all instances, except the profile's overlap_ms (host "
    "work the backend reports inside compute_infer, measured by the interference probe), which "
    "overlaps; with several request sizes that host work is taken per request of a batch, so "
    "no config is predicted above the device's serial throughput at the data's sizes",
)


class _Batch:
    __slots__ = (
        "arrivals",
        "blocked",
        "key",
        "lane",
        "oldest",
        "queued",
        "sealed",
        "size",
        "started",
        "top",
    )

    def __init__(self, lane: int) -> None:
        #: Its lane (model) in :func:`serve_lanes`.
        self.lane = lane
        self.arrivals: list[int] = []
        self.size = 0
        self.oldest = 0
        self.sealed = False
        self.started = False
        self.queued = False
        #: The row (request size) of its largest member, which the batch is timed at.
        self.top = 0
        #: Its template's batching key, and whether a decision cut it at another key (such a
        #: batch takes no instance-side merge, as the scheduler's ``merge_blocked``).
        self.key: Any = None
        self.blocked = False


def _arrival_times(arrival: ArrivalProcess, rate_rps: float, seed: int, n: int) -> list[int]:
    """The first ``n`` arrival times (ns) of ``arrival`` at ``rate_rps``.

    Poisson, constant and gamma gaps scale with the rate: their unit gaps are the same at every
    rate (common random numbers), drawn once per seed. Bursts, periods and traces keep their
    seconds, so they are drawn at each rate (from the same seed: the same stream as the load
    generator's at that rate).
    """
    if arrival.kind in (Arrival.POISSON, Arrival.CONSTANT, Arrival.GAMMA):
        mean_gap_ns = 1e9 / rate_rps
        unit = _unit_gaps(seed, n) if arrival.kind is Arrival.POISSON else _unit(arrival, seed, n)
        return [int(t) for t in accumulate(g * mean_gap_ns for g in unit)]
    gaps = itertools.islice(arrival.gaps(rate_rps, seed), n)
    return [int(t * 1e9) for t in accumulate(gaps)]


@functools.lru_cache(maxsize=16)
def _unit(arrival: ArrivalProcess, seed: int, n: int) -> tuple[float, ...]:
    """The first ``n`` gaps of a rate-scaled process at mean 1 (common to every rate)."""
    return tuple(itertools.islice(arrival.gaps(1.0, seed), n))


@functools.lru_cache(maxsize=16)
def _unit_gaps(seed: int, n: int) -> tuple[float, ...]:
    """The seed's first ``n`` unit-mean exponential gaps (common to every rate and config)."""
    expo = random.Random(seed).expovariate
    return tuple(expo(1.0) for _ in range(n))


@functools.lru_cache(maxsize=16)
def draw_kinds(seed: int, n: int, shares: tuple[float, ...]) -> tuple[int, ...]:
    """The seed's first ``n`` draws of an index by ``shares`` (a request's kind, or a mix's
    model; common to every rate and config; one share: all 0)."""
    if len(shares) == 1:
        return (0,) * n
    cumulative = list(accumulate(shares))
    total = cumulative[-1]
    uniform = random.Random(seed).random
    last = len(shares) - 1
    return tuple(min(bisect.bisect_right(cumulative, uniform() * total), last) for _ in range(n))


@functools.lru_cache(maxsize=16)
def _normals(seed: int, n: int) -> tuple[float, ...]:
    """The seed's first ``n`` standard normal draws, in the order the jitter consumes them."""
    gauss = random.Random(seed).gauss
    return tuple(gauss(0.0, 1.0) for _ in range(n))


def simulate(
    profile: Profile,
    config: SimConfig,
    rate_rps: float,
    *,
    requests: int = 20000,
    warmup: int | None = None,
    seed: int = 0,
    stop_above_ms: float | None = None,
    arrival: ArrivalProcess = POISSON,
    keep_latencies: bool = False,
) -> Prediction:
    """Simulate ``requests`` arrivals at ``rate_rps`` through ``config``.

    Args:
        profile: Execution times (and the requests' mix); must cover every batch ``config``
            can execute.
        config: The config.
        rate_rps: Offered rate.
        requests: Arrivals simulated (warm-up included).
        warmup: Leading arrivals left out of the latency figures (default: 10 %).
        seed: Seeds the arrivals and the jitter (same seed, same answer).
        stop_above_ms: Stop as soon as more than 1 % of the measured requests are certain to
            take longer than this (the capacity search's shortcut); p99 is then ``inf``.
        arrival: The arrival process (Poisson by default), as the load generator draws it.
        keep_latencies: Keep each measured request's latency (``Prediction.latencies_ms``).

    Raises:
        ExtrapolationError: the config can execute batches the profile does not cover.
        InputError: the config sets priority levels or a queue policy (:func:`check_modelled`).
    """
    arrivals, warm = arrival_stream(rate_rps, requests, warmup, seed, arrival)
    stage = Stage(profile, config)
    too_slow_ns = over_goal_ns(stop_above_ms, profile.latency_offset_ms)
    first_measured = arrivals[warm]
    counted = [a >= first_measured for a in arrivals]
    done, histogram = stage.serve(
        arrivals,
        stage.rows(seed, range(requests)),
        seed=seed,
        counted=counted,
        too_slow_ns=too_slow_ns,
    )
    return figures(
        rate_rps, arrivals, done, counted, histogram, profile.latency_offset_ms, keep_latencies
    )


def arrival_stream(
    rate_rps: float, requests: int, warmup: int | None, seed: int, arrival: ArrivalProcess
) -> tuple[list[int], int]:
    """The arrival times (ns, integers: decide() compares integer ns as the server does) and
    the number of leading arrivals left out of the figures."""
    if rate_rps <= 0:
        raise ValueError("rate_rps must be positive")
    warm = requests // 10 if warmup is None else warmup
    if warm >= requests:
        raise ValueError("warmup must leave some requests to measure")
    return _arrival_times(arrival, rate_rps, seed, requests), warm


def over_goal_ns(stop_above_ms: float | None, offset_ms: float) -> float | None:
    """The queue-and-execution time (ns) above which a request misses ``stop_above_ms``."""
    return None if stop_above_ms is None else (stop_above_ms - offset_ms) * 1e6


class _Stopped(Exception):
    """More than 1 % of the measured requests are certain to miss the goal (the shortcut)."""


def figures(
    rate_rps: float,
    arrivals: list[int],
    done: list[int] | None,
    counted: list[bool],
    histogram: dict[int, int],
    offset_ms: float,
    keep_latencies: bool = False,
) -> Prediction:
    """The figures of one simulated run: ``done`` holds each request's completion (None: the
    run stopped early, every figure is then ``inf``); ``keep_latencies``: with each measured
    request's latency in arrival order."""
    latencies = (
        []
        if done is None
        else [d - a for d, a, c in zip(done, arrivals, counted, strict=True) if c]
    )
    measured = len(latencies)
    if done is None or measured == 0:
        return Prediction(
            rate_rps=rate_rps,
            requests=measured,
            p50_ms=math.inf,
            p99_ms=math.inf,
            mean_ms=math.inf,
            throughput_rps=0.0,
            batch_sizes=histogram,
            saturated=True,
            stopped_early=True,
        )
    kept = tuple(max(0.0, ns / 1e6 + offset_ms) for ns in latencies) if keep_latencies else ()
    latencies.sort()
    first_measured = arrivals[counted.index(True)]
    span = max(1, max(done) - first_measured)
    throughput = measured / (span / 1e9)
    offered = measured / (max(1, arrivals[-1] - first_measured) / 1e9)
    return Prediction(
        rate_rps=rate_rps,
        requests=measured,
        p50_ms=max(0.0, _quantile(latencies, 0.50) / 1e6 + offset_ms),
        p99_ms=max(0.0, _quantile(latencies, 0.99) / 1e6 + offset_ms),
        mean_ms=max(0.0, sum(latencies) / measured / 1e6 + offset_ms),
        throughput_rps=throughput,
        batch_sizes=histogram,
        # Every arrival is served before the run ends, so a rate above capacity shows as a
        # throughput (measured / span until the last completion) well below the rate that
        # arrived (measured / their span: a burst or a lull at the end is not the nominal rate).
        saturated=throughput < 0.9 * offered,
        latencies_ms=kept,
    )


@dataclass(frozen=True)
class Lane:
    """One model's requests into a device that several models may share.

    Attributes:
        stage: The model's batcher and instances (its profile and config).
        arrivals: When each request reaches the model (ns, ascending).
        rows_keys: Each request's table row and batching key (:meth:`Stage.rows`).
        counted: Which requests the figures measure.
        too_slow_ns: Stop the whole run once more than 1 % of this lane's counted requests are
            certain to take longer (from ``origin``); None: never.
        origin: When each request entered the system (default: its arrival here).
    """

    stage: Stage
    arrivals: Sequence[int]
    rows_keys: tuple[list[int], list[Any] | None]
    counted: Sequence[bool]
    too_slow_ns: float | None = None
    origin: Sequence[int] | None = None


class Stage:
    """One model's batcher and instances: the event loop of the module docstring.

    :func:`simulate` runs one; :mod:`analyzer.predict.pipeline_sim` chains several, each
    stage's completions the next one's arrivals; :func:`serve_lanes` runs several models side
    by side on one device.
    """

    def __init__(self, profile: Profile, config: SimConfig) -> None:
        if config.instance_count < 1:
            raise ValueError("instance_count must be >= 1")
        check_modelled(config)
        self.profile = profile
        self.config = config
        tables, self._kind_rows = profile.size_tables(config.largest_items(profile.items))
        # Per row (request size, ascending) and batch size: ns of each phase.
        self.ins = [[round(t.input_ms * 1e6) for t in table] for table in tables]
        self.dev = [[round(t.infer_ms * 1e6) for t in table] for table in tables]
        self.outs = [[round(t.output_ms * 1e6) for t in table] for table in tables]

    def rows(self, seed: int, ids: Sequence[int]) -> tuple[list[int], list[Any] | None]:
        """The table row and batching key of each request ``ids`` names (its index in the
        seed's stream): its kind drawn by the mix's shares, the same at every stage and rate."""
        mix = self.profile.mix
        if mix is None or len(mix.kinds) <= 1:
            return [0] * len(ids), None
        n = max(ids) + 1 if ids else 0
        drawn = draw_kinds(seed + 2, n, tuple(k.share for k in mix.kinds))
        rows = [self._kind_rows[drawn[i]] for i in ids]
        keyed = mix.keyed and not self.config.ragged_batch
        keys = [mix.kinds[drawn[i]].key for i in ids] if keyed else None
        return rows, keys

    def serve(
        self,
        arrivals: Sequence[int],
        rows_keys: tuple[list[int], list[Any] | None],
        *,
        seed: int,
        counted: Sequence[bool],
        too_slow_ns: float | None = None,
        origin: Sequence[int] | None = None,
    ) -> tuple[list[int] | None, dict[int, int]]:
        """Serve ``arrivals`` (ns, ascending) with the device to itself: each request's
        completion time and the batch sizes executed.

        ``counted`` says which requests the figures measure; ``too_slow_ns`` stops the run
        (completions None) once more than 1 % of them are certain to take longer, counted
        from ``origin`` (when each request entered the system; default: its arrival here).
        """
        lane = Lane(self, arrivals, rows_keys, counted, too_slow_ns, origin)
        done, histograms = serve_lanes([lane], seed=seed)
        return (None if done is None else done[0]), histograms[0]


# What the event loop hands a lane's batcher.
_ARRIVAL, _FINISHED, _TIMER = 0, 1, 2
# Execution events on the heap.
_INPUT_DONE, _DEVICE_DONE, _DONE = 0, 1, 2
_NEVER = 1 << 62


def serve_lanes(
    lanes: Sequence[Lane], *, seed: int
) -> tuple[list[list[int]] | None, list[dict[int, int]]]:
    """Serve every lane's arrivals, each lane its model's batcher and instances, every
    instance of every lane on one device: each lane's completion times (None: a lane's
    ``too_slow_ns`` stopped the run) and batch sizes executed.

    The device runs the device phases of every lane's executions one at a time, in the order
    their input phases end (one model's executions are every other model's wait); input and
    output phases overlap. Jitter draws are consumed in event order from one stream.
    """
    count = len(lanes)
    total = sum(len(lane.arrivals) for lane in lanes)
    jitters = [lane.stage.profile.jitter for lane in lanes]
    # Jitter draws, independent of the arrival count: at most three phases per request.
    normals = iter(_normals(seed + 1, 3 * total) if any(j > 0 for j in jitters) else ())
    events: list[tuple[int, int, int, _Batch]] = []  # (time, seq, kind, batch)
    seqs = itertools.count(1)
    dones = [[0] * len(lane.arrivals) for lane in lanes]
    histograms = [
        [0] * (max(lane.stage.config.params().max_batch_size, lane.stage.profile.items) + 1)
        for lane in lanes
    ]
    batchers = [
        _batcher(lane, k, events, seqs, normals, dones[k], histograms[k])
        for k, lane in enumerate(lanes)
    ]
    for batcher in batchers:
        next(batcher)
    # Every lane's arrivals in time order (ties: by lane), and whose each is.
    if count == 1:
        times: Sequence[int] = lanes[0].arrivals
        owners: Sequence[int] = ()
    else:
        merged = sorted((t, k) for k, lane in enumerate(lanes) for t in lane.arrivals)
        times = [t for t, _ in merged]
        owners = [k for _, k in merged]
    devs = [lane.stage.dev for lane in lanes]
    outs = [lane.stage.outs for lane in lanes]
    push, pop = heapq.heappush, heapq.heappop
    device_busy = False
    device_wait: deque[_Batch] = deque()  # batches whose input phase ended, device busy
    timers: list[int | None] = [None] * count
    timer: int | None = None  # the earliest lane timer, and its lane
    timer_lane = 0
    arrived = 0
    t_arrival = times[0] if total else _NEVER

    try:
        while True:
            # The earliest of: execution event, arrival, batcher timer (ties in that order).
            t_event = events[0][0] if events else _NEVER
            now = t_event if t_event <= t_arrival else t_arrival
            if timer is not None and timer < now:
                now = timer
            if now == _NEVER:
                break
            if t_event == now:
                _, _, kind, batch = pop(events)
                if kind == _INPUT_DONE:
                    if device_busy:
                        device_wait.append(batch)
                    else:
                        device_busy = True
                        ns = devs[batch.lane][batch.top][batch.size]
                        jitter = jitters[batch.lane]
                        if jitter > 0:
                            ns = round(ns * (1.0 + jitter * next(normals)))
                            ns = ns if ns > 0 else 0
                        push(events, (now + ns, next(seqs), _DEVICE_DONE, batch))
                    continue
                if kind == _DEVICE_DONE:
                    ns = outs[batch.lane][batch.top][batch.size]
                    jitter = jitters[batch.lane]
                    if jitter > 0:
                        ns = round(ns * (1.0 + jitter * next(normals)))
                        ns = ns if ns > 0 else 0
                    push(events, (now + ns, next(seqs), _DONE, batch))
                    if device_wait:
                        waiting = device_wait.popleft()
                        ns = devs[waiting.lane][waiting.top][waiting.size]
                        jitter = jitters[waiting.lane]
                        if jitter > 0:
                            ns = round(ns * (1.0 + jitter * next(normals)))
                            ns = ns if ns > 0 else 0
                        push(events, (now + ns, next(seqs), _DEVICE_DONE, waiting))
                    else:
                        device_busy = False
                    continue
                k = batch.lane
                woke = batchers[k].send((now, _FINISHED, batch))
            elif t_arrival == now:
                k = owners[arrived] if count > 1 else 0
                arrived += 1
                t_arrival = times[arrived] if arrived < total else _NEVER
                woke = batchers[k].send((now, _ARRIVAL, None))
            else:
                k = timer_lane
                woke = batchers[k].send((now, _TIMER, None))
            if count == 1:
                timer = woke
                continue
            timers[k] = woke
            timer = None
            for j, t in enumerate(timers):
                if t is not None and (timer is None or t < timer):
                    timer, timer_lane = t, j
    except _Stopped:
        return None, [_sizes(h) for h in histograms]
    return dones, [_sizes(h) for h in histograms]


def _sizes(histogram: list[int]) -> dict[int, int]:
    return {b: n for b, n in enumerate(histogram) if n}


def _batcher(
    lane: Lane,
    index: int,
    events: list[tuple[int, int, int, _Batch]],
    seqs: Iterator[int],
    normals: Iterator[float],
    done: list[int],
    histogram: list[int],
) -> Generator[int | None, tuple[int, int, _Batch | None], None]:
    """One lane's batcher and instances, as a coroutine of :func:`serve_lanes`: sent each
    ``(now, what, batch)`` that concerns it (one of its requests arriving, one of its
    executions finished, its timer), it does everything the server does at that instant and
    yields its timer (None: none). Its executions go on ``events`` (the input phase)."""
    stage = lane.stage
    profile, config = stage.profile, stage.config
    ins = stage.ins
    arrivals = lane.arrivals
    rows, keys = lane.rows_keys
    counted = lane.counted
    too_slow_ns = lane.too_slow_ns
    items = profile.items
    keyed = keys is not None
    jitter = profile.jitter

    dynamic = config.dynamic_batching
    params = config.params()
    mbs = params.max_batch_size
    delay_ns = params.max_queue_delay_ns
    merge = delay_ns > 0 and mbs > 1
    scan_limit = mbs + 1
    slots = 2 * config.instance_count
    open_views = [OpenBatch(s, None) for s in range(mbs + 1)]

    # The batcher's queue is always a run of consecutive arrivals: cands[q_head:next_arrival]
    # (without dynamic batching requests go straight to the instance queue: it stays empty).
    # A batch holds its members' indices (in this lane).
    cands: list[Candidate] = []  # made as requests arrive (a stopped run needs fewer)
    q_head = 0
    open_b = _Batch(index)
    iq: deque[_Batch] = deque()
    idle = config.instance_count
    push = heapq.heappush
    timer: int | None = None
    measured_needed = sum(counted)
    too_slow = 0
    too_slow_limit = measured_needed // 100  # more than 1 % over the goal: p99 over it
    # The queued-request shortcut below bisects the arrivals, so it needs them to be the
    # origins (the first stage, or one model alone).
    queued_check = too_slow_ns is not None and lane.origin is None
    origin = arrivals if lane.origin is None else lane.origin
    first_counted = counted.index(True) if measured_needed else len(arrivals)
    first_measured = arrivals[first_counted] if measured_needed else 0
    next_arrival = 0
    # Scheduler.arrival_wakes: the queued size at which an arrival wakes the batcher (0 for
    # a new open batch), and its idle timer while a batch waits for an instance.
    next_preferred = 0
    idle_wait_ns = round(IDLE_WAIT_S * 1e9)

    now, what, finished = yield None
    while True:
        woken = True  # does the batcher step now (an instance taking a batch wakes it)
        if what == _FINISHED:
            # Responses delivered, the instance is idle again.
            assert finished is not None
            for i in finished.arrivals:
                done[i] = now
            if too_slow_ns is not None:
                for i in finished.arrivals:
                    if counted[i] and now - origin[i] > too_slow_ns:
                        too_slow += 1
                if too_slow > too_slow_limit:
                    raise _Stopped
            idle += 1
            woken = False  # a finished execution wakes nobody; taking the next batch does
        elif what == _ARRIVAL:
            if queued_check and next_arrival >= first_counted and q_head < next_arrival:
                # Requests still queued that are already older than the goal count as over.
                assert too_slow_ns is not None
                waited = now - too_slow_ns
                oldest = arrivals[q_head]
                if oldest < waited and oldest >= first_measured:
                    end = min(next_arrival, q_head + too_slow_limit + 1)
                    late = bisect.bisect_left(arrivals, waited, q_head, end) - q_head
                    if late + too_slow > too_slow_limit:
                        raise _Stopped
            if dynamic:
                if keys is None:
                    cands.append(Candidate(items, now))
                else:
                    cands.append(Candidate(items, now, None, keys[next_arrival]))
            else:
                single = _Batch(index)
                single.arrivals.append(next_arrival)
                single.size = items
                single.oldest = now
                single.top = rows[next_arrival]
                iq.append(single)
            next_arrival += 1
            if dynamic:
                woken = (
                    keyed
                    or open_b.sealed
                    or open_b.started
                    or (next_arrival - q_head) * items >= next_preferred
                )
        else:
            # The batcher's timer.
            timer = None

        # Everything the server does at one instant, under its lock, until it would wait
        # (Scheduler._run_steps with prefetching, as the module docstring describes).
        while True:
            # Idle instances take the oldest queued batches, merging those older than the
            # delay.
            while idle and iq:
                woken = True
                batch = iq.popleft()
                batch.started = True
                if merge and not batch.blocked:
                    while iq:
                        nxt = iq[0]
                        if (
                            nxt.blocked
                            or now - nxt.oldest <= delay_ns
                            or batch.size + nxt.size > mbs
                            or nxt.key != batch.key
                        ):
                            break
                        iq.popleft()
                        batch.arrivals.extend(nxt.arrivals)
                        batch.size += nxt.size
                        if nxt.top > batch.top:
                            batch.top = nxt.top
                        nxt.started = True
                idle -= 1
                b = batch.size
                histogram[b] += 1
                ns = ins[batch.top][b]
                if jitter > 0:
                    ns = round(ns * (1.0 + jitter * next(normals)))
                    ns = ns if ns > 0 else 0
                push(events, (now + ns, next(seqs), _INPUT_DONE, batch))
            if not dynamic or not woken:
                break
            changed = False
            wake: int | None = None
            while True:
                if open_b.sealed or open_b.started:
                    open_b = _Batch(index)
                    next_preferred = 0
                if q_head == next_arrival:
                    if next_preferred > 0 and not keyed:  # no arrival may wake it: idle timer
                        wake = now + idle_wait_ns
                    break
                if len(iq) >= slots:
                    break
                end = q_head + scan_limit
                d = decide(
                    cands[q_head : end if end < next_arrival else next_arrival],
                    open_views[open_b.size] if keys is None else OpenBatch(open_b.size, open_b.key),
                    params,
                    now,
                )
                if d.next_preferred is not None:
                    next_preferred = d.next_preferred
                take = d.take
                if take:
                    if not open_b.size:
                        open_b.oldest = arrivals[q_head]
                        if keys is not None:
                            open_b.key = keys[q_head]
                    open_b.arrivals.extend(range(q_head, q_head + take))
                    open_b.size += take * items
                    top = max(rows[q_head : q_head + take])
                    if top > open_b.top:
                        open_b.top = top
                    q_head += take
                    if not open_b.queued:
                        open_b.queued = True
                        iq.append(open_b)
                if d.merge_blocked:
                    open_b.blocked = True
                if d.seal:
                    open_b.sealed = True
                if take or (d.seal and open_b.size):
                    changed = True
                    continue
                wake = d.wake_at_ns
                break
            if not changed:
                timer = wake
                break
        now, what, finished = yield timer


def _quantile(sorted_ns: list[int], q: float) -> float:
    # The nearest-rank quantile, as HDR histograms report it.
    k = max(0, min(len(sorted_ns) - 1, math.ceil(q * len(sorted_ns)) - 1))
    return float(sorted_ns[k])


__all__ = [
    "ASSUMPTIONS",
    "Lane",
    "Stage",
    "arrival_stream",
    "draw_kinds",
    "figures",
    "over_goal_ns",
    "serve_lanes",
    "simulate",
]
