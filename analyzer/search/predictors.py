"""What ``--search predict`` simulates: one model's profile, a pipeline's, or a mix's.

:class:`ModelPredictor`, :class:`PipelinePredictor` and :class:`MixPredictor` answer the same questions for
:class:`~analyzer.search.strategy.Guide`, which holds one and never asks which: the configs
worth predicting in a space, which of them it covers, their simulated capacities at the goal,
itself with the latency offset calibrated on measured operating points or refitted to a run's
windows, and predictions.json's description of it.

A pipeline's joint space is the product of its stages' spaces (tens of configs each: tens of
thousands together), so :meth:`PipelinePredictor.candidates` does not enumerate it: each stage
is simulated alone at its share of the goal, the best :data:`STAGE_KEEP` of each stage are kept,
and their product is simulated as the pipeline. A stage's share is proportional to its execution
time for one request (:func:`goal_shares`): queueing scales with service time, so a 25 ms stage
beside two 2 ms stages gets most of the budget, and equal stages split it evenly.
"""

from __future__ import annotations

import functools
import itertools
import json
import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Protocol

from analyzer.config.knobs import EngineKnobs, Knobs
from analyzer.config.pipeline import JointKnobs, TrialKnobs, config_cost, single
from analyzer.errors import InputError
from analyzer.measure.arrivals import POISSON, ArrivalProcess
from analyzer.measure.lengths import Lengths
from analyzer.measure.specs import Goals, LoadMode
from analyzer.predict.capacity import capacities, equivalence_key, latency_offset
from analyzer.predict.engine_profile import (
    EngineConfig,
    EngineProfile,
    load_engine_profile,
    rescaled_costs,
    save_engine_profile,
)
from analyzer.predict.engine_sim import (
    ENGINE_REQUESTS,
    ENGINE_RESOLUTION,
    engine_capacities,
    simulate_engine,
)
from analyzer.predict.fitting import (
    WindowSample,
    model_operating_points,
    operating_points,
    rescaled,
)
from analyzer.predict.mix_sim import MixModel, MixProfile, mix_capacities, mix_offsets
from analyzer.predict.pipeline_sim import PipelineProfile, pipeline_capacities, pipeline_offset
from analyzer.predict.profile import Profile, load_profile, save_profile
from analyzer.predict.sim_records import SimConfig
from analyzer.rundir.trial_record import TrialRecord
from analyzer.search.space import JointSpace, SearchSpace, Space, grid_configs
from analyzer.target.supervise import worker_pool

#: Configs kept per stage before the pipeline's product is simulated (3 stages: 27 joint configs).
STAGE_KEEP = 3


class Predictor(Protocol):
    """The simulator behind a :class:`~analyzer.search.strategy.Guide`."""

    def candidates(self, space: Space, goal_p99_ms: float, seed: int) -> list[TrialKnobs]:
        """The configs of ``space`` worth predicting, in the space's order."""
        ...

    def covers(self, knobs: TrialKnobs) -> bool:
        """Whether ``knobs`` can be simulated (its batches profiled, its knobs modelled)."""
        ...

    def capacities(
        self,
        configs: Sequence[TrialKnobs],
        goal_p99_ms: float,
        *,
        requests: int,
        seed: int,
        resolution: float,
        workers: int,
        ceiling_rps: float,
        arrival: ArrivalProcess,
    ) -> dict[TrialKnobs, float]:
        """The simulated capacity at the goal of each config (all covered)."""
        ...

    def calibrated(
        self,
        trials: Iterable[TrialRecord],
        *,
        requests: int,
        seed: int,
        arrival: ArrivalProcess,
    ) -> Predictor:
        """Itself with the latency offset fitted on the measured operating points of ``trials``
        (unchanged when none can be simulated)."""
        ...

    def rescaled(self, samples: Sequence[WindowSample], where: str) -> Predictor:
        """Itself with execution times rescaled to a run's windows."""
        ...

    def coverage(self) -> str:
        """What it covers, for a user told that nothing in the space is covered."""
        ...

    def summary(self, refits: int) -> dict[str, object]:
        """predictions.json's description."""
        ...

    def save(self, path: Path) -> None:
        """Write it for a resumed run (:func:`load_predictor`)."""
        ...


