"""A mix's simulator: several models served side by side on one device.

Each model is a :class:`~analyzer.predict.simulator.Stage`, the one-model batcher and instances
with the reference server's own ``decide()``; :func:`~analyzer.predict.simulator.serve_lanes`
runs them together, every instance of every model on one device (the device phases of all
models' executions one at a time, in the order they reach it: one model's executions are every
other model's wait). The arrivals are one stream of the scenario's process at the mix's rate,
each request's model drawn by its share (seeded, as the load generator draws each request's
class), so a model's requests arrive as the mix sends them.

A model's profile is its own (the probe, run on that model with its own inputs) and so is its
latency offset (what its requests spend outside the server). Each model is held to its own p99
goal: the mix's capacity is the highest rate of the whole mix at which every model's simulated
p99 meets its goal (:func:`mix_capacity`).

Assumptions, beyond the one-model ones: every model's instances on the one device (models on
several GPUs are not modelled); the interference between models is the device's serialisation
alone (host work overlaps, as it does between one model's instances).
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
from analyzer.predict.simulator import (
    Lane,
    Stage,
    arrival_stream,
    draw_kinds,
    figures,
    over_goal_ns,
    serve_lanes,
)

ASSUMPTIONS = (
    "a mix: one arrival stream at the mix's rate, each request's model drawn by its share; "
    "every model's instances on one device, the device phases of all models' executions "
    "serialised in the order they reach it",
    "each model its own profile, latency offset and p99 goal; the mix's capacity is the "
    "highest rate at which every model meets its own goal",
)

#: The models' draw is seeded apart from the arrivals, jitter and request kinds.
_MODEL_SEED_STEP = 4


@dataclass(frozen=True)
class MixModel:
    """One model of a mix: its profile, its share of the requests (or a rate of its own,
    req/s, with share 0) and its own p99 goal."""

    name: str
    profile: Profile
    share: float
    p99_ms: float
    rate_rps: float = 0.0


@dataclass(frozen=True)
class MixProfile:
    """The models served together, in the mix's order.

    The mix's goal (:attr:`goal_p99_ms`) is the loosest model's: a combined prediction states
    the model nearest its own goal on that scale (:func:`simulate_mix`).
    """

    models: tuple[MixModel, ...]

    def __post_init__(self) -> None:
        if not self.models:
            raise InputError("a mix needs at least one model")
        names = [m.name for m in self.models]
        if len(set(names)) != len(names):
            raise InputError(f"a mix's models must be distinct (got {names})")
        if any((m.share > 0) == (m.rate_rps > 0) or m.p99_ms <= 0 for m in self.models):
            raise InputError(
                "every model of a mix needs a positive share or a rate of its own, not both, "
                "and a positive p99 goal"
            )
        if self.fixed_rps() and not any(m.share > 0 for m in self.models):
            raise InputError("a mix needs a model with a share (the load a capacity scales)")

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(m.name for m in self.models)

    @property
    def goal_p99_ms(self) -> float:
        return max(m.p99_ms for m in self.models)

    def fixed_rps(self) -> float:
        """The models' own rates summed (0: every model has a share)."""
        return sum(m.rate_rps for m in self.models)

    def shares(self, rate_rps: float | None = None) -> tuple[float, ...]:
        """Each model's fraction of the requests at a mix rate of ``rate_rps`` (summing to 1):
        a model with a rate of its own keeps it, the others divide the rest by their shares
        (as the load generator draws them: ``load.classes.level_classes``)."""
        total = sum(m.share for m in self.models)
        fixed = self.fixed_rps()
        if not fixed:
            return tuple(m.share / total for m in self.models)
        if rate_rps is None or rate_rps <= fixed:
            raise ValueError(
                f"a mix rate of {rate_rps} req/s leaves nothing for the models with shares: "
                f"the models' own rates take {fixed:g}"
            )
        rest = rate_rps - fixed
        return tuple(
            (m.rate_rps if m.rate_rps else m.share / total * rest) / rate_rps for m in self.models
        )

    def stages(self, configs: Mapping[str, SimConfig]) -> list[Stage]:
        """Each model's batcher and instances with its config; every profile must cover it.

        Raises:
            InputError: a model has no config.
            ExtrapolationError: a config needs batches its model's profile does not cover.
        """
        missing = [name for name in self.names if name not in configs]
        if missing:
            raise InputError(f"no config for the mix's model(s) {', '.join(missing)}")
        out = []
        for m in self.models:
            config = configs[m.name]
            m.profile.check_covers(config.largest_items(m.profile.items))
            out.append(Stage(m.profile, config))
        return out

    def peak_rps(self, configs: Mapping[str, SimConfig]) -> float:
        """The noise-free bound of the mix's rate: each model's rate at its own peak uses that
        fraction of the device, and the fractions cannot sum above 1 (the models' own rates
        take theirs first; what they leave bounds the rest)."""
        total = sum(m.share for m in self.models)
        held = 0.0  # of the device, by the models' own rates
        scaled = 0.0  # of the device per req/s of the rest
        for m in self.models:
            config = configs[m.name]
            peak = m.profile.peak_rps(config.largest_items(m.profile.items), config.instance_count)
            if peak <= 0:
                return math.inf
            if m.rate_rps:
                held += m.rate_rps / peak
            else:
                scaled += m.share / total / peak
        if held >= 1:
            return self.fixed_rps()
        return self.fixed_rps() + (1.0 - held) / scaled if scaled > 0 else math.inf


