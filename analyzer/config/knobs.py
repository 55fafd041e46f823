"""One trial's knobs and the config they make.

Nothing here imports optuna or gevent, so the dashboard and the report can use the knobs
cheaply. ``analyzer.search.study`` encodes :class:`Knobs` for the sampler; ``analyzer.sweep.loop``
measures trials with :class:`analyzer.evaluation.Evaluator` and records each as an
:class:`analyzer.rundir.trial_record.TrialRecord` (the one trial record type; its typed measurement answers
what the trial's numbers rest on).

The instance kind (``KIND_CPU`` vs ``KIND_GPU``) is a knob when ``space.instance_kind`` lists
both (:func:`kind_choices`). The response cache is a knob too (``response_cache { enable }``), searched only when the
scenario asks for it (:func:`response_cache_choices`). A trial whose cache answers repeated
payloads is faster without the model being faster, so every figure measured with hits carries
its hit ratio (``analyzer.target.server_stats.cache_hit_ratio``); a managed server needs a cache of its
own for the knob to mean anything (:func:`cache_server_args`).

Priority levels and queue policies are one knob (:class:`QueuePolicyKnob`: ``priority_levels``,
``default_priority_level``, ``default_queue_policy``, ``priority_queue_policy``), searched only
when the scenario asks for it (:func:`queue_policy_choices`): a traffic mix with a priority per
class can then meet a tight goal for its urgent class by letting the other class wait, be
delayed or be rejected after a timeout derived from its own goal.

A stateful model with the sequence batcher's ``oldest`` strategy is tuned with the same knobs:
:func:`apply_knobs` writes the delay and the preferred sizes into ``sequence_batching.oldest``
(never ``dynamic_batching``: the two share one proto ``oneof``, so setting one erases the
other), and :attr:`Knobs.max_candidate_sequences` into ``oldest.max_candidate_sequences``
(searched only when the scenario names values: :func:`candidate_choices`). The response cache
and queue policies have no place in a sequence model (Triton refuses the cache for it, and the
sequence batcher has no priority levels), so they stay refused there.

Instance groups are counted as Triton counts them (:func:`instances_of`: a ``KIND_GPU`` group
runs its count on each listed GPU). A config with several groups, or one group on several GPUs,
is searched per group (:attr:`Knobs.group_counts`): :func:`apply_knobs` keeps every group, its
kind and its GPU list, and sets each count.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from tritonclient.grpc import model_config_pb2 as mc

from analyzer.errors import InputError

#: ``space.response_cache``: None leaves the model's own setting; ``search`` tries both.
ResponseCacheSetting = Literal["off", "on", "search"] | None

#: ``space.instance_kind``'s values: where the instances run (Triton's KIND_AUTO and KIND_MODEL
#: are left to the model's own config).
INSTANCE_KINDS = ("KIND_CPU", "KIND_GPU")

#: Cache of a managed reference server when the scenario names no size: 64 MiB.
DEFAULT_CACHE_SIZE_BYTES = 64 * 1024 * 1024

#: ``space.queue_policy``: None leaves the model's own setting; ``off`` clears priorities and
#: queue policies (one FIFO, no timeouts); ``search`` tries :func:`queue_policy_choices`.
QueuePolicySetting = Literal["off", "search"] | None

#: ``ModelQueuePolicy.timeout_action``.
TimeoutAction = Literal["REJECT", "DELAY"]

#: Multiples of the low class's latency goal tried as its queue timeout.
TIMEOUT_GOAL_FACTORS = (0.5, 1.0, 2.0)


@dataclass(frozen=True)
class LevelPolicy:
    """One ``ModelQueuePolicy``: what a priority level's queue does with waiting requests.

    Attributes:
        timeout_us: ``default_timeout_microseconds``: how long a request of the level may wait
            in the queue, microseconds (0: forever).
        timeout_action: ``REJECT`` answers a request that waited too long with an error;
            ``DELAY`` moves it behind the level's requests that did not.
        max_queue_size: Requests of the level the queue holds; more are rejected (0: no bound).
        allow_timeout_override: A request's own ``timeout`` parameter may shorten ``timeout_us``.
    """

    timeout_us: int = 0
    timeout_action: TimeoutAction = "REJECT"
    max_queue_size: int = 0
    allow_timeout_override: bool = False

    def __post_init__(self) -> None:
        if self.timeout_action not in ("REJECT", "DELAY"):
            raise ValueError(f"timeout_action {self.timeout_action!r}: use REJECT or DELAY")
        if self.timeout_us < 0 or self.max_queue_size < 0:
            raise ValueError("timeout_us and max_queue_size must be >= 0")

    def to_dict(self) -> dict[str, Any]:
        """JSON form (the fields by name)."""
        return {
            "timeout_us": self.timeout_us,
            "timeout_action": self.timeout_action,
            "max_queue_size": self.max_queue_size,
            "allow_timeout_override": self.allow_timeout_override,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> LevelPolicy:
        """Inverse of :meth:`to_dict` (missing fields: Triton's defaults)."""
        action = str(data.get("timeout_action", "REJECT"))
        if action not in ("REJECT", "DELAY"):
            raise ValueError(f"timeout_action {action!r}: use REJECT or DELAY")
        return cls(
            timeout_us=int(data.get("timeout_us", 0)),
            timeout_action="DELAY" if action == "DELAY" else "REJECT",
            max_queue_size=int(data.get("max_queue_size", 0)),
            allow_timeout_override=bool(data.get("allow_timeout_override", False)),
        )

    def label(self) -> str:
        """``reject@25000us``, ``delay@50000us,max64``, ``-`` (no timeout, no bound)."""
        parts = []
        if self.timeout_us:
            parts.append(f"{self.timeout_action.lower()}@{self.timeout_us}us")
        if self.max_queue_size:
            parts.append(f"max{self.max_queue_size}")
        if self.allow_timeout_override:
            parts.append("override")
        return ",".join(parts) or "-"

    def to_proto(self) -> mc.ModelQueuePolicy:
        """The ``ModelQueuePolicy`` message."""
        return mc.ModelQueuePolicy(
            timeout_action=mc.ModelQueuePolicy.TimeoutAction.Value(self.timeout_action),
            default_timeout_microseconds=self.timeout_us,
            allow_timeout_override=self.allow_timeout_override,
            max_queue_size=self.max_queue_size,
        )

    @classmethod
    def of(cls, policy: mc.ModelQueuePolicy) -> LevelPolicy:
        """From a ``ModelQueuePolicy`` message."""
        delay = policy.timeout_action == mc.ModelQueuePolicy.DELAY
        return cls(
            timeout_us=int(policy.default_timeout_microseconds),
            timeout_action="DELAY" if delay else "REJECT",
            max_queue_size=int(policy.max_queue_size),
            allow_timeout_override=bool(policy.allow_timeout_override),
        )


@dataclass(frozen=True)
class QueuePolicyKnob:
    """Priority levels and queue policies of the dynamic batcher, one field per proto field.

    ``QueuePolicyKnob()`` is one FIFO queue without timeouts (what a config without these
    fields does); :func:`apply_knobs` then clears them.

    Attributes:
        priority_levels: ``priority_levels`` (0: no priorities, every request in one queue).
        default_priority_level: The level of a request that sends no priority (or one above
            ``priority_levels``); 1..priority_levels when there are levels, else 0.
        default_policy: ``default_queue_policy``: the policy of every level without its own.
        level_policies: ``priority_queue_policy``: (level, policy) pairs, by level.
    """

    priority_levels: int = 0
    default_priority_level: int = 0
    default_policy: LevelPolicy = LevelPolicy()
    level_policies: tuple[tuple[int, LevelPolicy], ...] = ()

    def __post_init__(self) -> None:
        levels = self.priority_levels
        if levels < 0:
            raise ValueError(f"priority_levels {levels} must be >= 0")
        if levels and not 1 <= self.default_priority_level <= levels:
            raise ValueError(
                f"default_priority_level {self.default_priority_level} must be in 1..{levels}"
            )
        if not levels and self.default_priority_level:
            raise ValueError("default_priority_level needs priority_levels >= 1")
        numbers = [level for level, _ in self.level_policies]
        if numbers != sorted(set(numbers)) or any(not 1 <= n <= levels for n in numbers):
            raise ValueError(
                f"level_policies must name distinct levels in 1..{levels}, in order: {numbers}"
            )

    @property
    def fifo(self) -> bool:
        """No priorities, no timeouts, no bound: schedules as a config without these fields."""
        return self == QueuePolicyKnob()

    def policy(self, level: int) -> LevelPolicy:
        """The policy that governs ``level``."""
        return dict(self.level_policies).get(level, self.default_policy)

    def to_dict(self) -> dict[str, Any]:
        """JSON form: the proto field names, ``priority_queue_policy`` keyed by level."""
        return {
            "priority_levels": self.priority_levels,
            "default_priority_level": self.default_priority_level,
            "default_queue_policy": self.default_policy.to_dict(),
            "priority_queue_policy": {str(n): p.to_dict() for n, p in self.level_policies},
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> QueuePolicyKnob:
        """Inverse of :meth:`to_dict`."""
        levels = data.get("priority_queue_policy", {})
        return cls(
            priority_levels=int(data.get("priority_levels", 0)),
            default_priority_level=int(data.get("default_priority_level", 0)),
            default_policy=LevelPolicy.from_dict(data.get("default_queue_policy", {})),
            level_policies=tuple(
                sorted((int(n), LevelPolicy.from_dict(p)) for n, p in levels.items())
            ),
        )

    def label(self) -> str:
        """``prio=2/2 p2=reject@25000us`` (levels/default level, then each level's own
        policy); ``queue=delay@5000us`` for a default policy; ``fifo`` for none."""
        if self.fifo:
            return "fifo"
        parts = [f"prio={self.priority_levels}/{self.default_priority_level}"]
        if self.default_policy != LevelPolicy():
            parts.append(f"queue={self.default_policy.label()}")
        if not self.priority_levels:
            parts = parts[1:]
        parts.extend(f"p{n}={p.label()}" for n, p in self.level_policies)
        return " ".join(parts)

    @classmethod
    def of(cls, batcher: mc.ModelDynamicBatching) -> QueuePolicyKnob:
        """What a ``dynamic_batching`` block sets."""
        return cls(
            priority_levels=int(batcher.priority_levels),
            default_priority_level=int(batcher.default_priority_level),
            default_policy=(
                LevelPolicy.of(batcher.default_queue_policy)
                if batcher.HasField("default_queue_policy")
                else LevelPolicy()
            ),
            level_policies=tuple(
                sorted(
                    (int(n), LevelPolicy.of(p)) for n, p in batcher.priority_queue_policy.items()
                )
            ),
        )

    def write(self, batcher: mc.ModelDynamicBatching) -> None:
        """Set these fields of ``batcher`` (replacing what it had; a default policy equal to
        Triton's own is left unset, as a hand-written config leaves it)."""
        batcher.priority_levels = self.priority_levels
        batcher.default_priority_level = self.default_priority_level
        batcher.ClearField("default_queue_policy")
        if self.default_policy != LevelPolicy():
            batcher.default_queue_policy.CopyFrom(self.default_policy.to_proto())
        batcher.ClearField("priority_queue_policy")
        for level, policy in self.level_policies:
            batcher.priority_queue_policy[level].CopyFrom(policy.to_proto())


@dataclass(frozen=True)
class Knobs:
    """The searched part of a model config.

    Attributes:
        max_batch_size: Largest batch the scheduler forms (``max_batch_size``).
        max_queue_delay_us: How long a request may wait for a batch to fill, microseconds.
        preferred_batch_size: Batch sizes the scheduler dispatches as soon as it can form them.
        instance_count: Model instances, counted as Triton does (:func:`instances_of`: a
            ``KIND_GPU`` group runs ``count`` per listed GPU); without :attr:`group_counts`,
            the count of ``instance_group[0]``.
        dynamic_batching: False only for a baseline config without a dynamic batcher (a
            stateful model's ``oldest`` strategy counts as one: the knobs go into it).
        response_cache: ``response_cache { enable }``; None keeps the base config's setting
            (what every trial did before the cache was a knob).
        queue_policy: Priority levels and queue policies of the dynamic batcher; None keeps the
            base config's (what every trial did before they were a knob).
        max_candidate_sequences: ``sequence_batching.oldest.max_candidate_sequences`` of a
            stateful model: how many sequences per instance may have a request in the batcher
            at once (the rest wait in the backlog); None keeps the base config's.
        group_counts: ``count`` of each instance group of the base config, in order (every
            group kept with its kind, GPU list and other fields); None: one group, whose count
            is :attr:`instance_count` (what every trial did before groups were searched).
        instance_kind: ``KIND_CPU`` or ``KIND_GPU`` for the instance group (``space.
            instance_kind``); None keeps the base config's kind.
    """

    max_batch_size: int
    max_queue_delay_us: int = 0
    preferred_batch_size: tuple[int, ...] = ()
    instance_count: int = 1
    dynamic_batching: bool = True
    response_cache: bool | None = None
    queue_policy: QueuePolicyKnob | None = None
    max_candidate_sequences: int | None = None
    group_counts: tuple[int, ...] | None = None
    instance_kind: str | None = None

    def __post_init__(self) -> None:
        if self.instance_kind not in (None, *INSTANCE_KINDS):
            raise ValueError(
                f"instance_kind {self.instance_kind!r}: use one of {', '.join(INSTANCE_KINDS)}"
            )
        if self.group_counts is not None and (not self.group_counts or min(self.group_counts) < 1):
            raise ValueError(
                f"group_counts {self.group_counts} needs one count >= 1 per instance group "
                "(None: one group of instance_count)"
            )
        if self.queue_policy is not None and not self.dynamic_batching:
            raise ValueError("a queue policy needs dynamic batching: it is part of that block")
        if self.max_candidate_sequences is not None and self.max_candidate_sequences < 1:
            raise ValueError(
                f"max_candidate_sequences {self.max_candidate_sequences} must be >= 1 "
                "(None: the model's own)"
            )

    def to_dict(self) -> dict[str, Any]:
        """The ``config`` object of every result file (see docs/reference.md)."""
        out: dict[str, Any] = {
            "max_batch_size": self.max_batch_size,
            "max_queue_delay_us": self.max_queue_delay_us,
            "preferred_batch_size": list(self.preferred_batch_size),
            "instance_count": self.instance_count,
        }
        if not self.dynamic_batching:
            out["dynamic_batching"] = False
        if self.response_cache is not None:
            out["response_cache"] = self.response_cache
        if self.queue_policy is not None:
            out["queue_policy"] = self.queue_policy.to_dict()
        if self.max_candidate_sequences is not None:
            out["max_candidate_sequences"] = self.max_candidate_sequences
        if self.group_counts is not None:
            out["group_counts"] = list(self.group_counts)
        if self.instance_kind is not None:
            out["instance_kind"] = self.instance_kind
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Knobs:
        """Inverse of :meth:`to_dict`."""
        return cls(
            max_batch_size=int(data["max_batch_size"]),
            max_queue_delay_us=int(data["max_queue_delay_us"]),
            preferred_batch_size=tuple(int(s) for s in data["preferred_batch_size"]),
            instance_count=int(data["instance_count"]),
            dynamic_batching=bool(data.get("dynamic_batching", True)),
            response_cache=(
                None if data.get("response_cache") is None else bool(data["response_cache"])
            ),
            queue_policy=(
                None
                if data.get("queue_policy") is None
                else QueuePolicyKnob.from_dict(data["queue_policy"])
            ),
            max_candidate_sequences=(
                None
                if data.get("max_candidate_sequences") is None
                else int(data["max_candidate_sequences"])
            ),
            group_counts=(
                None
                if data.get("group_counts") is None
                else tuple(int(c) for c in data["group_counts"])
            ),
            instance_kind=data.get("instance_kind"),
        )

    def label(self) -> str:
        """Short human label: ``mbs=16 delay=500us pref=[16,8] x2`` (`` cache`` / `` no cache``
        after it when the knobs set the response cache, then the queue policy's
        :meth:`QueuePolicyKnob.label` when they set one: `` prio=2/2 p2=reject@25000us``, then
        `` cand=4`` when they set ``max_candidate_sequences``); with :attr:`group_counts`, the
        total is followed by each group's count: ``x5 groups=[2,1]``; a set instance kind follows
        the count: ``x2 gpu`` / ``x2 cpu``."""
        cache = {None: "", True: " cache", False: " no cache"}[self.response_cache]
        count = f"x{self.instance_count}"
        if self.group_counts is not None:
            count += f" groups=[{','.join(str(c) for c in self.group_counts)}]"
        if self.instance_kind is not None:
            count += " " + self.instance_kind.removeprefix("KIND_").lower()
        cand = (
            "" if self.max_candidate_sequences is None else f" cand={self.max_candidate_sequences}"
        )
        if not self.dynamic_batching:
            return f"mbs={self.max_batch_size} no dynamic batching {count}{cache}"
        pref = ",".join(str(s) for s in self.preferred_batch_size) or "-"
        policy = "" if self.queue_policy is None else f" {self.queue_policy.label()}"
        return (
            f"mbs={self.max_batch_size} delay={self.max_queue_delay_us}us "
            f"pref=[{pref}] {count}{cache}{policy}{cand}"
        )


# --------------------------------------------------------------------------------------------------
# Configs


def devices_of(group: mc.ModelInstanceGroup) -> int:
    """Instances one ``count`` of ``group`` makes: one per listed GPU of a ``KIND_GPU`` group
    (Triton places ``count`` instances on each), else 1."""
    if group.kind == mc.ModelInstanceGroup.KIND_GPU and group.gpus:
        return len(group.gpus)
    return 1


def instances_of(group: mc.ModelInstanceGroup) -> int:
    """Instances Triton runs for one instance group: ``{count: 2, gpus: [0, 1]}`` of
    ``KIND_GPU`` runs 4; any other group its count (0 reads as Triton's default, 1).

    A ``KIND_GPU`` group without a GPU list runs ``count`` on every GPU the server sees, which
    the config alone does not say; the config a server serves (``GET /v2/models/<m>/config``)
    lists them, and that is the one a sweep reads.
    """
    return (group.count or 1) * devices_of(group)


def group_devices(config: mc.ModelConfig) -> tuple[int, ...] | None:
    """:func:`devices_of` for each instance group of ``config``, or None when its instances are
    one plain count (at most one group, on at most one device): then :attr:`Knobs.group_counts`
    stays None and the knobs are what they were before groups were searched."""
    groups = config.instance_group
    if len(groups) <= 1 and all(devices_of(g) == 1 for g in groups):
        return None
    return tuple(devices_of(g) for g in groups)


def _instances(config: mc.ModelConfig) -> tuple[int, tuple[int, ...] | None]:
    """``(instance_count, group_counts)`` of :func:`knobs_of`."""
    total = sum(instances_of(g) for g in config.instance_group) or 1
    if group_devices(config) is None:
        return total, None
    return total, tuple(g.count or 1 for g in config.instance_group)


def knobs_of(config: mc.ModelConfig) -> Knobs:
    """The knobs a ModelConfig sets (the baseline's knobs).

    A preferred list of exactly ``[max_batch_size]`` reads as none: it is how Triton normalises
    ``dynamic_batching {}``, and it batches the same way. A config that enables the response
    cache reads as ``response_cache=True`` (one that does not: None, the default). A dynamic
    batcher with priority levels or a queue policy reads as its :class:`QueuePolicyKnob` (one
    without: None, the default).

    A sequence-batched config reads from its strategy (``oldest``, or ``direct``'s delay), with
    ``max_candidate_sequences`` when the config sets it (0, Triton's "one per batch slot",
    reads as None).

    Instances are counted as Triton does (:func:`instances_of`); a config with several groups,
    or one group on several GPUs, also reads as its :attr:`Knobs.group_counts`.
    """
    if config.HasField("sequence_batching"):
        return _sequence_knobs_of(config)
    batching = config.HasField("dynamic_batching")
    batcher = config.dynamic_batching
    preferred = tuple(batcher.preferred_batch_size) if batching else ()
    if preferred == (config.max_batch_size,):
        preferred = ()
    policy = QueuePolicyKnob.of(batcher) if batching else None
    instances, counts = _instances(config)
    return Knobs(
        max_batch_size=max(config.max_batch_size, 1),
        max_queue_delay_us=int(batcher.max_queue_delay_microseconds) if batching else 0,
        preferred_batch_size=preferred,
        instance_count=instances,
        dynamic_batching=batching,
        response_cache=True if config.response_cache.enable else None,
        queue_policy=None if policy is None or policy.fifo else policy,
        group_counts=counts,
    )


def _sequence_knobs_of(config: mc.ModelConfig) -> Knobs:
    """:func:`knobs_of` for a ``sequence_batching`` config."""
    sb = config.sequence_batching
    oldest = sb.HasField("oldest")
    preferred = tuple(sb.oldest.preferred_batch_size) if oldest else ()
    if preferred == (config.max_batch_size,):
        preferred = ()  # Triton's normalisation of an empty list, as for dynamic_batching
    delay = (
        sb.oldest.max_queue_delay_microseconds if oldest else sb.direct.max_queue_delay_microseconds
    )
    candidates = int(sb.oldest.max_candidate_sequences) if oldest else 0
    instances, counts = _instances(config)
    return Knobs(
        max_batch_size=max(config.max_batch_size, 1),
        max_queue_delay_us=int(delay),
        preferred_batch_size=preferred,
        instance_count=instances,
        response_cache=True if config.response_cache.enable else None,
        max_candidate_sequences=candidates or None,
        group_counts=counts,
    )


def _write_oldest(config: mc.ModelConfig, knobs: Knobs) -> None:
    """Set the knobs of ``config``'s ``sequence_batching.oldest`` (never ``dynamic_batching``:
    the two share one oneof, so setting it would erase the sequence batcher).

    Raises:
        ValueError: a config or knobs Triton could not serve as asked: the ``direct`` strategy
            (no batching delay to tune), no batcher, a queue policy or the response cache.
    """
    sb = config.sequence_batching
    if not sb.HasField("oldest"):
        raise ValueError(
            f"model {config.name!r} uses the sequence batcher's direct strategy, which has no "
            "batching delay or preferred sizes to tune; give it the oldest strategy"
        )
    if not knobs.dynamic_batching:
        raise ValueError("a sequence-batched model always batches: dynamic_batching=False")
    if knobs.queue_policy is not None:
        raise ValueError("the sequence batcher has no priority levels or queue policies")
    if knobs.response_cache:
        raise ValueError("Triton allows no response cache for a sequence-batched model")
    sb.oldest.max_queue_delay_microseconds = knobs.max_queue_delay_us
    del sb.oldest.preferred_batch_size[:]
    sb.oldest.preferred_batch_size.extend(knobs.preferred_batch_size)
    if knobs.max_candidate_sequences is not None:
        sb.oldest.max_candidate_sequences = knobs.max_candidate_sequences


def _write_group_counts(config: mc.ModelConfig, knobs: Knobs) -> None:
    """Set the count of each of ``config``'s instance groups from :attr:`Knobs.group_counts`."""
    counts = knobs.group_counts or ()
    groups = config.instance_group
    if len(counts) != len(groups):
        raise ValueError(
            f"group_counts {list(counts)} name {len(counts)} instance groups; model "
            f"{config.name!r} has {len(groups)}"
        )
    for group, count in zip(groups, counts, strict=True):
        group.count = count
    total = sum(instances_of(g) for g in groups)
    if total != knobs.instance_count:
        raise ValueError(
            f"group_counts {list(counts)} make {total} instances in model {config.name!r} "
            f"(a KIND_GPU group runs its count on each listed GPU), not instance_count "
            f"{knobs.instance_count}"
        )


def apply_knobs(base: mc.ModelConfig, knobs: Knobs) -> mc.ModelConfig:
    """``base`` with the knobs set; everything else (inputs, backend, parameters) kept.

    With :attr:`Knobs.group_counts`, each group of the base gets its count and keeps its kind,
    GPU list and every other field. Without, the instance count goes on the first instance
    group (one is created, of kind ``KIND_AUTO``, when the base has none) and other groups are
    dropped because the count is a total (what every trial did before groups were searched).
    The response
    cache is set only when the knobs say so (False clears the section), and so are priority
    levels and queue policies (:meth:`QueuePolicyKnob.write`; ``QueuePolicyKnob()`` clears them).

    A base with ``sequence_batching { oldest {...} }`` gets the delay, the preferred sizes and
    ``max_candidate_sequences`` (when set) in ``oldest``; ``dynamic_batching`` stays unset.

    Raises:
        ValueError: knobs the base cannot take: ``max_candidate_sequences`` without the oldest
            strategy; ``group_counts`` for another number of groups, or whose instances
            (Triton's counting) are not ``instance_count``; for a sequence-batched base, see
            :func:`_write_oldest`.
    """
    config = mc.ModelConfig()
    config.CopyFrom(base)
    config.max_batch_size = knobs.max_batch_size
    if base.HasField("sequence_batching"):
        _write_oldest(config, knobs)
    elif knobs.max_candidate_sequences is not None:
        raise ValueError(
            f"max_candidate_sequences needs the sequence batcher's oldest strategy; model "
            f"{base.name!r} has none"
        )
    elif knobs.dynamic_batching:
        config.dynamic_batching.max_queue_delay_microseconds = knobs.max_queue_delay_us
        del config.dynamic_batching.preferred_batch_size[:]
        config.dynamic_batching.preferred_batch_size.extend(knobs.preferred_batch_size)
        if knobs.queue_policy is not None:
            knobs.queue_policy.write(config.dynamic_batching)
    else:
        config.ClearField("dynamic_batching")
    if knobs.group_counts is not None:
        _write_group_counts(config, knobs)
    else:
        first = mc.ModelInstanceGroup()
        if base.instance_group:
            first.CopyFrom(base.instance_group[0])
        else:
            first.kind = mc.ModelInstanceGroup.KIND_AUTO
        first.count = knobs.instance_count
        del config.instance_group[:]
        config.instance_group.append(first)
    if knobs.instance_kind is not None:
        if knobs.group_counts is not None:
            raise ValueError(
                f"instance_kind sets the kind of one instance group; model {base.name!r} has "
                "several groups, or one on several GPUs"
            )
        (group,) = config.instance_group
        group.kind = mc.ModelInstanceGroup.Kind.Value(knobs.instance_kind)
        if knobs.instance_kind == "KIND_CPU":
            del group.gpus[:]  # a KIND_CPU group with a GPU list is refused by Triton
    if knobs.response_cache is True:
        config.response_cache.enable = True
    elif knobs.response_cache is False:
        config.ClearField("response_cache")
    return config


# --------------------------------------------------------------------------------------------------
# The instance kind as a knob


def kind_choices(
    values: Sequence[str] | None, base: mc.ModelConfig | None = None
) -> tuple[str | None, ...]:
    """The values of :attr:`Knobs.instance_kind` a search tries for ``space.instance_kind``.

    ``None`` (or an empty list): (None,) -- the model's own kind. A kind the host lacks (KIND_GPU
    on a server without a GPU) is not refused here: the server refuses such a config, as Triton
    does, and the trial fails with its message.

    Raises:
        InputError: an unknown kind, or a base whose instances are not one group on at most one
            GPU (searching the kind of several groups is not built).
    """
    if not values:
        return (None,)
    unknown = [v for v in values if v not in INSTANCE_KINDS]
    if unknown:
        raise InputError(
            f"space.instance_kind: unknown kind(s) {unknown}; use {', '.join(INSTANCE_KINDS)}"
        )
    if base is not None and group_devices(base) is not None:
        raise InputError(
            f"space.instance_kind: model '{base.name}' has several instance groups, or one on "
            "several GPUs; the kind is searched for a model with one group (remove "
            "space.instance_kind, or set each group's kind in its config)"
        )
    return tuple(dict.fromkeys(values))


# --------------------------------------------------------------------------------------------------
# The response cache as a knob


def response_cache_choices(
    setting: ResponseCacheSetting, base: mc.ModelConfig | None = None
) -> tuple[bool | None, ...]:
    """The values of :attr:`Knobs.response_cache` a search tries for ``space.response_cache``.

    ``None``: (None,) -- the model's own setting; ``off``: (False,); ``on``: (True,);
    ``search``: (False, True).

    Raises:
        InputError: ``on`` or ``search`` for a model Triton cannot cache (sequence batching or
            a decoupled model; the server would refuse every such trial).
    """
    if setting is None:
        return (None,)
    if setting not in ("off", "on", "search"):
        raise InputError(f"space.response_cache: unknown value {setting!r}; use off, on or search")
    if setting != "off" and base is not None:
        if base.HasField("sequence_batching"):
            reason = "uses the sequence batcher"
        elif base.model_transaction_policy.decoupled:
            reason = "is decoupled"
        else:
            reason = ""
        if reason:
            raise InputError(
                f"space.response_cache = {setting!r}: model '{base.name}' {reason}, and Triton "
                "allows the response cache only for other models; set space.response_cache = "
                "'off' or remove it"
            )
    return {"off": (False,), "on": (True,), "search": (False, True)}[setting]


def needs_server_cache(setting: ResponseCacheSetting, base: mc.ModelConfig | None) -> bool:
    """Whether a trial can enable the cache, so a managed server must be started with one."""
    if setting in ("on", "search"):
        return True
    return setting is None and base is not None and bool(base.response_cache.enable)


def cache_server_args(size_bytes: int) -> list[str]:
    """The reference server's (and ``tritonserver``'s) flag for a local cache of ``size_bytes``.

    Raises:
        InputError: a size below one byte.
    """
    if size_bytes < 1:
        raise InputError(
            f"response cache size {size_bytes} must be at least 1 byte "
            f"(default {DEFAULT_CACHE_SIZE_BYTES})"
        )
    return [f"--cache-config=local,size={size_bytes}"]


# --------------------------------------------------------------------------------------------------
# The oldest strategy's candidate sequences as a knob


def candidate_choices(
    values: Sequence[int] | None, base: mc.ModelConfig | None = None
) -> tuple[int | None, ...]:
    """The values of :attr:`Knobs.max_candidate_sequences` a search tries for
    ``space.max_candidate_sequences``: (None,) -- the model's own -- when unset, else the
    distinct values in increasing order.

    Raises:
        InputError: an empty list or a value below 1; values for a model without the sequence
            batcher's oldest strategy (``max_candidate_sequences`` is a field of that strategy).
    """
    if values is None:
        return (None,)
    chosen = tuple(sorted({int(v) for v in values}))
    if not chosen or chosen[0] < 1:
        raise InputError(
            f"space.max_candidate_sequences: need one or more values >= 1, got {list(values)}"
        )
    if base is not None and not base.sequence_batching.HasField("oldest"):
        raise InputError(
            f"space.max_candidate_sequences: model '{base.name}' does not use the sequence "
            "batcher's oldest strategy, which is where that field lives; remove "
            "space.max_candidate_sequences"
        )
    return chosen


# --------------------------------------------------------------------------------------------------
# Priority levels and queue policies as a knob


def queue_policy_choices(
    setting: QueuePolicySetting,
    levels: int,
    goal_ms: float,
    *,
    factors: Sequence[float] = TIMEOUT_GOAL_FACTORS,
    allow_timeout_override: bool = False,
    max_queue_size: int = 0,
    base: mc.ModelConfig | None = None,
) -> tuple[QueuePolicyKnob | None, ...]:
    """The values of :attr:`Knobs.queue_policy` a search tries for ``space.queue_policy``.

    ``None``: (None,) -- the model's own setting; ``off``: one FIFO queue without timeouts;
    ``search``: that FIFO, then ``levels`` priority levels where requests without a priority
    take the lowest level and only the lowest level has a policy of its own: none (priorities
    alone), then REJECT and then DELAY after ``factor * goal_ms`` for each factor. The levels
    above never time out, so the urgent classes wait only for each other; the low class gives
    way, and its timeout is what it may wait before it is refused (REJECT) or sent behind its
    class's fresher requests (DELAY).

    Args:
        setting: ``space.queue_policy``.
        levels: Priority levels of the traffic (its classes' highest ``priority``).
        goal_ms: The lowest level's p99 goal, milliseconds (its class's, else the run's).
        factors: Multiples of ``goal_ms`` tried as the lowest level's timeout.
        allow_timeout_override: Let a request's own ``timeout`` shorten the lowest level's
            (set it when the traffic sends timeouts; without it Triton ignores them).
        max_queue_size: Bound of the lowest level's queue in the timed policies (0: none).
        base: The model's config (refuses what Triton would refuse on every trial).

    Raises:
        InputError: an unknown setting; ``search`` with fewer than two levels, a goal that is
            not positive, or a model with ``preserve_ordering`` (Triton then allows one
            priority level and no DELAY).
    """
    if setting is None:
        return (None,)
    if setting not in ("off", "search"):
        raise InputError(f"space.queue_policy: unknown value {setting!r}; use off or search")
    if base is not None and base.HasField("sequence_batching"):
        raise InputError(
            f"space.queue_policy = {setting!r}: model '{base.name}' uses the sequence batcher, "
            "which has no priority levels or queue policies; remove space.queue_policy"
        )
    fifo = QueuePolicyKnob()
    if setting == "off":
        return (fifo,)
    if levels < 2:
        raise InputError(
            f"space.queue_policy = 'search' needs a priority mix of at least two levels "
            f"(traffic.classes with priorities 1 and 2); this traffic has {levels}: add "
            "classes or remove space.queue_policy"
        )
    if not goal_ms > 0:
        raise InputError(f"space.queue_policy = 'search' needs a positive p99 goal, got {goal_ms}")
    if base is not None and base.dynamic_batching.preserve_ordering:
        raise InputError(
            f"space.queue_policy = 'search': model '{base.name}' sets preserve_ordering, and "
            "Triton then allows one priority level and no DELAY; set space.queue_policy = "
            "'off' or remove it"
        )
    priorities = QueuePolicyKnob(priority_levels=levels, default_priority_level=levels)
    choices: list[QueuePolicyKnob | None] = [fifo, priorities]
    actions: tuple[TimeoutAction, ...] = ("REJECT", "DELAY")
    for action in actions:
        for factor in factors:
            low = LevelPolicy(
                timeout_us=max(1, round(goal_ms * factor * 1000)),
                timeout_action=action,
                max_queue_size=max_queue_size,
                allow_timeout_override=allow_timeout_override,
            )
            knob = QueuePolicyKnob(levels, levels, level_policies=((levels, low),))
            if knob not in choices:
                choices.append(knob)
    return tuple(choices)


class PriorityClass(Protocol):
    """What :func:`mix_queue_policy_choices` reads of a traffic class
    (``analyzer.config.sections.TrafficClass``)."""

    @property
    def priority(self) -> int:
        """Priority sent (1 = highest; 0: none, the default level)."""
        ...

    @property
    def timeout_us(self) -> int:
        """Request timeout sent, microseconds (0: none)."""
        ...

    @property
    def p99_ms(self) -> float:
        """The class's own p99 goal (0: the run's)."""
        ...


def mix_queue_policy_choices(
    setting: QueuePolicySetting,
    classes: Sequence[PriorityClass],
    goal_p99_ms: float,
    base: mc.ModelConfig | None = None,
) -> tuple[QueuePolicyKnob | None, ...]:
    """:func:`queue_policy_choices` for a priority mix (``traffic.classes``).

    The levels are the highest priority sent, one more when a class sends none (it takes the
    default level, the lowest: "priority 1 and the rest"); the low level's goal is the
    tightest goal of the classes on it (a class without its own: ``goal_p99_ms``); requests
    may shorten the low level's timeout when any class sends a timeout.
    """
    highest = max((c.priority for c in classes), default=0)
    levels = highest + 1 if highest and any(c.priority == 0 for c in classes) else highest
    low = [c for c in classes if c.priority in (0, levels)]
    goal = min((c.p99_ms or goal_p99_ms for c in low), default=goal_p99_ms)
    return queue_policy_choices(
        setting,
        levels,
        goal,
        allow_timeout_override=any(c.timeout_us for c in classes),
        base=base,
    )