@dataclass(frozen=True)
class ModelPredictor:
    """One model: its :class:`~analyzer.predict.profile.Profile`."""

    profile: Profile

    def candidates(self, space: Space, goal_p99_ms: float, seed: int) -> list[TrialKnobs]:
        return grid_configs(space)

    def covers(self, knobs: TrialKnobs) -> bool:
        # A priority or queue policy is not simulated (simulator.check_modelled): such a config
        # is uncovered, so predict never ranks it as if it were one FIFO. So is one whose
        # instances are not one group on one device: the simulator shares one device among all
        # instances, and several groups may sit on several GPUs or be of different kinds, which
        # knobs do not say.
        if not isinstance(knobs, Knobs):
            return False
        sim = SimConfig.from_knobs(knobs)
        return (
            not sim.queue_policy
            and not _spans_groups(knobs)
            and self.profile.covers(sim.largest_items(self.profile.items))
        )

    def capacities(
        self,
        configs: Sequence[TrialKnobs],
        goal_p99_ms: float,
        *,
        requests: int,
        seed: int,
        resolution: float,
        workers: int,
        ceiling_rps: float,
        arrival: ArrivalProcess,
    ) -> dict[TrialKnobs, float]:
        sims = {SimConfig.from_knobs(single(k)): k for k in configs}
        found = capacities(
            self.profile,
            list(sims),
            goal_p99_ms,
            requests=requests,
            seed=seed,
            resolution=resolution,
            workers=workers,
            ceiling_rps=ceiling_rps,
            arrival=arrival,
        )
        return {sims[sim]: cap.capacity_rps for sim, cap in found.items()}

    def calibrated(
        self,
        trials: Iterable[TrialRecord],
        *,
        requests: int,
        seed: int,
        arrival: ArrivalProcess,
    ) -> ModelPredictor:
        points = operating_points(trials)
        sims = [(SimConfig.from_knobs(k), r, p) for k, r, p in points if isinstance(k, Knobs)]
        offset = latency_offset(self.profile, sims, requests=requests, seed=seed, arrival=arrival)
        if offset is None:
            return self
        return ModelPredictor(replace(self.profile, latency_offset_ms=round(offset, 3)))

    def rescaled(self, samples: Sequence[WindowSample], where: str) -> ModelPredictor:
        return ModelPredictor(rescaled(self.profile, samples, where))

    def coverage(self) -> str:
        return f"batch sizes {self.profile.min_batch_size}-{self.profile.max_batch_size}"

    def summary(self, refits: int) -> dict[str, object]:
        return profile_summary(self.profile, refits)

    def save(self, path: Path) -> None:
        save_profile(self.profile, path)


#: Rounds of an engine's cost rescaling (each: every operating point simulated once).
ENGINE_REFIT_ROUNDS = 3


