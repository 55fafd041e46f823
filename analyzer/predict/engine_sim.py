"""A generative engine simulated in virtual time: TTFT, ITL, tokens/s and preemptions per config.

The scheduler is not re-implemented: every step calls
:func:`reference_server.batching.iteration.decide_step` and
:func:`~reference_server.batching.iteration.complete_step`, the functions the reference engine
steps in real time, on the limits a config gives (:meth:`EngineProfile.limits
<analyzer.predict.engine_profile.EngineProfile.limits>`: its KV blocks from its memory share).
The loop around them is the engine thread's: requests that arrived by the start of a step join
the waiting queue, the step lasts the profile's cost of what it carries (times
``max(0, 1 + jitter * N(0, 1))``), the next step starts when it ends, and an idle engine waits
for the next arrival. Each sampled token is delivered at the end of its step.

Requests arrive by the scenario's process (``analyzer.measure.arrivals``, as the load generator
draws them) with the load's lengths (:class:`~analyzer.measure.lengths.Lengths`, drawn with the
generator's seed and walked in order, as its users walk them); each generates exactly its
output length (the load asks for ``ignore_eos``). A request that can never run under a config
(:func:`~reference_server.batching.iteration.admissible`: its sequence exceeds the cache, or its
prompt the token budget without chunked prefill) makes the config unservable for that load.

Figures, as :mod:`analyzer.measure.tokens` defines them: TTFT from the arrival (plus the
profile's latency offset), ITL over the gaps between tokens (its p99 plus the profile's
``itl_tail_ms``), end-to-end latency, output tokens/s,
goodput under the goals, and the preemptions the cache forced.

:func:`engine_capacity` is the highest rate meeting TTFT/ITL/end-to-end goals, searched as
:func:`analyzer.predict.capacity.search_rate` searches one model's;
:func:`engine_capacities` runs it for every config of a space.
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from analyzer.measure.arrivals import POISSON, ArrivalProcess
from analyzer.measure.lengths import GenRequest, Lengths
from analyzer.measure.specs import Goals
from analyzer.predict.capacity import run_chains, search_rate
from analyzer.predict.engine_profile import EngineConfig, EngineProfile
from analyzer.predict.sim_records import CapacityPrediction, Prediction
from analyzer.predict.simulator import arrival_stream
from reference_server.batching.iteration import (
    EngineState,
    Seq,
    admissible,
    complete_step,
    decide_step,
)

__all__ = [
    "ENGINE_ASSUMPTIONS",
    "ENGINE_REQUESTS",
    "ENGINE_RESOLUTION",
    "EnginePrediction",
    "engine_capacities",
    "engine_capacity",
    "simulate_engine",
]

ENGINE_ASSUMPTIONS = (
    "scheduling: reference_server.batching.iteration (vLLM V1's rules: running first, then "
    "waiting FCFS; token budget; chunked prefill; KV blocks; recompute preemption)",
    "step time: fixed + prefill per prompt token computed + decode per sequence decoding (the "
    "profile's costs, linear beyond the concurrency the probe measured)",
    "each request generates exactly its output length; TTFT and end-to-end latency carry one "
    "constant offset for what the engine does not see",
    "one engine per config (several instances are not predicted)",
)

#: Requests simulated per rate (warm-up included): 540 measured, so a p99 is the 6th largest.
ENGINE_REQUESTS = 600

#: Resolution of an engine's capacity search: well inside a 10 % band, half the work of 2 %.
ENGINE_RESOLUTION = 0.04

#: A backlog this many times ``max_num_seqs`` (and at least 500) ends a run as saturated.
BACKLOG_FACTOR = 20


@dataclass(frozen=True)
class EnginePrediction(Prediction):
    """One simulated rate of a generative engine (``p50_ms``/``p99_ms``/``mean_ms``: end to end).

    Attributes:
        ttft_p50_ms / ttft_p99_ms: Time to first token.
        itl_p50_ms / itl_p99_ms: Inter-token latency over every gap of every request.
        mean_itl_p50_ms / mean_itl_p99_ms: Over requests, of each request's mean ITL.
        output_tokens_per_s: Output tokens of the measured requests over their span.
        input_tokens / output_tokens: Tokens of the measured requests.
        goodput_rps: Measured requests per second that met every goal.
        good_count: Measured requests that met every goal.
        preemptions: Sequences preempted over the run.
        kv_peak: Highest share of the KV blocks in use after a step.
        unservable: Why no request of the load can run under the config ("" when they can).
    """

    ttft_p50_ms: float = math.inf
    ttft_p99_ms: float = math.inf
    itl_p50_ms: float = math.inf
    itl_p99_ms: float = math.inf
    mean_itl_p50_ms: float = math.inf
    mean_itl_p99_ms: float = math.inf
    output_tokens_per_s: float = 0.0
    input_tokens: int = 0
    output_tokens: int = 0
    goodput_rps: float = 0.0
    good_count: int = 0
    preemptions: int = 0
    kv_peak: float = 0.0
    unservable: str = ""

    def to_dict(self) -> dict[str, Any]:
        def num(x: float) -> float | None:
            return x if math.isfinite(x) else None

        return (
            super().to_dict()
            | {
                "ttft_p50_ms": num(self.ttft_p50_ms),
                "ttft_p99_ms": num(self.ttft_p99_ms),
                "itl_p50_ms": num(self.itl_p50_ms),
                "itl_p99_ms": num(self.itl_p99_ms),
                "output_tokens_per_s": self.output_tokens_per_s,
                "goodput_rps": self.goodput_rps,
                "preemptions": self.preemptions,
                "kv_peak": self.kv_peak,
            }
            | ({"unservable": self.unservable} if self.unservable else {})
        )

    def meets(self, goals: Goals) -> bool:
        """Whether this rate meets ``goals`` (TTFT, ITL and end-to-end p99; error-free)."""
        if self.saturated or self.stopped_early or self.unservable or self.requests == 0:
            return False
        return (
            self.p99_ms <= goals.p99_ms
            and (goals.ttft_p99_ms is None or self.ttft_p99_ms <= goals.ttft_p99_ms)
            and (goals.itl_p99_ms is None or self.itl_p99_ms <= goals.itl_p99_ms)
        )


@dataclass
class _Req:
    arrival_ns: int
    input_tokens: int
    tokens: list[int] = field(default_factory=list)


def simulate_engine(
    profile: EngineProfile,
    config: EngineConfig,
    rate_rps: float,
    lengths: Sequence[GenRequest],
    *,
    requests: int = ENGINE_REQUESTS,
    warmup: int | None = None,
    seed: int = 0,
    goals: Goals | None = None,
    arrival: ArrivalProcess = POISSON,
    keep_latencies: bool = False,
    stop_early: bool = True,
) -> EnginePrediction:
    """Simulate ``requests`` arrivals at ``rate_rps`` on one engine under ``config``.

    Args:
        profile: Step costs and the KV cache.
        config: The engine settings.
        rate_rps: Offered rate.
        lengths: The load's requests, walked in order (cycled).
        requests: Arrivals simulated (warm-up included).
        warmup: Leading arrivals left out of the figures (default: 10 %).
        seed: Seeds the arrivals and the jitter.
        goals: The goals goodput counts; with ``stop_early``, stop as soon as more than 1 % of
            the measured requests are certain to miss the TTFT or end-to-end goal, or 1 % of
            their gaps the ITL goal (the capacity search's shortcut).
        arrival: The arrival process.
        keep_latencies: Keep each measured request's end-to-end latency
            (``latencies_ms``, in arrival order).
        stop_early: Take the shortcut of ``goals`` (False: a whole level, as a load measures).

    Raises:
        ValueError: ``rate_rps`` not positive, or no lengths.
        ProfileError: the config's memory share leaves no room for a cache.
    """
    if not lengths:
        raise ValueError("the load has no requests to simulate")
    limits = profile.limits(config)
    for r in {(g.input_tokens, g.output_tokens) for g in lengths}:
        why = admissible(limits, r[0], r[1])
        if why is not None:
            return _unservable(rate_rps, why)
    arrivals, warm = arrival_stream(rate_rps, requests, warmup, seed, arrival)
    offset_ns = profile.latency_offset_ms * 1e6
    budget = None if goals is None or not stop_early else max(1, int(0.01 * (requests - warm)))
    ttft_goal_ns = (
        math.inf if goals is None or goals.ttft_p99_ms is None else goals.ttft_p99_ms * 1e6
    )
    e2e_goal_ns = math.inf if goals is None else goals.p99_ms * 1e6
    itl_goal_ns = math.inf if goals is None or goals.itl_p99_ms is None else goals.itl_p99_ms * 1e6
    tail_ns = profile.itl_tail_ms * 1e6
    measured_gaps = sum(
        max(0, lengths[i % len(lengths)].output_tokens - 1) for i in range(warm, requests)
    )
    gap_budget = int(0.01 * measured_gaps)
    cost = profile.cost
    jitter = profile.jitter
    gauss = random.Random(seed * 1_000_003 + 7).gauss
    backlog_bound = max(500, BACKLOG_FACTOR * config.max_num_seqs)

    reqs = [_Req(a, lengths[i % len(lengths)].input_tokens) for i, a in enumerate(arrivals)]
    state = EngineState.empty(limits)
    now = 0
    nxt = 0  # next arrival to admit
    preemptions = 0
    peak_blocks = 0
    late_first = late_gaps = late_ends = 0
    stopped = False
    n_lengths = len(lengths)
    while nxt < requests or not state.idle:
        if state.idle and nxt < requests and arrivals[nxt] > now:
            now = arrivals[nxt]
        while nxt < requests and arrivals[nxt] <= now:
            g = lengths[nxt % n_lengths]
            state = state.add(Seq(str(nxt), g.input_tokens, g.output_tokens))
            nxt += 1
        if len(state.waiting) > backlog_bound:
            stopped = True
            break
        step = decide_step(limits, state)
        if step.empty:  # nothing can run (cannot happen for admissible requests)
            stopped = True
            break
        ms = cost.ms(step.prefill_tokens, step.decode_seqs)
        if jitter > 0:
            ms *= max(0.0, 1.0 + jitter * gauss(0.0, 1.0))
        now += int(ms * 1e6)
        preemptions += len(step.preempted)
        done = complete_step(step)
        state = done.state
        used = limits.num_blocks - state.free_blocks
        peak_blocks = max(peak_blocks, used + sum(s.blocks for s in done.finished))
        ended = {q.id for q in done.finished} if budget is not None else set()
        for sid in done.sampled:
            i = int(sid)
            toks = reqs[i].tokens
            toks.append(now)
            if budget is None or i < warm:
                continue
            # Each goal's misses counted apart: more than 1 % of the measured requests (of
            # their gaps, for ITL) beyond a goal put its p99 beyond it, whatever comes next.
            age = now - reqs[i].arrival_ns + offset_ns
            if len(toks) == 1 and age > ttft_goal_ns:
                late_first += 1
            elif len(toks) > 1 and now - toks[-2] + tail_ns > itl_goal_ns:
                late_gaps += 1
            if sid in ended and age > e2e_goal_ns:
                late_ends += 1
            if late_first > budget or late_ends > budget or late_gaps > gap_budget:
                stopped = True
                break
        if stopped:
            break
    if stopped:
        return EnginePrediction(
            rate_rps=rate_rps,
            requests=0,
            p50_ms=math.inf,
            p99_ms=math.inf,
            mean_ms=math.inf,
            throughput_rps=0.0,
            batch_sizes={},
            saturated=True,
            stopped_early=True,
            preemptions=preemptions,
            kv_peak=peak_blocks / limits.num_blocks,
        )
    return _figures(
        rate_rps, reqs[warm:], profile, goals, preemptions, peak_blocks, limits, keep_latencies
    )


def _unservable(rate_rps: float, why: str) -> EnginePrediction:
    return EnginePrediction(
        rate_rps=rate_rps,
        requests=0,
        p50_ms=math.inf,
        p99_ms=math.inf,
        mean_ms=math.inf,
        throughput_rps=0.0,
        batch_sizes={},
        saturated=True,
        unservable=why,
    )


def _figures(
    rate_rps: float,
    measured: list[_Req],
    profile: EngineProfile,
    goals: Goals | None,
    preemptions: int,
    peak_blocks: int,
    limits: Any,
    keep_latencies: bool = False,
) -> EnginePrediction:
    offset_ms = profile.latency_offset_ms
    offset_ns = offset_ms * 1e6
    ttft = sorted(r.tokens[0] - r.arrival_ns for r in measured)
    e2e = sorted(r.tokens[-1] - r.arrival_ns for r in measured)
    gaps: list[int] = []
    means: list[float] = []
    good = 0
    for r in measured:
        t = r.tokens
        gaps.extend(b - a for a, b in itertools.pairwise(t))
        if len(t) > 1:
            means.append((t[-1] - t[0]) / (len(t) - 1))
        if goals is not None:
            first = (t[0] - r.arrival_ns + offset_ns) / 1e6
            last = (t[-1] - r.arrival_ns + offset_ns) / 1e6
            mean_itl = (t[-1] - t[0]) / (len(t) - 1) / 1e6 if len(t) > 1 else 0.0
            if (
                last <= goals.p99_ms
                and (goals.ttft_p99_ms is None or first <= goals.ttft_p99_ms)
                and (goals.itl_p99_ms is None or mean_itl <= goals.itl_p99_ms)
            ):
                good += 1
    gaps.sort()
    means.sort()
    first_arrival = measured[0].arrival_ns
    span_s = max(1, max(r.tokens[-1] for r in measured) - first_arrival) / 1e9
    offered_s = max(1, measured[-1].arrival_ns - first_arrival) / 1e9
    n = len(measured)
    throughput = n / span_s
    tokens = sum(len(r.tokens) for r in measured)

    def ms(sorted_ns: Sequence[float], q: float, offset: float) -> float:
        if not sorted_ns:
            return 0.0
        # The nearest-rank quantile, as HDR histograms (and the batcher's simulator) report it.
        k = max(0, min(len(sorted_ns) - 1, math.ceil(q * len(sorted_ns)) - 1))
        return sorted_ns[k] / 1e6 + offset

    return EnginePrediction(
        rate_rps=rate_rps,
        requests=n,
        p50_ms=ms(e2e, 0.50, offset_ms),
        p99_ms=ms(e2e, 0.99, offset_ms),
        mean_ms=sum(e2e) / n / 1e6 + offset_ms,
        throughput_rps=throughput,
        batch_sizes={},
        saturated=throughput < 0.9 * (n / offered_s),
        ttft_p50_ms=ms(ttft, 0.50, offset_ms),
        ttft_p99_ms=ms(ttft, 0.99, offset_ms),
        itl_p50_ms=ms(gaps, 0.50, 0.0),
        itl_p99_ms=ms(gaps, 0.99, profile.itl_tail_ms),
        mean_itl_p50_ms=ms(means, 0.50, 0.0),
        mean_itl_p99_ms=ms(means, 0.99, 0.0),
        output_tokens_per_s=tokens / span_s,
        input_tokens=sum(r.input_tokens for r in measured),
        output_tokens=tokens,
        goodput_rps=good / span_s if goals is not None else 0.0,
        good_count=good,
        latencies_ms=tuple((r.tokens[-1] - r.arrival_ns) / 1e6 + offset_ms for r in measured)
        if keep_latencies
        else (),
        preemptions=preemptions,
        kv_peak=peak_blocks / limits.num_blocks,
    )


def peak_rps(profile: EngineProfile, config: EngineConfig, lengths: Sequence[GenRequest]) -> float:
    """A noise-free bound on the rate ``config`` sustains: every step full of decodes at
    ``max_num_seqs`` (or as many as the token budget or the cache hold), every prompt token
    prefilled once; no rate above it can be served."""
    n = len(lengths)
    mean_in = sum(g.input_tokens for g in lengths) / n
    mean_out = sum(g.output_tokens for g in lengths) / n
    limits = profile.limits(config)
    per_seq_tokens = mean_in + mean_out
    cache_seqs = max(1, int(limits.num_blocks * limits.block_size / max(per_seq_tokens, 1)))
    seqs = max(1, min(config.max_num_seqs, config.max_num_batched_tokens, cache_seqs))
    c = profile.cost
    # A request needs mean_out decode slots in steps of `seqs` and its prompt's prefill.
    per_request_ms = (
        mean_out * (c.fixed_ms / seqs + c.decode_ms_per_seq) + mean_in * c.prefill_ms_per_token
    )
    return 1000.0 / per_request_ms if per_request_ms > 0 else math.inf


def engine_capacity(
    profile: EngineProfile,
    config: EngineConfig,
    goals: Goals,
    lengths: Sequence[GenRequest],
    *,
    requests: int = ENGINE_REQUESTS,
    seed: int = 0,
    resolution: float = 0.02,
    start_rps: float | None = None,
    ceiling_rps: float = math.inf,
    arrival: ArrivalProcess = POISSON,
) -> CapacityPrediction:
    """The highest rate whose simulation meets ``goals`` (TTFT, ITL and end-to-end p99), in
    ``[1 % of the peak, min(peak, ceiling_rps)]`` (:func:`peak_rps`), searched as one model's
    capacity is (:func:`~analyzer.predict.capacity.search_rate`: a bracket around
    ``start_rps``, then bisection; the same seed at every rate)."""
    bound = peak_rps(profile, config, lengths)

    def run(rate: float) -> Prediction:
        return simulate_engine(
            profile,
            config,
            rate,
            lengths,
            requests=requests,
            seed=seed,
            goals=goals,
            arrival=arrival,
        )

    def judge(pred: Prediction) -> bool:
        return isinstance(pred, EnginePrediction) and pred.meets(goals)

    return search_rate(
        run,
        goals.p99_ms,
        bound,
        resolution,
        start_rps=start_rps,
        ceiling_rps=ceiling_rps,
        judge=judge,
    )


def engine_capacities(
    profile: EngineProfile,
    configs: Iterable[EngineConfig],
    goals: Goals,
    lengths: Lengths | Sequence[GenRequest],
    *,
    requests: int = ENGINE_REQUESTS,
    seed: int = 0,
    resolution: float = 0.02,
    workers: int = 1,
    ceiling_rps: float = math.inf,
    arrival: ArrivalProcess = POISSON,
) -> dict[EngineConfig, CapacityPrediction]:
    """:func:`engine_capacity` of every config, each search started at the previous config's
    answer along a chain of configs that differ in ``max_num_seqs`` alone (one chain per memory
    share, chunked prefill and token budget); ``workers > 1`` runs the chains in that many
    processes (same answers).

    Raises:
        ProfileError: some config leaves no room for a KV cache (before any simulation).
    """
    drawn = lengths.draw(seed) if isinstance(lengths, Lengths) else list(lengths)
    todo = sorted(
        set(configs),
        key=lambda c: (
            c.gpu_memory_utilization,
            c.enable_chunked_prefill,
            c.block_size,
            c.max_num_batched_tokens,
            c.max_num_seqs,
        ),
    )
    for config in todo:
        profile.limits(config)
    if not todo:
        return {}
    groups: dict[tuple[Any, ...], list[EngineConfig]] = {}
    for c in todo:
        key = (
            c.gpu_memory_utilization,
            c.enable_chunked_prefill,
            c.block_size,
            c.max_num_batched_tokens,
        )
        groups.setdefault(key, []).append(c)
    chains = list(groups.values())
    out: dict[EngineConfig, CapacityPrediction] = {}
    # Every chain starts at the same running set, whose capacity moves little with the token
    # budget: the first chain's head, searched once from nothing, starts every other head.
    head = _chain(
        chains[0][:1], profile, goals, drawn, requests, seed, resolution, ceiling_rps, arrival
    )
    out.update(head)
    first = head[chains[0][0]].capacity_rps
    chains = [c for c in (chains[0][1:], *chains[1:]) if c]
    start = first if first > 0 else None
    args = (profile, goals, drawn, requests, seed, resolution, ceiling_rps, arrival, start)
    if chains:
        out.update(run_chains(_chain, chains, args, workers))
    return out


def _chain(
    chain: list[EngineConfig],
    profile: EngineProfile,
    goals: Goals,
    lengths: list[GenRequest],
    requests: int,
    seed: int,
    resolution: float,
    ceiling_rps: float,
    arrival: ArrivalProcess,
    hint: float | None = None,
) -> dict[EngineConfig, CapacityPrediction]:
    out: dict[EngineConfig, CapacityPrediction] = {}
    for config in chain:
        cap = engine_capacity(
            profile,
            config,
            goals,
            lengths,
            requests=requests,
            seed=seed,
            resolution=resolution,
            start_rps=hint,
            ceiling_rps=ceiling_rps,
            arrival=arrival,
        )
        out[config] = cap
        hint = cap.capacity_rps if cap.capacity_rps > 0 else None
    return out
