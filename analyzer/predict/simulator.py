"""A discrete-event simulator of the reference server's dynamic batcher.

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

Assumptions (:data:`ASSUMPTIONS`, printed by ``perfsweep predict``): Poisson arrivals of
requests of the profile's mix (batch-1 requests of one size without one), independent of each
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
import math
import random
import statistics
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from itertools import accumulate
from typing import TYPE_CHECKING, Any

from analyzer.errors import InputError
from analyzer.predict import ExtrapolationError
from analyzer.predict.profile import Profile
from reference_server.batching.decide import (
    IDLE_WAIT_S,
    BatchingParams,
    Candidate,
    OpenBatch,
    decide,
)

if TYPE_CHECKING:
    from tritonclient.grpc import model_config_pb2 as mc

    from analyzer.config.knobs import Knobs

ASSUMPTIONS = (
    "arrivals: Poisson (seeded); each request's size drawn from the load's data (the profile's "
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
    "work the backend reports inside compute_infer, measured by the interference probe)",
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
        queue_policy: The config sets priority levels or a queue policy, which the simulator
            does not model (:func:`check_modelled` refuses it).
    """

    max_batch_size: int
    max_queue_delay_us: int = 0
    preferred_batch_size: tuple[int, ...] = ()
    instance_count: int = 1
    dynamic_batching: bool = True
    queue_policy: bool = False

    @property
    def largest_batch(self) -> int:
        """The largest execution this config can produce (of one-item requests)."""
        return max(1, self.max_batch_size) if self.dynamic_batching else 1

    def largest_items(self, items: int = 1) -> int:
        """The largest execution with requests of ``items`` batch items each: without dynamic
        batching, one request."""
        return max(1, self.max_batch_size) if self.dynamic_batching else max(1, items)

    def params(self) -> BatchingParams:
        """The batcher's parameters after Triton's normalisation."""
        mbs = max(1, self.max_batch_size)
        preferred = frozenset(self.preferred_batch_size) or frozenset({mbs})
        return BatchingParams(mbs, preferred, self.max_queue_delay_us * 1000)

    @classmethod
    def from_knobs(cls, knobs: Knobs) -> SimConfig:
        """From a run's config (a record's :class:`analyzer.config.knobs.Knobs`)."""
        return cls(
            max_batch_size=knobs.max_batch_size,
            max_queue_delay_us=knobs.max_queue_delay_us,
            preferred_batch_size=tuple(knobs.preferred_batch_size),
            instance_count=knobs.instance_count,
            dynamic_batching=knobs.dynamic_batching,
            queue_policy=knobs.queue_policy is not None and not knobs.queue_policy.fifo,
        )

    @classmethod
    def from_model_config(cls, config: mc.ModelConfig) -> SimConfig:
        """From a server's model config (``GET /v2/models/<m>/config``, parsed)."""
        from analyzer.config.model_config import instances_of

        dynamic = config.HasField("dynamic_batching")
        batching = config.dynamic_batching
        return cls(
            max_batch_size=max(1, config.max_batch_size),
            max_queue_delay_us=int(batching.max_queue_delay_microseconds) if dynamic else 0,
            preferred_batch_size=tuple(batching.preferred_batch_size) if dynamic else (),
            # Triton's counting: a KIND_GPU group runs its count on each listed GPU.
            instance_count=sum(instances_of(g) for g in config.instance_group) or 1,
            dynamic_batching=dynamic and config.max_batch_size > 0,
            # A default policy equal to Triton's own serialises to nothing.
            queue_policy=dynamic
            and bool(
                batching.priority_levels
                or batching.priority_queue_policy
                or batching.default_queue_policy.ByteSize()
            ),
        )

    def describe(self) -> str:
        """One line, as the console prints it."""
        if not self.dynamic_batching:
            return f"no dynamic batching, {self.instance_count} instance(s)"
        pref = ",".join(map(str, self.preferred_batch_size)) or f"{self.max_batch_size} (default)"
        return (
            f"max_batch_size {self.max_batch_size}, max_queue_delay_us {self.max_queue_delay_us}, "
            f"preferred {pref}, {self.instance_count} instance(s)"
            + (", priority levels or a queue policy" if self.queue_policy else "")
        )