@dataclass(frozen=True)
class EnginePredictor:
    """A generative engine: its step costs and KV cache (:mod:`analyzer.predict.engine_profile`),
    simulated on the load's lengths (:mod:`analyzer.predict.engine_sim`) against the token goals.

    The predictor holds the goals a trial's level is held to (TTFT, ITL and the end-to-end p99,
    open with token goals): the p99 goal a :class:`~analyzer.search.strategy.Guide` passes is
    not used. Knobs
    that leave the memory share or the block size to the engine take the engine's own
    (``share``, ``block_size``: its ``model.json``).

    Calibrated on measured operating points: their ITL p50 against the simulated one rescales
    every step cost (the engine is that much slower or faster than probed); then their TTFT p99
    against the simulated one gives the latency the engine does not see, and their ITL p99 the
    client's tail beyond the engine's steps (``itl_tail_ms``).
    """

    profile: EngineProfile
    goals: Goals
    lengths: Lengths
    share: float = 0.9
    block_size: int = 16
    #: The probe's profile, which every calibration starts from (None: ``profile``).
    probed: EngineProfile | None = None

    def config(self, knobs: EngineKnobs) -> EngineConfig:
        """The simulated engine settings of ``knobs``."""
        share = knobs.gpu_memory_utilization
        return EngineConfig(
            max_num_seqs=knobs.max_num_seqs,
            max_num_batched_tokens=knobs.max_num_batched_tokens,
            enable_chunked_prefill=knobs.enable_chunked_prefill,
            gpu_memory_utilization=self.share if share is None else share,
            block_size=self.block_size,
            instance_count=knobs.instance_count,
        )

    def candidates(self, space: Space, goal_p99_ms: float, seed: int) -> list[TrialKnobs]:
        return grid_configs(space)

    def covers(self, knobs: TrialKnobs) -> bool:
        if not isinstance(knobs, EngineKnobs) or knobs.batch_scheduler_policy is not None:
            return False
        config = self.config(knobs)
        return self.profile.covers(config) and self.profile.num_blocks(config) >= 1

    def capacities(
        self,
        configs: Sequence[TrialKnobs],
        goal_p99_ms: float,
        *,
        requests: int,
        seed: int,
        resolution: float,
        workers: int,
        ceiling_rps: float,
        arrival: ArrivalProcess,
    ) -> dict[TrialKnobs, float]:
        sims: dict[EngineConfig, list[TrialKnobs]] = {}
        for k in configs:
            if isinstance(k, EngineKnobs):
                sims.setdefault(self.config(k), []).append(k)
        found = engine_capacities(
            self.profile,
            list(sims),
            self.goals,
            self.lengths,
            # A step of an engine is costlier to simulate than a batch: fewer requests a rate,
            # a coarser (still well inside the band) resolution.
            requests=min(requests, ENGINE_REQUESTS),
            seed=seed,
            resolution=max(resolution, ENGINE_RESOLUTION),
            workers=workers,
            ceiling_rps=ceiling_rps,
            arrival=arrival,
        )
        return {k: cap.capacity_rps for sim, cap in found.items() for k in sims[sim]}

    def calibrated(
        self,
        trials: Iterable[TrialRecord],
        *,
        requests: int,
        seed: int,
        arrival: ArrivalProcess,
    ) -> EnginePredictor:
        return self.calibrated_on(
            engine_operating_points(trials), requests=requests, seed=seed, arrival=arrival
        )

    def calibrated_on(
        self,
        points: Sequence[tuple[EngineKnobs, float, float, float, float]],
        *,
        requests: int,
        seed: int,
        arrival: ArrivalProcess,
    ) -> EnginePredictor:
        """:meth:`calibrated` on ``(knobs, rate, TTFT p99, ITL p50, ITL p99)`` operating
        points."""
        base = self.probed or self.profile
        drawn = self.lengths.draw(seed)
        usable = [
            (self.config(k), rate, ttft, itl, itl99)
            for k, rate, ttft, itl, itl99 in points
            if self.covers(k)
        ]
        if not usable:
            return self
        n = min(requests, ENGINE_REQUESTS)
        zero = replace(base, latency_offset_ms=0.0, itl_tail_ms=0.0)
        # A slower engine at the same rate also runs more sequences a step, so the ITL ratio is
        # not the cost ratio at once: a few rounds of the fixed point settle it.
        scaled = zero
        for _ in range(ENGINE_REFIT_ROUNDS):
            ratios = []
            for config, rate, _, itl, _ in usable:
                sim = simulate_engine(
                    scaled, config, rate, drawn, requests=n, seed=seed, arrival=arrival
                )
                if not sim.saturated and sim.itl_p50_ms > 0 and itl > 0:
                    ratios.append(itl / sim.itl_p50_ms)
            if not ratios or abs(statistics.median(ratios) - 1.0) < 0.005:
                break
            scaled = rescaled_costs(scaled, statistics.median(ratios))
        gaps, tails = [], []
        for config, rate, ttft, _, itl99 in usable:
            sim = simulate_engine(
                scaled, config, rate, drawn, requests=n, seed=seed, arrival=arrival
            )
            if not sim.saturated and math.isfinite(sim.ttft_p99_ms):
                gaps.append(ttft - sim.ttft_p99_ms)
                tails.append(itl99 - sim.itl_p99_ms)
        offset = max(0.0, statistics.median(gaps)) if gaps else base.latency_offset_ms
        tail = max(0.0, statistics.median(tails)) if tails else 0.0
        profile = replace(scaled, latency_offset_ms=round(offset, 3), itl_tail_ms=round(tail, 3))
        if profile == self.profile:
            return self
        return replace(self, profile=profile, probed=base)

    def rescaled(self, samples: Sequence[WindowSample], where: str) -> EnginePredictor:
        # Windows of batch executions say nothing of engine steps: calibrated() refits them.
        return self

    def coverage(self) -> str:
        return self.profile.coverage()

    def summary(self, refits: int) -> dict[str, object]:
        c = self.profile.cost
        return {
            "model": self.profile.model,
            "source": self.profile.source,
            "engine": {
                "fixed_ms": c.fixed_ms,
                "prefill_ms_per_token": c.prefill_ms_per_token,
                "decode_ms_per_seq": c.decode_ms_per_seq,
                "kv_cache": self.profile.coverage(),
                "probed_seqs": self.profile.probed_seqs,
            },
            "goals": self.goals.describe(),
            "lengths": self.lengths.describe(),
            "jitter": self.profile.jitter,
            "latency_offset_ms": self.profile.latency_offset_ms,
            "itl_tail_ms": self.profile.itl_tail_ms,
            "refits": refits,
            "provenance": self.profile.provenance,
        }

    def save(self, path: Path) -> None:
        save_engine_profile(self.profile, path.parent / f"{path.stem}-engine.json")
        doc = {
            "engine": {
                # JSON has no infinity: an open end-to-end goal is null.
                "p99_ms": self.goals.p99_ms if math.isfinite(self.goals.p99_ms) else None,
                "ttft_p99_ms": self.goals.ttft_p99_ms,
                "itl_p99_ms": self.goals.itl_p99_ms,
                "lengths": self.lengths.to_dict(),
                "share": self.share,
                "block_size": self.block_size,
            }
        }
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(doc, indent=2))
        tmp.replace(path)


