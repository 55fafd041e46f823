"""One trial's knobs and the config they make.

This module holds the knobs (:class:`Knobs`, :class:`QueuePolicyKnob`, :class:`LevelPolicy`);
reading and writing them in a model config is :mod:`analyzer.config.model_config`, which values
each optional knob is searched over is :mod:`analyzer.config.choices`.

Nothing here imports optuna or gevent, so the dashboard and the report can use the knobs
cheaply. ``analyzer.search.study`` encodes :class:`Knobs` for the sampler; ``analyzer.sweep.loop``
measures trials with :class:`analyzer.evaluation.Evaluator` and records each as an
:class:`analyzer.rundir.trial_record.TrialRecord` (the one trial record type; its typed measurement
answers what the trial's numbers rest on).

The instance kind (``KIND_CPU`` vs ``KIND_GPU``) is a knob when ``space.instance_kind`` lists
both (:func:`kind_choices`). The response cache is a knob too (``response_cache { enable }``), searched only when the
scenario asks for it (:func:`response_cache_choices`). A trial whose cache answers repeated
payloads is faster without the model being faster, so every figure measured with hits carries
its hit ratio (``analyzer.target.server_stats.cache_hit_ratio``); a managed server needs a cache of
its own for the knob to mean anything (:func:`cache_server_args`).

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

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from tritonclient.grpc import model_config_pb2 as mc

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
        ragged_batch: ``allow_ragged_batch`` of every input with a variable dimension: True lets
            requests of different shapes share a batch (the backend must accept ragged batches),
            False batches equal shapes only; None keeps the base config's.
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
    ragged_batch: bool | None = None

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
        if self.ragged_batch is not None:
            out["ragged_batch"] = self.ragged_batch
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
            ragged_batch=None if data.get("ragged_batch") is None else bool(data["ragged_batch"]),
        )

    def label(self) -> str:
        """Short human label: ``mbs=16 delay=500us pref=[16,8] x2`` (`` cache`` / `` no cache``
        after it when the knobs set the response cache, then the queue policy's
        :meth:`QueuePolicyKnob.label` when they set one: `` prio=2/2 p2=reject@25000us``, then
        `` cand=4`` when they set ``max_candidate_sequences``); with :attr:`group_counts`, the
        total is followed by each group's count: ``x5 groups=[2,1]``; a set instance kind follows
        the count: ``x2 gpu`` / ``x2 cpu``."""
        cache = {None: "", True: " cache", False: " no cache"}[self.response_cache]
        cache += {None: "", True: " ragged", False: " equal shapes"}[self.ragged_batch]
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


# ---- a generative engine's knobs ------------------------------------------------------------

#: The engines whose batching perfsweep tunes, and where each keeps its settings: ``vllm``
#: (vLLM, Triton's vLLM backend and the reference engine: ``<model>/1/model.json``, or the
#: ``vllm serve`` command line), ``tensorrtllm`` (Triton's TensorRT-LLM backend: parameters of
#: ``config.pbtxt``), ``sglang`` (the ``sglang.launch_server`` command line).
ENGINES = ("vllm", "tensorrtllm", "sglang")

#: Each engine's name for each knob (None: the engine has no such setting). The knobs carry
#: vLLM's names; a command template's placeholders may use either the vLLM name or the
#: engine's own (``{max_running_requests}`` for SGLang).
ENGINE_NAMES: dict[str, dict[str, str | None]] = {
    "vllm": {
        "max_num_seqs": "max_num_seqs",
        "max_num_batched_tokens": "max_num_batched_tokens",
        "enable_chunked_prefill": "enable_chunked_prefill",
        "gpu_memory_utilization": "gpu_memory_utilization",
    },
    "tensorrtllm": {
        "max_num_seqs": "max_batch_size",
        "max_num_batched_tokens": "max_num_tokens",
        "enable_chunked_prefill": "enable_chunked_context",
        "gpu_memory_utilization": "kv_cache_free_gpu_mem_fraction",
    },
    "sglang": {
        "max_num_seqs": "max_running_requests",
        "max_num_batched_tokens": "max_prefill_tokens",
        # SGLang's chunked prefill is a size, not a switch: on = the step's token budget,
        # off = -1 (its value for "no chunking").
        "enable_chunked_prefill": "chunked_prefill_size",
        "gpu_memory_utilization": "mem_fraction_static",
    },
}

#: TensorRT-LLM's scheduler policies (``batch_scheduler_policy``).
TRTLLM_POLICIES = ("max_utilization", "guaranteed_no_evict")


@dataclass(frozen=True)
class EngineKnobs:
    """The searched settings of a generative engine that batches per iteration (vLLM's names).

    One trial's config, whatever the engine: :func:`engine_settings` writes it in an engine's
    own names (``model.json`` for vLLM, ``config.pbtxt`` parameters for TensorRT-LLM, command
    flags for SGLang).

    Attributes:
        max_num_seqs: Most sequences running at once (TensorRT-LLM's runtime
            ``max_batch_size``, SGLang's ``--max-running-requests``).
        max_num_batched_tokens: Most tokens one step carries, prompt chunks and decodes
            together (TensorRT-LLM's ``max_num_tokens``, SGLang's ``--max-prefill-tokens``).
        enable_chunked_prefill: A long prompt is prefilled over several steps (TensorRT-LLM's
            ``enable_chunked_context``; SGLang's ``--chunked-prefill-size``, -1 when off).
        gpu_memory_utilization: The device memory share of the engine, whose remainder after
            the weights is the KV cache (TensorRT-LLM's ``kv_cache_free_gpu_mem_fraction``,
            SGLang's ``--mem-fraction-static``); None keeps the engine's own.
        instance_count: Engines the server runs (a Triton model's instance count, or several
            engine processes behind one server); 1 for a server started from a command.
        batch_scheduler_policy: TensorRT-LLM's ``batch_scheduler_policy``; None keeps the
            model's own (vLLM and SGLang have no such setting).
    """

    max_num_seqs: int
    max_num_batched_tokens: int
    enable_chunked_prefill: bool = True
    gpu_memory_utilization: float | None = None
    instance_count: int = 1
    batch_scheduler_policy: str | None = None

    def __post_init__(self) -> None:
        if self.max_num_seqs < 1 or self.max_num_batched_tokens < 1 or self.instance_count < 1:
            raise ValueError(
                f"max_num_seqs {self.max_num_seqs}, max_num_batched_tokens "
                f"{self.max_num_batched_tokens} and instance_count {self.instance_count} "
                "must be >= 1"
            )
        if self.gpu_memory_utilization is not None and not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError(
                f"gpu_memory_utilization {self.gpu_memory_utilization} must be in (0, 1]"
            )
        if self.batch_scheduler_policy not in (None, *TRTLLM_POLICIES):
            raise ValueError(
                f"batch_scheduler_policy {self.batch_scheduler_policy!r}: use one of "
                f"{', '.join(TRTLLM_POLICIES)}"
            )

    # What the records and the report ask of any trial's knobs (as of Knobs).
    @property
    def dynamic_batching(self) -> bool:
        """An engine batches per iteration, never through Triton's dynamic batcher."""
        return False

    @property
    def max_batch_size(self) -> int:
        """The most requests in one batch: the running set."""
        return self.max_num_seqs

    def to_dict(self) -> dict[str, Any]:
        """The ``config`` object of every result file (vLLM's names; ``engine: true`` marks it)."""
        out: dict[str, Any] = {
            "engine": True,
            "max_num_seqs": self.max_num_seqs,
            "max_num_batched_tokens": self.max_num_batched_tokens,
            "enable_chunked_prefill": self.enable_chunked_prefill,
            "instance_count": self.instance_count,
        }
        if self.gpu_memory_utilization is not None:
            out["gpu_memory_utilization"] = self.gpu_memory_utilization
        if self.batch_scheduler_policy is not None:
            out["batch_scheduler_policy"] = self.batch_scheduler_policy
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> EngineKnobs:
        """Inverse of :meth:`to_dict`."""
        memory = data.get("gpu_memory_utilization")
        return cls(
            max_num_seqs=int(data["max_num_seqs"]),
            max_num_batched_tokens=int(data["max_num_batched_tokens"]),
            enable_chunked_prefill=bool(data.get("enable_chunked_prefill", True)),
            gpu_memory_utilization=None if memory is None else float(memory),
            instance_count=int(data.get("instance_count", 1)),
            batch_scheduler_policy=data.get("batch_scheduler_policy"),
        )

    def label(self) -> str:
        """``seqs=8 tokens=2048 chunked mem=0.9 x1`` (``mem`` only when set; ``whole`` for
        chunked prefill off)."""
        parts = [
            f"seqs={self.max_num_seqs}",
            f"tokens={self.max_num_batched_tokens}",
            "chunked" if self.enable_chunked_prefill else "whole",
        ]
        if self.gpu_memory_utilization is not None:
            parts.append(f"mem={self.gpu_memory_utilization:g}")
        if self.batch_scheduler_policy is not None:
            parts.append(self.batch_scheduler_policy)
        parts.append(f"x{self.instance_count}")
        return " ".join(parts)


def engine_settings(knobs: EngineKnobs, engine: str = "vllm") -> dict[str, Any]:
    """The knobs in ``engine``'s own names and units (:data:`ENGINE_NAMES`), the engine's
    own values kept where a knob is None.

    vLLM: ``model.json`` keys; TensorRT-LLM: ``config.pbtxt`` parameters (strings, as the
    backend reads them); SGLang: its flags without dashes (``max_running_requests``).

    Raises:
        ValueError: an engine not in :data:`ENGINES`.
    """
    if engine not in ENGINES:
        raise ValueError(f"engine {engine!r}: use one of {', '.join(ENGINES)}")
    names = ENGINE_NAMES[engine]
    values: dict[str, Any] = {
        "max_num_seqs": knobs.max_num_seqs,
        "max_num_batched_tokens": knobs.max_num_batched_tokens,
        "enable_chunked_prefill": knobs.enable_chunked_prefill,
        "gpu_memory_utilization": knobs.gpu_memory_utilization,
    }
    if engine == "sglang":
        values["enable_chunked_prefill"] = (
            knobs.max_num_batched_tokens if knobs.enable_chunked_prefill else -1
        )
    out: dict[str, Any] = {}
    for knob, v in values.items():
        own = names[knob]
        if v is not None and own is not None:
            out[own] = v
    if engine == "tensorrtllm":
        if knobs.batch_scheduler_policy is not None:
            out["batch_scheduler_policy"] = knobs.batch_scheduler_policy
        out = {k: str(v).lower() if isinstance(v, bool) else str(v) for k, v in out.items()}
    return out


def command_values(knobs: EngineKnobs, engine: str = "vllm") -> dict[str, str]:
    """Placeholder values for a server's command template: every knob under its vLLM name and
    under ``engine``'s own (:func:`engine_settings`), booleans as ``true``/``false``."""
    own = engine_settings(knobs, engine)
    vllm = engine_settings(knobs, "vllm")
    vllm["instance_count"] = knobs.instance_count
    return {
        k: str(v).lower() if isinstance(v, bool) else str(v) for k, v in {**vllm, **own}.items()
    }
