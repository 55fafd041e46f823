"""Which values each optional knob is searched over, from the scenario and the base config.

The instance kind (:func:`kind_choices`), the response cache (:func:`response_cache_choices`,
with what a managed server needs for it), the oldest strategy's candidate sequences
(:func:`candidate_choices`), and priority levels with queue policies
(:func:`queue_policy_choices`, :func:`mix_queue_policy_choices`), and ragged batches
(:func:`ragged_batch_choices`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, Protocol

from tritonclient.grpc import model_config_pb2 as mc

from analyzer.config.knobs import (
    DEFAULT_CACHE_SIZE_BYTES,
    INSTANCE_KINDS,
    TIMEOUT_GOAL_FACTORS,
    LevelPolicy,
    QueuePolicyKnob,
    QueuePolicySetting,
    ResponseCacheSetting,
    TimeoutAction,
)
from analyzer.config.model_config import group_devices, variable_inputs
from analyzer.errors import InputError


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


def ragged_batch_choices(
    setting: Literal["off", "on", "search"] | None, base: mc.ModelConfig | None = None
) -> tuple[bool | None, ...]:
    """The values of :attr:`Knobs.ragged_batch` a search tries for ``space.ragged_batch``.

    ``None``: (None,) -- the model's own; ``off``: (False,); ``on``: (True,); ``search``:
    (False, True).

    Raises:
        InputError: a setting for a model without a variable-dimension input (every request
            has one shape: nothing to batch raggedly), or a sequence-batched model.
    """
    if setting is None:
        return (None,)
    if base is not None:
        if not variable_inputs(base):
            raise InputError(
                f"space.ragged_batch = {setting!r}: model '{base.name}' has no input with a "
                "variable dimension (-1), so its requests all have one shape; remove it"
            )
        if base.HasField("sequence_batching"):
            raise InputError(
                f"space.ragged_batch = {setting!r}: model '{base.name}' uses the sequence "
                "batcher; ragged batching is a dynamic-batching search here; remove it"
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
    (``analyzer.config.traffic.TrafficClass``)."""

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
