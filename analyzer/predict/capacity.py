"""The simulated capacity: the highest rate whose simulated p99 meets a goal.

:func:`capacity` bisects (or brackets around a start) over :func:`~analyzer.predict.simulator.
simulate`; :func:`capacities` does so for every config of a space, sharing the work of
equivalent configs; :func:`latency_offset` calibrates the constant the server does not see.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import Any, TypeVar

from analyzer.measure.arrivals import POISSON, ArrivalProcess
from analyzer.predict.profile import Profile
from analyzer.predict.sim_records import CapacityPrediction, Prediction, SimConfig, check_modelled
from analyzer.predict.simulator import simulate
from analyzer.target.supervise import worker_pool

#: A config of any kind (one model's, a pipeline's stages, a mix's models).
C = TypeVar("C")

__all__ = [
    "capacities",
    "capacity",
    "chained",
    "equivalence_key",
    "latency_offset",
    "search_rate",
]


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
    arrival: ArrivalProcess = POISSON,
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
        arrival: The arrival process simulated (Poisson by default).

    Raises:
        ExtrapolationError: the config needs batch sizes beyond the profile.
    """
    if p99_ms <= 0:
        raise ValueError("p99_ms must be positive")
    bound = profile.peak_rps(config.largest_items(profile.items), config.instance_count)

    def run(rate: float) -> Prediction:
        return simulate(
            profile,
            config,
            rate,
            requests=requests,
            seed=seed,
            stop_above_ms=p99_ms,
            arrival=arrival,
        )

    return search_rate(run, p99_ms, bound, resolution, min_rps, start_rps, ceiling_rps)


def search_rate(
    run: Callable[[float], Prediction],
    p99_ms: float,
    bound: float,
    resolution: float,
    min_rps: float | None = None,
    start_rps: float | None = None,
    ceiling_rps: float = math.inf,
    judge: Callable[[Prediction], bool] | None = None,
) -> CapacityPrediction:
    """The search of :func:`capacity` over any simulation ``run(rate)`` whose noise-free
    throughput bound is ``bound`` (one model's, a pipeline's, or a generative engine's).

    ``judge`` says whether a rate passes when more than its p99 is judged (a generative
    engine's TTFT and ITL goals); by default a rate passes when its p99 is within ``p99_ms``
    and it is not saturated."""
    lo_rate = min_rps if min_rps is not None else bound * 0.01
    peak = min(bound, ceiling_rps)
    steps: list[tuple[float, float]] = []

    def passes(rate: float) -> tuple[bool, Prediction]:
        pred = run(rate)
        steps.append((rate, pred.p99_ms))
        # A rate the system cannot keep up with never passes, whatever the sample's p99.
        ok = judge(pred) if judge is not None else pred.p99_ms <= p99_ms and not pred.saturated
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
    arrival: ArrivalProcess = POISSON,
) -> float | None:
    """The latency the simulator does not see, from measured operating points.

    Each point is ``(config, rate, measured p99)``: the p99 a sweep measured at that rate of
    ``arrival``. The offset is the median over the points of the measured minus the simulated p99 at
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
        sim = simulate(base, config, rate, requests=requests, seed=seed, arrival=arrival)
        if not sim.saturated and math.isfinite(sim.p99_ms):
            gaps.append(p99_ms - sim.p99_ms)
    return statistics.median(gaps) if gaps else None


def chained(
    configs: Iterable[C], search: Callable[[C, float | None], CapacityPrediction]
) -> list[CapacityPrediction]:
    """``search(config, start_rps)`` of each config in order, each started at the previous
    answer (None first, and after a config with no capacity): neighbouring configs' capacities
    are close, so a warm start needs few simulated rates."""
    out: list[CapacityPrediction] = []
    hint: float | None = None
    for config in configs:
        cap = search(config, hint)
        out.append(cap)
        hint = cap.capacity_rps if cap.capacity_rps > 0 else None
    return out


def equivalence_key(config: SimConfig) -> tuple[Any, ...]:
    """Configs with the same key simulate identically (same batches, same timings)."""
    if not config.dynamic_batching:
        return (False, config.instance_count)
    params = config.params()
    if params.max_batch_size == 1:
        # Every batch is one request: the delay and preferred sizes change nothing.
        return (True, 1, config.instance_count)
    return (True, params, config.instance_count, config.ragged_batch)


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
    arrival: ArrivalProcess = POISSON,
) -> dict[SimConfig, CapacityPrediction]:
    """:func:`capacity` of every config, fast enough for a whole search space.

    Configs are grouped by instance count (and dynamic batching or not); within a group they
    are visited in an order where neighbours differ in one knob (max batch size, preferred
    sizes, queue delay), and each search starts from the previous config's capacity. Configs
    that simulate identically (:func:`equivalence_key`: e.g. every delay at
    ``max_batch_size`` 1) are simulated once. Groups are independent, so ``workers > 1``
    runs them in that many processes with the same answers. ``ceiling_rps``: as in
    :func:`capacity` (configs at or above it cost one simulated rate each); ``arrival``: the
    process simulated.

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
    args = (profile, p99_ms, requests, seed, resolution, ceiling_rps, arrival)
    return run_chains(_chain, chains, args, workers)


def run_chains(
    chain_fn: Callable[..., dict[C, CapacityPrediction]],
    chains: list[list[C]],
    args: tuple[Any, ...],
    workers: int,
) -> dict[C, CapacityPrediction]:
    """``chain_fn(chain, *args)`` for every chain (warm-started searches of one group), on a
    pool of ``workers`` processes that die with the run when there is more than one chain."""
    out: dict[C, CapacityPrediction] = {}
    if workers > 1 and len(chains) > 1:
        with worker_pool(min(workers, len(chains))) as pool:
            for part in pool.map(chain_fn, chains, *zip(*[args] * len(chains), strict=True)):
                out.update(part)
    else:
        for chain in chains:
            out.update(chain_fn(chain, *args))
    return out


def _chain(
    chain: list[SimConfig],
    profile: Profile,
    p99_ms: float,
    requests: int,
    seed: int,
    resolution: float,
    ceiling_rps: float = math.inf,
    arrival: ArrivalProcess = POISSON,
) -> dict[SimConfig, CapacityPrediction]:
    """One group of :func:`capacities`, each search warm-started at the previous answer."""
    done: dict[tuple[Any, ...], CapacityPrediction] = {}
    out: dict[SimConfig, CapacityPrediction] = {}
    hint: float | None = None
    for config in chain:
        key = equivalence_key(config)
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
                arrival=arrival,
            )
            done[key] = cap
        out[config] = cap
        hint = cap.capacity_rps if cap.capacity_rps > 0 else None
    return out