def check_modelled(config: SimConfig) -> None:
    """Refuse a config the simulator would predict wrongly.

    Raises:
        InputError: the config sets priority levels or a queue policy.
    """
    if config.queue_policy:
        raise InputError(
            f"cannot predict {config.describe()}: the simulator models one FIFO queue without "
            "timeouts, not priority levels or queue policies; measure this config instead"
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
    __slots__ = (
        "arrivals",
        "blocked",
        "key",
        "oldest",
        "queued",
        "sealed",
        "size",
        "started",
        "top",
    )

    def __init__(self) -> None:
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


@functools.lru_cache(maxsize=16)
def _unit_gaps(seed: int, n: int) -> tuple[float, ...]:
    """The seed's first ``n`` unit-mean exponential gaps (common to every rate and config)."""
    expo = random.Random(seed).expovariate
    return tuple(expo(1.0) for _ in range(n))


@functools.lru_cache(maxsize=16)
def _kinds(seed: int, n: int, shares: tuple[float, ...]) -> tuple[int, ...]:
    """The seed's first ``n`` request kinds drawn by ``shares`` (common to every rate and
    config; one kind: all 0)."""
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
) -> Prediction:
    """Simulate ``requests`` Poisson arrivals at ``rate_rps`` through ``config``.

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

    Raises:
        ExtrapolationError: the config can execute batches the profile does not cover.
        InputError: the config sets priority levels or a queue policy (:func:`check_modelled`).
    """
    if rate_rps <= 0:
        raise ValueError("rate_rps must be positive")
    if config.instance_count < 1:
        raise ValueError("instance_count must be >= 1")
    check_modelled(config)
    items = profile.items
    tables, kind_rows = profile.size_tables(config.largest_items(items))
    # Per row (request size, ascending) and batch size: ns of each phase.
    ins = [[round(t.input_ms * 1e6) for t in table] for table in tables]
    dev = [[round(t.infer_ms * 1e6) for t in table] for table in tables]
    outs = [[round(t.output_ms * 1e6) for t in table] for table in tables]
    mix = profile.mix
    keyed = mix is not None and mix.keyed
    if mix is not None and len(mix.kinds) > 1:
        drawn = _kinds(seed + 2, requests, tuple(k.share for k in mix.kinds))
        rows = [kind_rows[k] for k in drawn]
        keys = [mix.kinds[k].key for k in drawn] if keyed else None
    else:
        rows = [0] * requests
        keys = None
    jitter = profile.jitter
    warm = requests // 10 if warmup is None else warmup
    if warm >= requests:
        raise ValueError("warmup must leave some requests to measure")

    # Arrival times (ns, integers: decide() compares integer ns as the server does). The unit
    # gaps are the same at every rate (common random numbers), so they are drawn once per seed.
    mean_gap_ns = 1e9 / rate_rps
    arrivals = [int(t) for t in accumulate(g * mean_gap_ns for g in _unit_gaps(seed, requests))]
    # Jitter draws, independent of the arrival count: at most three phases per request.
    normals = _normals(seed + 1, 3 * requests) if jitter > 0 else ()
    draw = 0

    dynamic = config.dynamic_batching
    params = config.params()
    mbs = params.max_batch_size
    delay_ns = params.max_queue_delay_ns
    merge = delay_ns > 0 and mbs > 1
    scan_limit = mbs + 1
    slots = 2 * config.instance_count
    open_views = [OpenBatch(s, None) for s in range(mbs + 1)]
    largest = max(mbs, items)

    # The batcher's queue is always a run of consecutive arrivals: cands[q_head:next_arrival]
    # (without dynamic batching requests go straight to the instance queue: it stays empty).
    cands: list[Candidate] = []  # made as requests arrive (a stopped run needs fewer)
    q_head = 0
    open_b = _Batch()
    iq: deque[_Batch] = deque()
    idle = config.instance_count
    device_busy = False
    device_wait: deque[_Batch] = deque()  # batches whose input phase ended, device busy
    events: list[tuple[int, int, int, _Batch]] = []  # (time, seq, kind, batch)
    push, pop = heapq.heappush, heapq.heappop
    seq = 0
    timer: int | None = None
    histogram = [0] * (largest + 1)
    latencies: list[int] = []
    measured_needed = requests - warm
    offset_ms = profile.latency_offset_ms
    too_slow_ns = None if stop_above_ms is None else (stop_above_ms - offset_ms) * 1e6
    too_slow = 0
    too_slow_limit = measured_needed // 100  # more than 1 % over the goal: p99 over it
    first_measured = arrivals[warm]
    last_completion = 0
    stopped = False
    KIND_INPUT_DONE, KIND_DEVICE_DONE, KIND_DONE = 0, 1, 2
    NEVER = 1 << 62
    next_arrival = 0
    t_arrival = arrivals[0]
    # Scheduler.arrival_wakes: the queued size at which an arrival wakes the batcher (0 for
    # a new open batch), and its idle timer while a batch waits for an instance.
    next_preferred = 0
    idle_wait_ns = round(IDLE_WAIT_S * 1e9)

    while True:
        # The earliest of: execution event, arrival, batcher timer (ties in that order).
        t_event = events[0][0] if events else NEVER
        now = t_event if t_event <= t_arrival else t_arrival
        if timer is not None and timer < now:
            now = timer
        if now == NEVER:
            break
        woken = True  # does the batcher step at this instant (an instance taking a batch wakes it)
        if t_event == now:
            _, _, kind, batch = pop(events)
            if kind == KIND_INPUT_DONE:
                if device_busy:
                    device_wait.append(batch)
                else:
                    device_busy = True
                    ns = dev[batch.top][batch.size]
                    if jitter > 0:
                        ns = round(ns * (1.0 + jitter * normals[draw]))
                        ns = ns if ns > 0 else 0
                        draw += 1
                    seq += 1
                    push(events, (now + ns, seq, KIND_DEVICE_DONE, batch))
                continue
            if kind == KIND_DEVICE_DONE:
                ns = outs[batch.top][batch.size]
                if jitter > 0:
                    ns = round(ns * (1.0 + jitter * normals[draw]))
                    ns = ns if ns > 0 else 0
                    draw += 1
                seq += 1
                push(events, (now + ns, seq, KIND_DONE, batch))
                if device_wait:
                    waiting = device_wait.popleft()
                    ns = dev[waiting.top][waiting.size]
                    if jitter > 0:
                        ns = round(ns * (1.0 + jitter * normals[draw]))
                        ns = ns if ns > 0 else 0
                        draw += 1
                    seq += 1
                    push(events, (now + ns, seq, KIND_DEVICE_DONE, waiting))
                else:
                    device_busy = False
                continue
            # KIND_DONE: responses delivered, the instance is idle again.
            if too_slow_ns is None:
                latencies.extend(now - a for a in batch.arrivals if a >= first_measured)
            else:
                for a in batch.arrivals:
                    if a >= first_measured:
                        lat = now - a
                        latencies.append(lat)
                        if lat > too_slow_ns:
                            too_slow += 1
            last_completion = now
            idle += 1
            if too_slow > too_slow_limit:
                stopped = True
                break
            woken = False  # a finished execution wakes nobody; taking the next batch does
        elif t_arrival == now:
            if too_slow_ns is not None and next_arrival >= warm and q_head < next_arrival:
                # Requests still queued that are already older than the goal count as over it.
                waited = now - too_slow_ns
                oldest = arrivals[q_head]
                if oldest < waited and oldest >= first_measured:
                    end = min(next_arrival, q_head + too_slow_limit + 1)
                    late = bisect.bisect_left(arrivals, waited, q_head, end) - q_head
                    if late + too_slow > too_slow_limit:
                        stopped = True
                        break
            if dynamic:
                if keys is None:
                    cands.append(Candidate(items, now))
                else:
                    cands.append(Candidate(items, now, None, keys[next_arrival]))
            else:
                single = _Batch()
                single.arrivals.append(now)
                single.size = items
                single.oldest = now
                single.top = rows[next_arrival]
                iq.append(single)
            next_arrival += 1
            t_arrival = arrivals[next_arrival] if next_arrival < requests else NEVER
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
            # Idle instances take the oldest queued batches, merging those older than the delay.
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
                    ns = round(ns * (1.0 + jitter * normals[draw]))
                    ns = ns if ns > 0 else 0
                    draw += 1
                seq += 1
                push(events, (now + ns, seq, KIND_INPUT_DONE, batch))
            if not dynamic or not woken:
                break
            changed = False
            wake: int | None = None
            while True:
                if open_b.sealed or open_b.started:
                    open_b = _Batch()
                    next_preferred = 0
                if q_head == next_arrival:
                    if next_preferred > 0 and not keyed:  # arrivals may not wake it: the idle timer
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
                    open_b.arrivals.extend(arrivals[q_head : q_head + take])
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

    batch_sizes = {b: n for b, n in enumerate(histogram) if n}
    measured = len(latencies)
    if stopped or measured == 0:
        return Prediction(
            rate_rps=rate_rps,
            requests=measured,
            p50_ms=math.inf,
            p99_ms=math.inf,
            mean_ms=math.inf,
            throughput_rps=0.0,
            batch_sizes=batch_sizes,
            saturated=True,
            stopped_early=True,
        )
    latencies.sort()
    span = max(1, last_completion - first_measured)
    throughput = measured / (span / 1e9)
    return Prediction(
        rate_rps=rate_rps,
        requests=measured,
        p50_ms=max(0.0, _quantile(latencies, 0.50) / 1e6 + offset_ms),
        p99_ms=max(0.0, _quantile(latencies, 0.99) / 1e6 + offset_ms),
        mean_ms=max(0.0, sum(latencies) / measured / 1e6 + offset_ms),
        throughput_rps=throughput,
        batch_sizes=batch_sizes,
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
    start_rps: float | None = None,
    ceiling_rps: float = math.inf,
) -> CapacityPrediction:
    """Search the rate for the highest one whose simulated p99 is <= ``p99_ms``.

    The search lies in ``[min_rps, peak]`` where ``peak`` is the profile's noise-free
    throughput bound for the config (no rate above it can be sustained). Without
    ``start_rps`` it bisects that bracket, simulating its ends only when the answer needs
    them. With ``start_rps`` (a neighbouring config's capacity, say) it first brackets the
    answer around it with steps that double in log-rate from ``1 + resolution``, then
    bisects: a start within the resolution needs two simulated rates instead of eight. Every rate
    is simulated with the same seed (common random numbers, so p99 is monotone in the rate
    up to jitter).

    Args:
        profile: Execution times.
        config: The config.
        p99_ms: The goal.
        requests: Arrivals per simulated rate.
        seed: Seed of every simulation.
        resolution: Stop when the bracket is narrower than this share of the capacity.
        min_rps: Lowest rate tried (default: 1 % of the peak).
        start_rps: Where to start looking (clipped into the bracket); None = bisection.
        ceiling_rps: No rate above this is of interest (the sweep offers no more): the
            search's upper end is ``min(peak, ceiling_rps)``, so a config that passes there
            costs one simulated rate.

    Raises:
        ExtrapolationError: the config needs batch sizes beyond the profile.
    """
    if p99_ms <= 0:
        raise ValueError("p99_ms must be positive")
    bound = profile.peak_rps(config.largest_items(profile.items), config.instance_count)
    lo_rate = min_rps if min_rps is not None else bound * 0.01
    peak = min(bound, ceiling_rps)
    steps: list[tuple[float, float]] = []

    def passes(rate: float) -> tuple[bool, Prediction]:
        pred = simulate(profile, config, rate, requests=requests, seed=seed, stop_above_ms=p99_ms)
        steps.append((rate, pred.p99_ms))
        # A rate the system cannot keep up with never passes, whatever the sample's p99.
        ok = pred.p99_ms <= p99_ms and not pred.saturated
        return ok, pred

    # Invariant: every rate <= lo passes (lo_rate is assumed to until tested, below) and every
    # rate >= hi fails (peak is assumed to until tested).
    lo, hi = lo_rate, peak
    best: Prediction | None = None
    hi_tested = False
    if start_rps is not None and lo_rate < start_rps < peak:
        factor = 1.0 + resolution
        ok, pred = passes(start_rps)
        if ok:
            lo, best = start_rps, pred
            while True:
                rate = lo * factor
                if rate >= peak:
                    break
                ok, pred = passes(rate)
                if not ok:
                    hi, hi_tested = rate, True
                    break
                lo, best = rate, pred
                factor *= factor
        else:
            hi, hi_tested = start_rps, True
            while True:
                rate = hi / factor
                if rate <= lo_rate:
                    break
                ok, pred = passes(rate)
                if ok:
                    lo, best = rate, pred
                    break
                hi = rate
                factor *= factor
    if not hi_tested:
        ok, pred = passes(peak)
        if ok:
            return CapacityPrediction(p99_ms, peak, pred, peak, tuple(steps))
    # (The tolerance keeps a bracket of exactly one resolution, ``lo * (1 + resolution)``,
    # from counting as wider through rounding.)
    while hi - lo > resolution * lo * (1.0 + 1e-9):
        mid = (lo + hi) / 2
        ok, pred = passes(mid)
        if ok:
            lo, best = mid, pred
        else:
            hi = mid
    if best is None:
        # Nothing above the lowest rate passed: only now does the lowest rate need its run.
        ok, pred = passes(lo_rate)
        if not ok:
            return CapacityPrediction(p99_ms, 0.0, None, lo_rate, tuple(steps))
        lo, best = lo_rate, pred
    return CapacityPrediction(p99_ms, lo, best, hi, tuple(steps))


