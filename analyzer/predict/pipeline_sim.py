"""A pipeline's simulator: an ensemble's (or a BLS model's) composing models, chained.

Each stage is a :class:`~analyzer.predict.simulator.Stage`, the one-model event loop with the
reference server's own ``decide()``: the first stage serves the pipeline's arrivals, every later
stage the completions of the one before, in the order they complete (the ensemble scheduler
sends a step's request as soon as its inputs are ready). A request's latency is its last stage's
completion minus its arrival at the pipeline, plus the pipeline's own offset
(:attr:`PipelineProfile.latency_offset_ms`: what no stage sees, the network and the ensemble's
hand-overs between steps), calibrated like one model's (:func:`pipeline_offset`).

A stage's profile is its composing model's own (the probe, run on that model with its own
inputs); its ``latency_offset_ms`` is not used. Request kinds (a mix of sizes) are drawn once
per request from the pipeline's seed, so a request has the same kind at every stage whose mix
has the same shares. A one-stage pipeline simulates exactly as :func:`~analyzer.predict.
simulator.simulate`.

Assumptions, beyond the one-model ones (:data:`ASSUMPTIONS`): every request passes every stage
once, in order (a linear pipeline: the ensembles perfsweep tunes, and a BLS model that calls its
models one after the other); each stage runs on a device of its own: stages that share one (two
composing models on one GPU) are simulated as if they did not, which over-predicts where the
shared device limits.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from analyzer.errors import InputError
from analyzer.measure.arrivals import POISSON, ArrivalProcess
from analyzer.predict.capacity import chained, search_rate
from analyzer.predict.profile import Profile
from analyzer.predict.sim_records import CapacityPrediction, Prediction, SimConfig
from analyzer.predict.simulator import Stage, arrival_stream, figures, over_goal_ns

ASSUMPTIONS = (
    "a pipeline: its stages chained, each stage's completions the next stage's arrivals in "
    "the order they complete; every request passes every stage once, in order",
    "each stage on a device of its own (stages sharing one device are simulated as if they did "
    "not); one constant offset for the pipeline (network, the ensemble's hand-overs)",
)

#: Jitter streams of later stages are seeded apart from the first stage's (which is one model's).
_STAGE_SEED_STEP = 1000


@dataclass(frozen=True)
class PipelineProfile:
    """The profiles of a pipeline's stages, in the order requests pass them.

    Attributes:
        stages: ``(composing model, its profile)`` per stage, in step order.
        latency_offset_ms: What no stage sees, added to every latency.
    """

    stages: tuple[tuple[str, Profile], ...]
    latency_offset_ms: float = 0.0

    def __post_init__(self) -> None:
        if not self.stages:
            raise InputError("a pipeline needs at least one stage")
        names = [name for name, _ in self.stages]
        if len(set(names)) != len(names):
            raise InputError(f"a pipeline's stages must be distinct models (got {names})")

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.stages)

    def configs(self, configs: Mapping[str, SimConfig]) -> list[tuple[Profile, SimConfig]]:
        """Each stage's profile with its config; every stage's profile must cover it.

        Raises:
            InputError: a stage has no config.
            ExtrapolationError: a stage's config needs batches its profile does not cover.
        """
        missing = [name for name in self.names if name not in configs]
        if missing:
            raise InputError(f"no config for the pipeline's stage(s) {', '.join(missing)}")
        out = []
        for name, profile in self.stages:
            config = configs[name]
            profile.check_covers(config.largest_items(profile.items))
            out.append((profile, config))
        return out

    def peak_rps(self, configs: Mapping[str, SimConfig]) -> float:
        """The noise-free throughput bound: the slowest stage's."""
        return min(
            profile.peak_rps(config.largest_items(profile.items), config.instance_count)
            for profile, config in self.configs(configs)
        )