def engine_operating_points(
    trials: Iterable[TrialRecord],
) -> list[tuple[EngineKnobs, float, float, float, float]]:
    """(knobs, offered rate, TTFT p99, ITL p50, ITL p99) of every engine trial whose operating
    point is an open-loop level with token figures that met the goals."""
    points = []
    for r in trials:
        m = r.operating_point() if r.complete and r.meets_goals else None
        if m is None or m.mode is not LoadMode.REQUEST_RATE or m.target <= 0:
            continue
        if not isinstance(r.config, EngineKnobs) or m.tokens is None:
            continue
        t = m.tokens
        points.append((r.config, m.target, t.ttft_p99_ms, t.itl_p50_ms, t.itl_p99_ms))
    return points


def goal_shares(pipeline: PipelineProfile, goal_p99_ms: float) -> dict[str, float]:
    """Each stage's share of the pipeline's p99 goal when its configs are ranked alone: in
    proportion to its execution time for its smallest profiled batch (even when none is
    timed)."""
    floors = {
        name: max(profile.timing(profile.min_batch_size).total_ms, 0.0)
        for name, profile in pipeline.stages
    }
    total = sum(floors.values())
    if total <= 0:
        return {name: goal_p99_ms / len(floors) for name in floors}
    return {name: goal_p99_ms * floor / total for name, floor in floors.items()}


