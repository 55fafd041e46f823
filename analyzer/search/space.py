"""The search space: a finite grid of knobs, each knob an integer index (no optuna here).

Encoding (why integers): every knob is an integer index, so no invalid config can be sampled and
the sampler sees an ordered space::

    log2_mbs    max_batch_size = 2 ** log2_mbs          (bounds from the scenario)
    delay_idx   max_queue_delay_us = ladder[delay_idx]  (0, then a geometric ladder)
    pref_depth  0: no preferred sizes; d: {mbs, mbs/2, ..., mbs/2**d} (never above mbs)
    instances   instance_group[0].count (the base config's one group)
    instances_i instance_group[i].count, one per group when the base config has several
                (each within the same bounds; Knobs.group_counts)
    cache_idx   response_cache = cache_choices[cache_idx]      (only with two or more choices)
    policy_idx  queue_policy = policy_choices[policy_idx]      (only with two or more choices)
    cand_idx    max_candidate_sequences = candidate_choices[cand_idx]  (the same; the oldest
                strategy of a stateful model)
    kind_idx    instance_kind = kind_choices[kind_idx]         (the same: KIND_CPU vs KIND_GPU)
    ragged_idx  ragged_batch = ragged_choices[ragged_idx]      (the same: allow_ragged_batch)

Preferred sizes are relative to ``max_batch_size`` because Triton refuses a preferred size above
the max batch size, and Optuna refuses categorical choices that change between trials.

A pipeline's composing models are searched together in one :class:`JointSpace`: each stage's
:class:`SearchSpace`, its parameters prefixed with the model's name (``infer.log2_mbs``).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from analyzer.config.knobs import EngineKnobs, Knobs, QueuePolicyKnob
from analyzer.config.model_config import group_devices
from analyzer.config.pipeline import JointKnobs, TrialKnobs
from analyzer.errors import InputError

if TYPE_CHECKING:
    from tritonclient.grpc import model_config_pb2 as mc

__all__ = ["EngineSpace", "JointSpace", "SearchSpace", "delay_ladder", "preferred_sizes"]


def delay_ladder(low_us: int, high_us: int, steps: int) -> tuple[int, ...]:
    """The searched delay values: 0 (when ``low_us`` is 0) then a geometric ladder to ``high_us``.

    Delays grow geometrically because their effect does: 100 µs vs 200 µs matters as much as
    5 ms vs 10 ms.
    """
    if high_us == 0 or steps == 1:
        return (low_us,) if steps == 1 else (0,)
    values: list[int] = []
    start = low_us
    geometric_steps = steps
    if low_us == 0:
        values.append(0)
        geometric_steps -= 1
        start = max(1, round(high_us / 2 ** max(geometric_steps - 1, 0)))
    if geometric_steps >= 1:
        if geometric_steps == 1:
            values.append(high_us)
        else:
            ratio = (high_us / start) ** (1 / (geometric_steps - 1))
            values.extend(round(start * ratio**i) for i in range(geometric_steps))
    return tuple(sorted(set(values)))


def preferred_sizes(max_batch_size: int, depth: int) -> tuple[int, ...]:
    """Preferred sizes at ``depth``: ``max_batch_size`` and its ``depth`` next halvings.

    Depth 0 is no preferred size. ``{max_batch_size}`` alone is never produced: Triton
    normalises an empty list to exactly that, so it would repeat depth 0.
    """
    if depth <= 0:
        return ()
    sizes = {max_batch_size >> i for i in range(depth + 1) if max_batch_size >> i >= 1}
    return tuple(sorted(sizes, reverse=True)) if len(sizes) > 1 else ()


@dataclass(frozen=True)
class SearchSpace:
    """A finite grid of valid knobs, and its integer encoding.

    Attributes:
        log2_mbs: Inclusive bounds of log2(max_batch_size).
        delays_us: The delay ladder.
        max_pref_depth: Largest preferred-size depth searched (0: never set preferred sizes).
        fixed_preferred: Preferred sizes used by every config instead of a searched depth.
        instances: Inclusive bounds of the instance count (of each group, with
            ``group_devices``).
        cache_choices: Values of :attr:`Knobs.response_cache` searched
            (:func:`analyzer.config.choices.response_cache_choices`; ``(None,)``: the model's own).
        policy_choices: Values of :attr:`Knobs.queue_policy` searched
            (:func:`analyzer.config.choices.queue_policy_choices`; ``(None,)``: the model's own).
        candidate_choices: Values of :attr:`Knobs.max_candidate_sequences` searched
            (:func:`analyzer.config.choices.candidate_choices`; ``(None,)``: the model's own).
        kind_choices: Values of :attr:`Knobs.instance_kind` searched
            (:func:`analyzer.config.choices.kind_choices`; ``(None,)``: the model's own).
        group_devices: Instances one count makes in each instance group of the base config
            (:func:`analyzer.config.model_config.group_devices`); None: one plain count, the knobs
            without :attr:`Knobs.group_counts`. Several groups: one ``instances_i`` dimension
            each; one group on several GPUs keeps the one ``instances`` dimension.
    """

    log2_mbs: tuple[int, int]
    delays_us: tuple[int, ...]
    max_pref_depth: int = 2
    fixed_preferred: tuple[int, ...] | None = None
    instances: tuple[int, int] = (1, 1)
    cache_choices: tuple[bool | None, ...] = (None,)
    policy_choices: tuple[QueuePolicyKnob | None, ...] = (None,)
    candidate_choices: tuple[int | None, ...] = (None,)
    group_devices: tuple[int, ...] | None = None
    kind_choices: tuple[str | None, ...] = (None,)
    ragged_choices: tuple[bool | None, ...] = (None,)

    def __post_init__(self) -> None:
        if self.group_devices is not None and not self.group_devices:
            raise ValueError("group_devices needs one entry per instance group (None: one count)")
        if self.fixed_preferred:
            needed = max(self.fixed_preferred)
            lo = max(self.log2_mbs[0], math.ceil(math.log2(needed)))
            if lo > self.log2_mbs[1]:
                raise InputError(
                    f"preferred size {needed} is above the largest max_batch_size "
                    f"{2 ** self.log2_mbs[1]}"
                )
            # Configs with max_batch_size below a fixed preferred size would be refused by
            # Triton: such points are removed from the space rather than sampled and rejected.
            object.__setattr__(self, "log2_mbs", (lo, self.log2_mbs[1]))

    @classmethod
    def from_bounds(
        cls,
        max_batch_size: tuple[int, int],
        max_queue_delay_us: tuple[int, int],
        delay_steps: int,
        preferred: str | Sequence[int],
        instance_count: tuple[int, int],
        cache_choices: tuple[bool | None, ...] = (None,),
        policy_choices: tuple[QueuePolicyKnob | None, ...] = (None,),
        candidate_choices: tuple[int | None, ...] = (None,),
        base: mc.ModelConfig | None = None,
        kind_choices: tuple[str | None, ...] = (None,),
        ragged_choices: tuple[bool | None, ...] = (None,),
    ) -> SearchSpace:
        """Build the space from the scenario's ``[space]`` bounds (``base``: the model's config,
        whose instance groups are searched one count each when it has several)."""
        fixed: tuple[int, ...] | None = None
        depth = 2
        if preferred == "none":
            depth = 0
        elif not isinstance(preferred, str):
            fixed = tuple(int(s) for s in preferred)
            depth = 0
        return cls(
            log2_mbs=(int(math.log2(max_batch_size[0])), int(math.log2(max_batch_size[1]))),
            delays_us=delay_ladder(max_queue_delay_us[0], max_queue_delay_us[1], delay_steps),
            max_pref_depth=depth,
            fixed_preferred=fixed,
            instances=instance_count,
            cache_choices=cache_choices,
            policy_choices=policy_choices,
            candidate_choices=candidate_choices,
            group_devices=None if base is None else group_devices(base),
            kind_choices=kind_choices,
            ragged_choices=ragged_choices,
        )

    # -- encoding -------------------------------------------------------------------------------

    def param_bounds(self) -> dict[str, tuple[int, int]]:
        """Integer parameters and their inclusive bounds (a dimension with one value is omitted)."""
        bounds = {
            "log2_mbs": self.log2_mbs,
            "delay_idx": (0, len(self.delays_us) - 1),
            "pref_depth": (0, self.max_pref_depth),
            **dict.fromkeys(self._instance_params(), self.instances),
            "cache_idx": (0, len(self.cache_choices) - 1),
            "policy_idx": (0, len(self.policy_choices) - 1),
            "cand_idx": (0, len(self.candidate_choices) - 1),
            "kind_idx": (0, len(self.kind_choices) - 1),
            "ragged_idx": (0, len(self.ragged_choices) - 1),
        }
        return {name: b for name, b in bounds.items() if b[0] < b[1]}

    def decode(self, params: Mapping[str, int]) -> Knobs:
        """Knobs from integer parameters (missing single-valued dimensions take their value)."""
        mbs = 2 ** int(params.get("log2_mbs", self.log2_mbs[0]))
        depth = int(params.get("pref_depth", 0))
        if self.fixed_preferred is not None:
            pref = tuple(sorted(self.fixed_preferred, reverse=True))
        else:
            pref = preferred_sizes(mbs, depth)
        counts = tuple(int(params.get(name, self.instances[0])) for name in self._instance_params())
        devices = self.group_devices
        return Knobs(
            max_batch_size=mbs,
            max_queue_delay_us=self.delays_us[int(params.get("delay_idx", 0))],
            preferred_batch_size=pref,
            instance_count=(
                counts[0]
                if devices is None
                else sum(c * d for c, d in zip(counts, devices, strict=True))
            ),
            response_cache=self.cache_choices[int(params.get("cache_idx", 0))],
            queue_policy=self.policy_choices[int(params.get("policy_idx", 0))],
            max_candidate_sequences=self.candidate_choices[int(params.get("cand_idx", 0))],
            group_counts=None if devices is None else counts,
            instance_kind=self.kind_choices[int(params.get("kind_idx", 0))],
            ragged_batch=self.ragged_choices[int(params.get("ragged_idx", 0))],
        )

    def encode(self, knobs: TrialKnobs) -> dict[str, int]:
        """The parameters of the grid point closest to ``knobs`` (used to seed the search)."""
        if not isinstance(knobs, Knobs):
            raise ValueError(f"knobs {knobs.label()!r} are not one batched model's")
        lo, hi = self.log2_mbs
        log2 = min(max(round(math.log2(max(knobs.max_batch_size, 1))), lo), hi)
        delay_idx = min(
            range(len(self.delays_us)),
            key=lambda i: abs(self.delays_us[i] - knobs.max_queue_delay_us),
        )
        depth = min(max(len(knobs.preferred_batch_size) - 1, 0), self.max_pref_depth)
        cache = knobs.response_cache
        policy = knobs.queue_policy
        cand = knobs.max_candidate_sequences
        params = {
            "log2_mbs": log2,
            "delay_idx": delay_idx,
            "pref_depth": depth,
            **self._encode_instances(knobs),
            "cache_idx": self.cache_choices.index(cache) if cache in self.cache_choices else 0,
            "policy_idx": (
                self.policy_choices.index(policy) if policy in self.policy_choices else 0
            ),
            "cand_idx": _nearest_choice(self.candidate_choices, cand),
            "kind_idx": (
                self.kind_choices.index(knobs.instance_kind)
                if knobs.instance_kind in self.kind_choices
                else 0
            ),
            "ragged_idx": (
                self.ragged_choices.index(knobs.ragged_batch)
                if knobs.ragged_batch in self.ragged_choices
                else 0
            ),
        }
        return {k: v for k, v in params.items() if k in self.param_bounds()}

    def _instance_params(self) -> tuple[str, ...]:
        """The instance dimensions: ``instances``, or ``instances_0``... for several groups."""
        devices = self.group_devices
        if devices is None or len(devices) == 1:
            return ("instances",)
        return tuple(f"instances_{i}" for i in range(len(devices)))

    def _encode_instances(self, knobs: Knobs) -> dict[str, int]:
        """Each group's count moved into the bounds; knobs without counts for these groups give
        every group their ``instance_count`` (as a count on the first group, before groups)."""
        names = self._instance_params()
        counts = knobs.group_counts
        if counts is None or len(counts) != len(names):
            counts = (knobs.instance_count,) * len(names)
        lo, hi = self.instances
        return {name: min(max(c, lo), hi) for name, c in zip(names, counts, strict=True)}

    def _every_group(self, count: int) -> dict[str, int]:
        """Parameters giving every instance group ``count``."""
        return dict.fromkeys(self._instance_params(), count)

    def points(self) -> Iterator[dict[str, int]]:
        """Every grid point's parameters (brute force and benchmarks)."""
        return _points(self.param_bounds())

    def size(self) -> int:
        """Number of grid points."""
        return math.prod(hi - lo + 1 for lo, hi in self.param_bounds().values())

    def seeds(
        self, start: TrialKnobs | None = None, p99_goal_ms: float | None = None
    ) -> list[Knobs]:
        """Sensible first configs to measure before the sampler takes over.

        The model's own config moved onto the grid; Triton's documented starting point
        (``dynamic_batching {}``: largest batch, no delay) with one instance and with the most
        instances; and, when the latency goal is known, the largest batch with a queue delay of
        a quarter of the goal on half the instances (the Nexus rule of thumb: spend up to half
        the budget forming and running a batch). These replace random start-up trials.
        """
        lo, hi = self.log2_mbs
        ilo, ihi = self.instances
        candidates: list[Knobs] = []
        if isinstance(start, Knobs):
            candidates.append(self.decode(self.encode(start)))
        candidates.append(self.decode({"log2_mbs": hi, "delay_idx": 0, **self._every_group(ilo)}))
        candidates.append(self.decode({"log2_mbs": hi, "delay_idx": 0, **self._every_group(ihi)}))
        if p99_goal_ms is not None:
            quarter = Knobs(
                max_batch_size=2 ** ((lo + hi + 1) // 2),
                max_queue_delay_us=round(p99_goal_ms * 1000 / 4),
                instance_count=(ilo + ihi + 1) // 2,
            )
            candidates.append(self.decode(self.encode(quarter)))
        unique: list[Knobs] = []
        for knobs in candidates:
            if knobs not in unique:
                unique.append(knobs)
        return unique


@dataclass(frozen=True)
class JointSpace:
    """A pipeline's space: one :class:`SearchSpace` per composing model, searched as one grid
    (the same interface: the parameters of stage ``m`` are ``m.<parameter>``)."""

    stages: tuple[tuple[str, SearchSpace], ...]

    def param_bounds(self) -> dict[str, tuple[int, int]]:
        return {
            f"{name}.{param}": bounds
            for name, space in self.stages
            for param, bounds in space.param_bounds().items()
        }

    def decode(self, params: Mapping[str, int]) -> JointKnobs:
        return JointKnobs(
            tuple((name, space.decode(_stage_params(params, name))) for name, space in self.stages)
        )

    def encode(self, knobs: TrialKnobs) -> dict[str, int]:
        if not isinstance(knobs, JointKnobs) or knobs.names != tuple(n for n, _ in self.stages):
            raise ValueError(f"knobs {knobs.label()!r} are not this pipeline's")
        return {
            f"{name}.{param}": value
            for name, space in self.stages
            for param, value in space.encode(knobs.stage(name)).items()
        }

    def points(self) -> Iterator[dict[str, int]]:
        return _points(self.param_bounds())

    def size(self) -> int:
        return math.prod(space.size() for _, space in self.stages)

    def seeds(
        self, start: TrialKnobs | None = None, p99_goal_ms: float | None = None
    ) -> list[JointKnobs]:
        """Every stage's :meth:`SearchSpace.seeds` zipped (a stage with fewer repeats its
        last): the pipeline's own configs, then every stage at its largest batch with one and
        with the most instances, then the quarter-of-the-goal rule with the goal split evenly
        among the stages (they run one after another)."""
        share = None if p99_goal_ms is None else p99_goal_ms / len(self.stages)
        per_stage = [
            space.seeds(start.stage(name) if isinstance(start, JointKnobs) else None, share)
            for name, space in self.stages
        ]
        unique: list[JointKnobs] = []
        for i in range(max(len(seeds) for seeds in per_stage)):
            knobs = JointKnobs(
                tuple(
                    (name, seeds[min(i, len(seeds) - 1)])
                    for (name, _), seeds in zip(self.stages, per_stage, strict=True)
                )
            )
            if knobs not in unique:
                unique.append(knobs)
        return unique


#: A generative engine's running-set sizes searched when the scenario names none.
DEFAULT_MAX_NUM_SEQS = (1, 2, 4, 8, 16, 32, 64)
#: Its step token budgets searched when the scenario names none.
DEFAULT_MAX_NUM_BATCHED_TOKENS = (512, 2048, 8192)


@dataclass(frozen=True)
class EngineSpace:
    """A generative engine's space (:class:`EngineKnobs`): each knob an index into its values,
    the same interface as :class:`SearchSpace`::

        seqs_idx     max_num_seqs = seqs[seqs_idx]
        tokens_idx   max_num_batched_tokens = tokens[tokens_idx]
        chunked_idx  enable_chunked_prefill = chunked[chunked_idx]  (only with two choices)
        memory_idx   gpu_memory_utilization = memory[memory_idx]   (the same)
        instances    the engine count

    Attributes:
        seqs: ``max_num_seqs`` values, ascending.
        tokens: ``max_num_batched_tokens`` values, ascending.
        chunked: ``enable_chunked_prefill`` values searched.
        memory: ``gpu_memory_utilization`` values (``(None,)``: the engine's own).
        instances: Inclusive bounds of the engine count.
        policy: TensorRT-LLM's ``batch_scheduler_policy`` of every config (None: the model's).
    """

    seqs: tuple[int, ...] = DEFAULT_MAX_NUM_SEQS
    tokens: tuple[int, ...] = DEFAULT_MAX_NUM_BATCHED_TOKENS
    chunked: tuple[bool, ...] = (True,)
    memory: tuple[float | None, ...] = (None,)
    instances: tuple[int, int] = (1, 1)
    policy: str | None = None

    def __post_init__(self) -> None:
        for name in ("seqs", "tokens", "chunked", "memory"):
            if not getattr(self, name):
                raise ValueError(f"an engine space needs one or more {name} values")

    def param_bounds(self) -> dict[str, tuple[int, int]]:
        bounds = {
            "seqs_idx": (0, len(self.seqs) - 1),
            "tokens_idx": (0, len(self.tokens) - 1),
            "chunked_idx": (0, len(self.chunked) - 1),
            "memory_idx": (0, len(self.memory) - 1),
            "instances": self.instances,
        }
        return {name: b for name, b in bounds.items() if b[0] < b[1]}

    def decode(self, params: Mapping[str, int]) -> EngineKnobs:
        return EngineKnobs(
            max_num_seqs=self.seqs[int(params.get("seqs_idx", 0))],
            max_num_batched_tokens=self.tokens[int(params.get("tokens_idx", 0))],
            enable_chunked_prefill=self.chunked[int(params.get("chunked_idx", 0))],
            gpu_memory_utilization=self.memory[int(params.get("memory_idx", 0))],
            instance_count=int(params.get("instances", self.instances[0])),
            batch_scheduler_policy=self.policy,
        )

    def encode(self, knobs: TrialKnobs) -> dict[str, int]:
        """The parameters of the grid point closest to ``knobs`` (each value the nearest)."""
        if not isinstance(knobs, EngineKnobs):
            raise ValueError(f"knobs {knobs.label()!r} are not an engine's")
        lo, hi = self.instances
        memory = knobs.gpu_memory_utilization
        params = {
            "seqs_idx": _nearest_index(self.seqs, knobs.max_num_seqs),
            "tokens_idx": _nearest_index(self.tokens, knobs.max_num_batched_tokens),
            "chunked_idx": (
                self.chunked.index(knobs.enable_chunked_prefill)
                if knobs.enable_chunked_prefill in self.chunked
                else 0
            ),
            "memory_idx": (
                self.memory.index(memory)
                if memory in self.memory
                else _nearest_index(self.memory, memory)
            ),
            "instances": min(max(knobs.instance_count, lo), hi),
        }
        return {k: v for k, v in params.items() if k in self.param_bounds()}

    def points(self) -> Iterator[dict[str, int]]:
        return _points(self.param_bounds())

    def size(self) -> int:
        return math.prod(hi - lo + 1 for lo, hi in self.param_bounds().values())

    def seeds(
        self, start: TrialKnobs | None = None, p99_goal_ms: float | None = None
    ) -> list[EngineKnobs]:
        """The engine's own settings moved onto the grid, then the largest running set with
        the largest token budget (the throughput end: vLLM's defaults are of that kind) and
        the middle of both (``p99_goal_ms`` is not used: the token goals decide)."""
        candidates: list[EngineKnobs] = []
        if isinstance(start, EngineKnobs):
            candidates.append(self.decode(self.encode(start)))
        last = {"seqs_idx": len(self.seqs) - 1, "tokens_idx": len(self.tokens) - 1}
        middle = {"seqs_idx": len(self.seqs) // 2, "tokens_idx": len(self.tokens) // 2}
        candidates.append(self.decode(last))
        candidates.append(self.decode(middle))
        return list(dict.fromkeys(candidates))


#: Either kind of space (the study sees only this interface).
Space = SearchSpace | JointSpace | EngineSpace


def grid_configs(space: Space) -> list[TrialKnobs]:
    """Every distinct config of the space, in its order (grid points that decode to the same
    config, e.g. preferred-size depths beyond a small max batch size, count once)."""
    seen: dict[TrialKnobs, None] = {}
    for params in space.points():
        seen.setdefault(space.decode(params), None)
    return list(seen)


def _points(bounds: Mapping[str, tuple[int, int]]) -> Iterator[dict[str, int]]:
    names = list(bounds)
    ranges = [range(lo, hi + 1) for lo, hi in bounds.values()]
    for combo in itertools.product(*ranges):
        yield dict(zip(names, combo, strict=True))


def _stage_params(params: Mapping[str, int], name: str) -> dict[str, int]:
    prefix = f"{name}."
    return {k.removeprefix(prefix): v for k, v in params.items() if k.startswith(prefix)}


def _nearest_index(values: Sequence[float | None], value: float | None) -> int:
    """Index of the value of ``values`` nearest ``value`` (the first for None)."""
    if value is None:
        return 0
    numbers = [(abs(v - value), i) for i, v in enumerate(values) if v is not None]
    return min(numbers)[1] if numbers else 0


def _nearest_choice(choices: Sequence[int | None], value: int | None) -> int:
    """Index of ``value`` among ``choices``; an int not among them takes the nearest int choice
    (a model's own candidate count moved onto the grid), anything else the first."""
    if value in choices:
        return choices.index(value)
    if value is None:
        return 0
    numbers = [(abs(c - value), i) for i, c in enumerate(choices) if c is not None]
    return min(numbers)[1] if numbers else 0