def simulate_pipeline(
    profile: PipelineProfile,
    configs: Mapping[str, SimConfig],
    rate_rps: float,
    *,
    requests: int = 20000,
    warmup: int | None = None,
    seed: int = 0,
    stop_above_ms: float | None = None,
    arrival: ArrivalProcess = POISSON,
    keep_latencies: bool = False,
) -> Prediction:
    """Simulate ``requests`` arrivals at ``rate_rps`` through the pipeline, each stage with its
    config in ``configs`` (by composing model). Arguments as
    :func:`~analyzer.predict.simulator.simulate`'s; the prediction's ``stage_batch_sizes`` holds
    each stage's batches.
    """
    stages = profile.configs(configs)
    arrivals, warm = arrival_stream(rate_rps, requests, warmup, seed, arrival)
    first_measured = arrivals[warm]
    counted = [a >= first_measured for a in arrivals]
    too_slow_ns = over_goal_ns(stop_above_ms, profile.latency_offset_ms)
    # ids[j]: which request (its index in the pipeline's stream) is the j-th to reach a stage;
    # times[j]: when it does.
    ids: list[int] = list(range(requests))
    times: Sequence[int] = arrivals
    histograms: dict[str, dict[int, int]] = {}
    for k, ((name, _), (stage_profile, config)) in enumerate(
        zip(profile.stages, stages, strict=True)
    ):
        stage = Stage(stage_profile, config)
        done, histograms[name] = stage.serve(
            times,
            stage.rows(seed, ids),
            seed=seed + k * _STAGE_SEED_STEP,
            counted=[counted[i] for i in ids],
            too_slow_ns=too_slow_ns,
            origin=None if k == 0 else [arrivals[i] for i in ids],
        )
        if done is None:
            return replace(
                figures(rate_rps, arrivals, None, counted, {}, profile.latency_offset_ms),
                stage_batch_sizes=histograms,
            )
        # The next stage receives them as they complete (ties: in the order they arrived here).
        order = sorted(range(requests), key=done.__getitem__)
        ids = [ids[j] for j in order]
        times = [done[j] for j in order]
    completed = [0] * requests
    for i, t in zip(ids, times, strict=True):
        completed[i] = t
    pred = figures(
        rate_rps, arrivals, completed, counted, {}, profile.latency_offset_ms, keep_latencies
    )
    return replace(pred, stage_batch_sizes=histograms)


def pipeline_capacity(
    profile: PipelineProfile,
    configs: Mapping[str, SimConfig],
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
    """The highest rate whose simulated end-to-end p99 is <= ``p99_ms``: the search of
    :func:`~analyzer.predict.capacity.capacity` over :func:`simulate_pipeline`, bounded by the
    slowest stage's throughput."""
    if p99_ms <= 0:
        raise ValueError("p99_ms must be positive")
    bound = profile.peak_rps(configs)

    def run(rate: float) -> Prediction:
        return simulate_pipeline(
            profile,
            configs,
            rate,
            requests=requests,
            seed=seed,
            stop_above_ms=p99_ms,
            arrival=arrival,
        )

    return search_rate(run, p99_ms, bound, resolution, min_rps, start_rps, ceiling_rps)


def pipeline_capacities(
    profile: PipelineProfile,
    configs: Sequence[Mapping[str, SimConfig]],
    p99_ms: float,
    *,
    requests: int = 3000,
    seed: int = 0,
    resolution: float = 0.02,
    ceiling_rps: float = math.inf,
    arrival: ArrivalProcess = POISSON,
) -> list[CapacityPrediction]:
    """:func:`pipeline_capacity` of each config set, in order, each search started at the
    previous answer (:func:`~analyzer.predict.capacity.chained`)."""
    return chained(
        configs,
        lambda stages, start: pipeline_capacity(
            profile,
            stages,
            p99_ms,
            requests=requests,
            seed=seed,
            resolution=resolution,
            start_rps=start,
            ceiling_rps=ceiling_rps,
            arrival=arrival,
        ),
    )


def pipeline_offset(
    profile: PipelineProfile,
    points: Iterable[tuple[Mapping[str, SimConfig], float, float]],
    *,
    requests: int = 3000,
    seed: int = 0,
    arrival: ArrivalProcess = POISSON,
) -> float | None:
    """The latency no stage sees, from measured operating points of the pipeline: each point is
    ``(configs, rate, measured end-to-end p99)``; the median of measured minus simulated p99 (as
    :func:`~analyzer.predict.capacity.latency_offset` for one model). None: no point could be
    simulated."""
    base = replace(profile, latency_offset_ms=0.0)
    gaps: list[float] = []
    for configs, rate, p99_ms in points:
        if rate <= 0 or not math.isfinite(p99_ms):
            continue
        sim = simulate_pipeline(base, configs, rate, requests=requests, seed=seed, arrival=arrival)
        if not sim.saturated and math.isfinite(sim.p99_ms):
            gaps.append(p99_ms - sim.p99_ms)
    return statistics.median(gaps) if gaps else None


__all__ = [
    "ASSUMPTIONS",
    "PipelineProfile",
    "pipeline_capacities",
    "pipeline_capacity",
    "pipeline_offset",
    "simulate_pipeline",
]