@dataclass(frozen=True)
class PipelinePredictor:
    """A pipeline: its stages' profiles, chained (:mod:`analyzer.predict.pipeline_sim`).

    Not refitted to a run's windows: each stage's execution times stay the probe's (the offset
    is calibrated as one model's is).
    """

    pipeline: PipelineProfile

    def candidates(self, space: Space, goal_p99_ms: float, seed: int) -> list[TrialKnobs]:
        if not isinstance(space, JointSpace):
            raise InputError("a pipeline's predictions need the pipeline's joint space")
        shares = goal_shares(self.pipeline, goal_p99_ms)
        kept = [
            self._stage_best(name, stage_space, shares[name], seed)
            for name, stage_space in space.stages
        ]
        names = [name for name, _ in space.stages]
        return [
            JointKnobs(tuple(zip(names, combo, strict=True))) for combo in itertools.product(*kept)
        ]

    def _stage_best(self, name: str, space: SearchSpace, share_ms: float, seed: int) -> list[Knobs]:
        """The stage's :data:`STAGE_KEEP` configs of the highest capacity alone at ``share_ms``
        (ties: the smaller config), in the space's order."""
        profile = dict(self.pipeline.stages)[name]
        alone = ModelPredictor(profile)
        configs = [k for k in grid_configs(space) if isinstance(k, Knobs) and alone.covers(k)]
        if not configs:
            raise InputError(
                f"the profile of stage {name!r} covers {alone.coverage()}, no config of its space"
            )
        caps = alone.capacities(
            configs,
            share_ms,
            requests=1000,
            seed=seed,
            resolution=0.05,
            workers=1,
            ceiling_rps=math.inf,
            arrival=POISSON,
        )
        best = sorted(
            configs,
            key=lambda k: (-caps[k], config_cost(k)),
        )[:STAGE_KEEP]
        return [k for k in configs if k in best]

    def covers(self, knobs: TrialKnobs) -> bool:
        if not isinstance(knobs, JointKnobs) or knobs.names != self.pipeline.names:
            return False
        return all(
            ModelPredictor(profile).covers(knobs.stage(name))
            for name, profile in self.pipeline.stages
        )

    def capacities(
        self,
        configs: Sequence[TrialKnobs],
        goal_p99_ms: float,
        *,
        requests: int,
        seed: int,
        resolution: float,
        workers: int,
        ceiling_rps: float,
        arrival: ArrivalProcess,
    ) -> dict[TrialKnobs, float]:
        found = pipeline_capacities(
            self.pipeline,
            [_stage_sims(k) for k in configs],
            goal_p99_ms,
            requests=requests,
            seed=seed,
            resolution=resolution,
            ceiling_rps=ceiling_rps,
            arrival=arrival,
        )
        return {k: cap.capacity_rps for k, cap in zip(configs, found, strict=True)}

    def calibrated(
        self,
        trials: Iterable[TrialRecord],
        *,
        requests: int,
        seed: int,
        arrival: ArrivalProcess,
    ) -> PipelinePredictor:
        points = operating_points(trials)
        sims = [(_stage_sims(k), r, p) for k, r, p in points if self.covers(k)]
        offset = pipeline_offset(self.pipeline, sims, requests=requests, seed=seed, arrival=arrival)
        if offset is None:
            return self
        return PipelinePredictor(replace(self.pipeline, latency_offset_ms=round(offset, 3)))

    def rescaled(self, samples: Sequence[WindowSample], where: str) -> PipelinePredictor:
        return self

    def coverage(self) -> str:
        return "; ".join(
            f"{name}: batch sizes {p.min_batch_size}-{p.max_batch_size}"
            for name, p in self.pipeline.stages
        )

    def summary(self, refits: int) -> dict[str, object]:
        return {
            "pipeline": [name for name, _ in self.pipeline.stages],
            "latency_offset_ms": self.pipeline.latency_offset_ms,
            "refits": refits,
            "stages": {name: profile_summary(p) for name, p in self.pipeline.stages},
        }

    def save(self, path: Path) -> None:
        folder = path.parent / f"{path.stem}-stages"
        folder.mkdir(parents=True, exist_ok=True)
        for name, profile in self.pipeline.stages:
            save_profile(profile, folder / f"{name}.json")
        doc = {
            "stages": [name for name, _ in self.pipeline.stages],
            "latency_offset_ms": self.pipeline.latency_offset_ms,
        }
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"pipeline": doc}, indent=2))
        tmp.replace(path)