@dataclass(frozen=True)
class MixPrediction:
    """What the simulator predicts for a mix at one rate: each model's figures (its own
    rate, latencies and batches) and the combined prediction :func:`mix_capacity` searches
    on (:func:`simulate_mix`)."""

    combined: Prediction
    models: dict[str, Prediction]

    def misses(self, mix: MixProfile) -> list[str]:
        """The models over their own goal (or unable to keep up with their rate)."""
        return [
            m.name
            for m in mix.models
            if self.models[m.name].p99_ms > m.p99_ms or self.models[m.name].saturated
        ]


def simulate_mix(
    mix: MixProfile,
    configs: Mapping[str, SimConfig],
    rate_rps: float,
    *,
    requests: int = 20000,
    warmup: int | None = None,
    seed: int = 0,
    stop: bool = False,
    arrival: ArrivalProcess = POISSON,
    keep_latencies: bool = False,
) -> MixPrediction:
    """Simulate ``requests`` arrivals of the mix at ``rate_rps``, each model with its config in
    ``configs`` (by name), all on one device.

    ``stop``: stop as soon as more than 1 % of one model's measured requests are certain to miss
    that model's goal (the capacity search's shortcut); every figure is then ``inf``.
    ``keep_latencies``: each model's prediction keeps its requests' latencies.

    The combined prediction's ``p99_ms`` is the model nearest its own goal, on the loosest
    goal's scale (``max(p99 / own goal) * mix.goal_p99_ms``: at most the loosest goal exactly
    when every model meets its own); it is saturated when any model is; its throughput is the
    models' sum and ``stage_batch_sizes`` holds each model's batches.
    """
    stages = mix.stages(configs)
    arrivals, warm = arrival_stream(rate_rps, requests, warmup, seed, arrival)
    first_measured = arrivals[warm]
    shares = mix.shares(rate_rps)
    drawn = draw_kinds(seed + _MODEL_SEED_STEP, requests, shares)
    lanes: list[Lane] = []
    ids: list[list[int]] = []
    for k, (m, stage) in enumerate(zip(mix.models, stages, strict=True)):
        own = [i for i in range(requests) if drawn[i] == k]
        times = [arrivals[i] for i in own]
        too_slow = over_goal_ns(m.p99_ms, m.profile.latency_offset_ms) if stop else None
        counted = [t >= first_measured for t in times]
        lanes.append(Lane(stage, times, stage.rows(seed, own), counted, too_slow))
        ids.append(own)
    done, histograms = serve_lanes(lanes, seed=seed)
    models = {}
    for k, (m, lane) in enumerate(zip(mix.models, lanes, strict=True)):
        times = list(lane.arrivals)
        if not times or not any(lane.counted):
            # Too few requests of this model to measure (a tiny share): say nothing of it.
            models[m.name] = _unmeasured(rate_rps * shares[k], histograms[k])
            continue
        models[m.name] = figures(
            rate_rps * shares[k],
            times,
            None if done is None else done[k],
            list(lane.counted),
            histograms[k],
            m.profile.latency_offset_ms,
            keep_latencies,
        )
    return MixPrediction(_combined(mix, rate_rps, models), models)


def _unmeasured(rate_rps: float, histogram: dict[int, int]) -> Prediction:
    return Prediction(rate_rps, 0, 0.0, 0.0, 0.0, rate_rps, histogram)