def latency_offset(
    profile: Profile,
    points: Iterable[tuple[SimConfig, float, float]],
    *,
    requests: int = 3000,
    seed: int = 0,
) -> float | None:
    """The latency the simulator does not see, from measured operating points.

    Each point is ``(config, rate, measured p99)``: the p99 a sweep measured at that Poisson
    rate. The offset is the median over the points of the measured minus the simulated p99 at
    the same rate (simulated without any offset), so ``replace(profile, latency_offset_ms=...)``
    predicts what was measured. Points the profile cannot simulate (batches beyond it, a
    priority or queue policy, a rate it saturates at, no finite p99) are skipped; None when
    none is left.
    """
    base = replace(profile, latency_offset_ms=0.0)
    gaps: list[float] = []
    for config, rate, p99_ms in points:
        covered = base.covers(config.largest_items(base.items)) and not config.queue_policy
        if rate <= 0 or not math.isfinite(p99_ms) or not covered:
            continue
        sim = simulate(base, config, rate, requests=requests, seed=seed)
        if not sim.saturated and math.isfinite(sim.p99_ms):
            gaps.append(p99_ms - sim.p99_ms)
    return statistics.median(gaps) if gaps else None


def _equivalence_key(config: SimConfig) -> tuple[Any, ...]:
    """Configs with the same key simulate identically (same batches, same timings)."""
    if not config.dynamic_batching:
        return (False, config.instance_count)
    params = config.params()
    if params.max_batch_size == 1:
        # Every batch is one request: the delay and preferred sizes change nothing.
        return (True, 1, config.instance_count)
    return (True, params, config.instance_count)