#: Rounds of the mix's coordinate search (each: every model's configs, the others held).
MIX_ROUNDS = 2

#: Joint configs a mix's search keeps for the predict phase (its best, in the order found).
MIX_KEEP = 9


@dataclass(frozen=True)
class MixPredictor:
    """A mix of models on one device: their profiles side by side (:mod:`analyzer.predict.
    mix_sim`), each model held to its own goal.

    The joint space is the product of the models' spaces, and the best joint config is not the
    models' bests alone (that is why they are tuned together), so :meth:`candidates` searches it
    in the simulator: from each model's best alone, each model in turn takes its config of the
    highest mix capacity with the others held, for :data:`MIX_ROUNDS` rounds; the
    :data:`MIX_KEEP` best joint configs met on the way are predicted. Not refitted to a run's
    windows; each model's latency offset is calibrated on its own measured p99. ``workers``:
    processes the search simulates in (its answers are the same with any number).
    """

    mix: MixProfile
    workers: int = field(default=1, compare=False)

    def candidates(self, space: Space, goal_p99_ms: float, seed: int) -> list[TrialKnobs]:
        if not isinstance(space, JointSpace) or tuple(n for n, _ in space.stages) != self.mix.names:
            raise InputError("a mix's predictions need the mix's joint space")
        choices: dict[str, list[Knobs]] = {}
        current: dict[str, Knobs] = {}
        for (name, stage_space), model in zip(space.stages, self.mix.models, strict=True):
            alone = ModelPredictor(model.profile)
            configs = [
                k for k in grid_configs(stage_space) if isinstance(k, Knobs) and alone.covers(k)
            ]
            if not configs:
                raise InputError(
                    f"the profile of model {name!r} covers {alone.coverage()}, no config of "
                    "its space"
                )
            choices[name] = _distinct(configs)
            solo = alone.capacities(
                configs,
                model.p99_ms,
                requests=1000,
                seed=seed,
                resolution=0.05,
                workers=1,
                ceiling_rps=math.inf,
                arrival=POISSON,
            )
            current[name] = min(configs, key=lambda k: (-solo[k], config_cost(k)))
        found: dict[TrialKnobs, float] = {}
        for _ in range(MIX_ROUNDS):
            for name in self.mix.names:
                tries = [_joint(self.mix.names, {**current, name: k}) for k in choices[name]]
                caps = self._capacities(
                    tries, seed, requests=1000, resolution=0.05, workers=self.workers
                )
                found.update(caps)
                best = min(tries, key=lambda k: (-caps[k], config_cost(k)))
                current[name] = best.stage(name)
        return sorted(found, key=lambda k: (-found[k], config_cost(k)))[:MIX_KEEP]

    def _capacities(
        self,
        configs: Sequence[TrialKnobs],
        seed: int,
        *,
        requests: int,
        resolution: float,
        ceiling_rps: float = math.inf,
        arrival: ArrivalProcess = POISSON,
        workers: int = 1,
    ) -> dict[TrialKnobs, float]:
        sims = [_stage_sims(k) for k in configs]
        part_of = functools.partial(
            _mix_part,
            mix=self.mix,
            requests=requests,
            seed=seed,
            resolution=resolution,
            ceiling_rps=ceiling_rps,
            arrival=arrival,
        )
        # Runs of configs with the same instances and batching on/off: each run's searches
        # warm-start along it, from nothing at its start, so any number of workers gives the
        # same answers (as capacities() does for one model).
        parts = [
            list(run)
            for _, run in itertools.groupby(
                sims,
                key=lambda c: tuple((s.instance_count, s.dynamic_batching) for s in c.values()),
            )
        ]
        if workers > 1 and len(parts) > 1:
            with worker_pool(min(workers, len(parts))) as pool:
                found = [rps for part in pool.map(part_of, parts) for rps in part]
        else:
            found = [rps for part in parts for rps in part_of(part)]
        return dict(zip(configs, found, strict=True))

    def covers(self, knobs: TrialKnobs) -> bool:
        if not isinstance(knobs, JointKnobs) or knobs.names != self.mix.names:
            return False
        return all(ModelPredictor(m.profile).covers(knobs.stage(m.name)) for m in self.mix.models)

    def capacities(
        self,
        configs: Sequence[TrialKnobs],
        goal_p99_ms: float,
        *,
        requests: int,
        seed: int,
        resolution: float,
        workers: int,
        ceiling_rps: float,
        arrival: ArrivalProcess,
    ) -> dict[TrialKnobs, float]:
        return self._capacities(
            configs,
            seed,
            requests=requests,
            resolution=resolution,
            ceiling_rps=ceiling_rps,
            arrival=arrival,
            workers=workers,
        )

    def calibrated(
        self,
        trials: Iterable[TrialRecord],
        *,
        requests: int,
        seed: int,
        arrival: ArrivalProcess,
    ) -> MixPredictor:
        points = [
            (_stage_sims(k), rate, p99s)
            for k, rate, p99s in model_operating_points(trials)
            if self.covers(k)
        ]
        mix = mix_offsets(self.mix, points, requests=requests, seed=seed, arrival=arrival)
        return self if mix == self.mix else MixPredictor(mix, self.workers)

    def rescaled(self, samples: Sequence[WindowSample], where: str) -> MixPredictor:
        return self

    def coverage(self) -> str:
        return "; ".join(
            f"{m.name}: batch sizes {m.profile.min_batch_size}-{m.profile.max_batch_size}"
            for m in self.mix.models
        )

    def summary(self, refits: int) -> dict[str, object]:
        return {
            "mix": {
                m.name: {"share": m.share, "p99_ms": m.p99_ms}
                | ({"rate_rps": m.rate_rps} if m.rate_rps else {})
                for m in self.mix.models
            },
            "refits": refits,
            "models": {m.name: profile_summary(m.profile) for m in self.mix.models},
        }

    def save(self, path: Path) -> None:
        folder = path.parent / f"{path.stem}-models"
        folder.mkdir(parents=True, exist_ok=True)
        for m in self.mix.models:
            save_profile(m.profile, folder / f"{m.name}.json")
        doc = {
            "models": [
                {"name": m.name, "share": m.share, "p99_ms": m.p99_ms, "rate_rps": m.rate_rps}
                for m in self.mix.models
            ]
        }
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"mix": doc}, indent=2))
        tmp.replace(path)