def _combined(mix: MixProfile, rate_rps: float, models: Mapping[str, Prediction]) -> Prediction:
    goal = mix.goal_p99_ms
    worst = max(models[m.name].p99_ms / m.p99_ms for m in mix.models)
    stopped = any(p.stopped_early for p in models.values())
    return Prediction(
        rate_rps=rate_rps,
        requests=sum(p.requests for p in models.values()),
        p50_ms=max(p.p50_ms for p in models.values()),
        p99_ms=worst * goal,
        mean_ms=max(p.mean_ms for p in models.values()),
        throughput_rps=0.0 if stopped else sum(p.throughput_rps for p in models.values()),
        batch_sizes={},
        saturated=any(p.saturated for p in models.values()),
        stopped_early=stopped,
        stage_batch_sizes={name: dict(p.batch_sizes) for name, p in models.items()},
    )


def mix_capacity(
    mix: MixProfile,
    configs: Mapping[str, SimConfig],
    *,
    requests: int = 3000,
    seed: int = 0,
    resolution: float = 0.02,
    min_rps: float | None = None,
    start_rps: float | None = None,
    ceiling_rps: float = math.inf,
    arrival: ArrivalProcess = POISSON,
) -> CapacityPrediction:
    """The highest rate of the whole mix at which every model's simulated p99 meets its own
    goal: the search of :func:`~analyzer.predict.capacity.capacity` over :func:`simulate_mix`
    (its combined prediction, against the loosest goal), bounded by the device's share of every
    model (:meth:`MixProfile.peak_rps`)."""

    def run(rate: float) -> Prediction:
        return simulate_mix(
            mix, configs, rate, requests=requests, seed=seed, stop=True, arrival=arrival
        ).combined

    # With models at rates of their own the search starts just above their sum (no lower mix
    # rate leaves the others any requests).
    fixed = mix.fixed_rps()
    if fixed and (min_rps is None or min_rps <= fixed):
        min_rps = fixed * (1 + 1e-3)
    return search_rate(
        run, mix.goal_p99_ms, mix.peak_rps(configs), resolution, min_rps, start_rps, ceiling_rps
    )


def mix_capacities(
    mix: MixProfile,
    configs: Sequence[Mapping[str, SimConfig]],
    *,
    requests: int = 3000,
    seed: int = 0,
    resolution: float = 0.02,
    ceiling_rps: float = math.inf,
    arrival: ArrivalProcess = POISSON,
) -> list[CapacityPrediction]:
    """:func:`mix_capacity` of each config set, in order, each search started at the previous
    answer (:func:`~analyzer.predict.capacity.chained`)."""
    return chained(
        configs,
        lambda models, start: mix_capacity(
            mix,
            models,
            requests=requests,
            seed=seed,
            resolution=resolution,
            start_rps=start,
            ceiling_rps=ceiling_rps,
            arrival=arrival,
        ),
    )


def mix_offsets(
    mix: MixProfile,
    points: Iterable[tuple[Mapping[str, SimConfig], float, Mapping[str, float]]],
    *,
    requests: int = 3000,
    seed: int = 0,
    arrival: ArrivalProcess = POISSON,
) -> MixProfile:
    """The mix with each model's latency offset calibrated on measured operating points:
    ``(configs, mix rate, each model's measured p99)``; a model's offset is the median of its
    measured minus simulated p99 (as :func:`~analyzer.predict.capacity.latency_offset` for one
    model). A model no point can be simulated for keeps its own.

    A point counts only where the simulation agrees that every model meets its goal (the
    points are operating points that met them): near a model's saturation its simulated p99
    swings by seconds with a few percent of rate (seen: a baseline without batching, measured
    rank 360 ms, simulated 1000-2400 ms by seed), and a gap taken there would shift every
    other prediction by it."""
    base = MixProfile(
        tuple(replace(m, profile=replace(m.profile, latency_offset_ms=0.0)) for m in mix.models)
    )
    gaps: dict[str, list[float]] = {m.name: [] for m in mix.models}
    for configs, rate, measured in points:
        if rate <= 0:
            continue
        sim = simulate_mix(base, configs, rate, requests=requests, seed=seed, arrival=arrival)
        if sim.misses(base):
            continue
        for name, p99_ms in measured.items():
            pred = sim.models.get(name)
            if pred is None or not math.isfinite(pred.p99_ms):
                continue
            if math.isfinite(p99_ms) and pred.requests > 0:
                gaps[name].append(p99_ms - pred.p99_ms)
    return MixProfile(
        tuple(
            replace(
                m,
                profile=replace(
                    m.profile, latency_offset_ms=round(statistics.median(gaps[m.name]), 3)
                ),
            )
            if gaps[m.name]
            else m
            for m in mix.models
        )
    )


__all__ = [
    "ASSUMPTIONS",
    "MixModel",
    "MixPrediction",
    "MixProfile",
    "mix_capacities",
    "mix_capacity",
    "mix_offsets",
    "simulate_mix",
]
