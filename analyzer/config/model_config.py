"""Knobs and the Triton model config: read the knobs a config holds, write knobs into one.

:func:`knobs_of` and :func:`apply_knobs` (the dynamic batcher, or ``sequence_batching.oldest``
for a stateful model; every instance group kept, each count set), and instance groups counted
as Triton counts them (:func:`instances_of`, :func:`devices_of`, :func:`group_devices`).
"""

from __future__ import annotations

from tritonclient.grpc import model_config_pb2 as mc

from analyzer.config.knobs import Knobs, QueuePolicyKnob


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
        ragged_batch=True if any(i.allow_ragged_batch for i in variable_inputs(config)) else None,
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
    if knobs.ragged_batch is not None:
        variable = variable_inputs(config)
        if not variable:
            raise ValueError(
                f"ragged_batch: model {base.name!r} has no input with a variable dimension"
            )
        for entry in variable:
            entry.allow_ragged_batch = knobs.ragged_batch
    return config


def variable_inputs(config: mc.ModelConfig) -> list[mc.ModelInput]:
    """The inputs with a variable dimension (``-1``): the ones ``allow_ragged_batch`` is about."""
    return [i for i in config.input if -1 in i.dims]