def _mix_part(
    configs: Sequence[dict[str, SimConfig]],
    *,
    mix: MixProfile,
    requests: int,
    seed: int,
    resolution: float,
    ceiling_rps: float,
    arrival: ArrivalProcess,
) -> list[float]:
    """The mix capacity of each config set, each search warm-started at the previous answer."""
    found = mix_capacities(
        mix,
        configs,
        requests=requests,
        seed=seed,
        resolution=resolution,
        ceiling_rps=ceiling_rps,
        arrival=arrival,
    )
    return [cap.capacity_rps for cap in found]


def _distinct(configs: Sequence[Knobs]) -> list[Knobs]:
    """One config of each set that simulates alike (the smallest), in the order a warm-started
    capacity search moves least between: by instances, then batching, batch size, preferred
    sizes and delay."""
    kept: dict[tuple[object, ...], Knobs] = {}
    for k in sorted(configs, key=config_cost):
        kept.setdefault(equivalence_key(SimConfig.from_knobs(k)), k)

    def order(k: Knobs) -> tuple[object, ...]:
        sim = SimConfig.from_knobs(k)
        return (
            sim.instance_count,
            sim.dynamic_batching,
            sim.max_batch_size,
            sim.preferred_batch_size,
            sim.max_queue_delay_us,
        )

    return sorted(kept.values(), key=order)