def capacities(
    profile: Profile,
    configs: Iterable[SimConfig],
    p99_ms: float,
    *,
    requests: int = 3000,
    seed: int = 0,
    resolution: float = 0.02,
    workers: int = 1,
    ceiling_rps: float = math.inf,
) -> dict[SimConfig, CapacityPrediction]:
    """:func:`capacity` of every config, fast enough for a whole search space.

    Configs are grouped by instance count (and dynamic batching or not); within a group they
    are visited in an order where neighbours differ in one knob (max batch size, preferred
    sizes, queue delay), and each search starts from the previous config's capacity. Configs
    that simulate identically (:func:`_equivalence_key`: e.g. every delay at
    ``max_batch_size`` 1) are simulated once. Groups are independent, so ``workers > 1``
    runs them in that many processes with the same answers. ``ceiling_rps``: as in
    :func:`capacity` (configs at or above it cost one simulated rate each).

    Raises:
        ExtrapolationError: some config needs batch sizes beyond the profile (before any
            simulation).
        InputError: some config sets priority levels or a queue policy (before any
            simulation).
    """
    groups: dict[tuple[bool, int], list[SimConfig]] = {}
    for config in set(configs):
        profile.check_covers(config.largest_items(profile.items))
        check_modelled(config)
        groups.setdefault((config.dynamic_batching, config.instance_count), []).append(config)
    chains = [
        sorted(g, key=lambda c: (c.max_batch_size, c.preferred_batch_size, c.max_queue_delay_us))
        for _, g in sorted(groups.items())
    ]
    args = (profile, p99_ms, requests, seed, resolution, ceiling_rps)
    out: dict[SimConfig, CapacityPrediction] = {}
    if workers > 1 and len(chains) > 1:
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(max_workers=min(workers, len(chains))) as pool:
            for part in pool.map(_chain, chains, *zip(*[args] * len(chains), strict=True)):
                out.update(part)
    else:
        for chain in chains:
            out.update(_chain(chain, *args))
    return out


def _chain(
    chain: list[SimConfig],
    profile: Profile,
    p99_ms: float,
    requests: int,
    seed: int,
    resolution: float,
    ceiling_rps: float = math.inf,
) -> dict[SimConfig, CapacityPrediction]:
    """One group of :func:`capacities`, each search warm-started at the previous answer."""
    done: dict[tuple[Any, ...], CapacityPrediction] = {}
    out: dict[SimConfig, CapacityPrediction] = {}
    hint: float | None = None
    for config in chain:
        key = _equivalence_key(config)
        cap = done.get(key)
        if cap is None:
            cap = capacity(
                profile,
                config,
                p99_ms,
                requests=requests,
                seed=seed,
                resolution=resolution,
                start_rps=hint,
                ceiling_rps=ceiling_rps,
            )
            done[key] = cap
        out[config] = cap
        hint = cap.capacity_rps if cap.capacity_rps > 0 else None
    return out


__all__ = [
    "ASSUMPTIONS",
    "CapacityPrediction",
    "ExtrapolationError",
    "Prediction",
    "SimConfig",
    "capacities",
    "capacity",
    "check_modelled",
    "latency_offset",
    "simulate",
]