def _joint(names: Sequence[str], knobs: dict[str, Knobs]) -> JointKnobs:
    return JointKnobs(tuple((name, knobs[name]) for name in names))


def load_predictor(path: Path) -> Predictor:
    """What :meth:`Predictor.save` wrote at ``path``."""
    doc = json.loads(path.read_text())
    if isinstance(doc, dict) and "engine" in doc:
        e = doc["engine"]
        return EnginePredictor(
            load_engine_profile(path.parent / f"{path.stem}-engine.json"),
            Goals(
                math.inf if e.get("p99_ms") is None else float(e["p99_ms"]),
                ttft_p99_ms=e.get("ttft_p99_ms"),
                itl_p99_ms=e.get("itl_p99_ms"),
            ),
            Lengths.from_dict(e.get("lengths") or {}),
            float(e.get("share", 0.9)),
            int(e.get("block_size", 16)),
        )
    if isinstance(doc, dict) and "mix" in doc:
        folder = path.parent / f"{path.stem}-models"
        return MixPredictor(
            MixProfile(
                tuple(
                    MixModel(
                        m["name"],
                        load_profile(folder / f"{m['name']}.json"),
                        float(m["share"]),
                        float(m["p99_ms"]),
                        float(m.get("rate_rps", 0.0)),
                    )
                    for m in doc["mix"]["models"]
                )
            )
        )
    if isinstance(doc, dict) and "pipeline" in doc:
        folder = path.parent / f"{path.stem}-stages"
        stages = tuple(
            (name, load_profile(folder / f"{name}.json")) for name in doc["pipeline"]["stages"]
        )
        offset = float(doc["pipeline"].get("latency_offset_ms", 0.0))
        return PipelinePredictor(PipelineProfile(stages, latency_offset_ms=offset))
    return ModelPredictor(load_profile(path))


def profile_summary(profile: Profile, refits: int = 0) -> dict[str, object]:
    """predictions.json's short description of a profile."""
    return {
        "model": profile.model,
        "source": profile.source,
        "batch_sizes": [profile.min_batch_size, profile.max_batch_size],
        "jitter": profile.jitter,
        "instances_profiled": profile.instances_profiled,
        "interference": {str(k): v for k, v in sorted(profile.interference.items())},
        "latency_offset_ms": profile.latency_offset_ms,
        "overlap_ms": profile.overlap_ms,
        "refits": refits,
        "provenance": profile.provenance,
    }


def _stage_sims(knobs: TrialKnobs) -> dict[str, SimConfig]:
    if not isinstance(knobs, JointKnobs):
        raise InputError(f"{knobs.label()!r} is one model's config, not a pipeline's")
    return {name: SimConfig.from_knobs(k) for name, k in knobs.stages}


def _spans_groups(knobs: Knobs) -> bool:
    """Several instance groups, or one group on several GPUs (its count below its instances)."""
    counts = knobs.group_counts
    return counts is not None and (len(counts) > 1 or counts[0] != knobs.instance_count)


__all__ = [
    "STAGE_KEEP",
    "EnginePredictor",
    "MixPredictor",
    "ModelPredictor",
    "PipelinePredictor",
    "Predictor",
    "load_predictor",
    "profile_summary",
]
