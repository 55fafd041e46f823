"""One trial's knobs and the config they make.

Nothing here imports optuna or gevent, so the dashboard and the report can use the knobs
cheaply. ``analyzer.search`` encodes :class:`Knobs` for the sampler; ``analyzer.sweep``
measures trials with :class:`analyzer.evaluation.Evaluator` and records each as an
:class:`analyzer.records.TrialRecord` (the one trial record type; its typed measurement answers
what the trial's numbers rest on).

The response cache is a knob too (``response_cache { enable }``), searched only when the
scenario asks for it (:func:`response_cache_choices`). A trial whose cache answers repeated
payloads is faster without the model being faster, so every figure measured with hits carries
its hit ratio (``analyzer.server_stats.cache_hit_ratio``); a managed server needs a cache of its
own for the knob to mean anything (:func:`cache_server_args`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from tritonclient.grpc import model_config_pb2 as mc

from analyzer.errors import InputError

#: ``space.response_cache``: None leaves the model's own setting; ``search`` tries both.
ResponseCacheSetting = Literal["off", "on", "search"] | None

#: Cache of a managed reference server when the scenario names no size: 64 MiB.
DEFAULT_CACHE_SIZE_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True)
class Knobs:
    """The searched part of a model config.

    Attributes:
        max_batch_size: Largest batch the scheduler forms (``max_batch_size``).
        max_queue_delay_us: How long a request may wait for a batch to fill, microseconds.
        preferred_batch_size: Batch sizes the scheduler dispatches as soon as it can form them.
        instance_count: Model instances (``instance_group[0].count``).
        dynamic_batching: False only for a baseline config without a dynamic batcher.
        response_cache: ``response_cache { enable }``; None keeps the base config's setting
            (what every trial did before the cache was a knob).
    """

    max_batch_size: int
    max_queue_delay_us: int = 0
    preferred_batch_size: tuple[int, ...] = ()
    instance_count: int = 1
    dynamic_batching: bool = True
    response_cache: bool | None = None

    def to_dict(self) -> dict[str, Any]:
        """The ``config`` object of every result file (see docs/internals.md)."""
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
        )

    def label(self) -> str:
        """Short human label: ``mbs=16 delay=500us pref=[16,8] x2`` (`` cache`` / `` no cache``
        after it when the knobs set the response cache)."""
        cache = {None: "", True: " cache", False: " no cache"}[self.response_cache]
        if not self.dynamic_batching:
            return f"mbs={self.max_batch_size} no dynamic batching x{self.instance_count}{cache}"
        pref = ",".join(str(s) for s in self.preferred_batch_size) or "-"
        return (
            f"mbs={self.max_batch_size} delay={self.max_queue_delay_us}us "
            f"pref=[{pref}] x{self.instance_count}{cache}"
        )


# --------------------------------------------------------------------------------------------------
# Configs


def knobs_of(config: mc.ModelConfig) -> Knobs:
    """The knobs a ModelConfig sets (the baseline's knobs).

    A preferred list of exactly ``[max_batch_size]`` reads as none: it is how Triton normalises
    ``dynamic_batching {}``, and it batches the same way. A config that enables the response
    cache reads as ``response_cache=True`` (one that does not: None, the default).
    """
    batching = config.HasField("dynamic_batching")
    batcher = config.dynamic_batching
    preferred = tuple(batcher.preferred_batch_size) if batching else ()
    if preferred == (config.max_batch_size,):
        preferred = ()
    return Knobs(
        max_batch_size=max(config.max_batch_size, 1),
        max_queue_delay_us=int(batcher.max_queue_delay_microseconds) if batching else 0,
        preferred_batch_size=preferred,
        instance_count=sum(g.count or 1 for g in config.instance_group) or 1,
        dynamic_batching=batching,
        response_cache=True if config.response_cache.enable else None,
    )


def apply_knobs(base: mc.ModelConfig, knobs: Knobs) -> mc.ModelConfig:
    """``base`` with the knobs set; everything else (inputs, backend, parameters) kept.

    The instance count goes on the first instance group (one is created, of the base kind, when
    the base has none); other groups are dropped because the count is a total. The response
    cache is set only when the knobs say so (False clears the section).
    """
    config = mc.ModelConfig()
    config.CopyFrom(base)
    config.max_batch_size = knobs.max_batch_size
    if knobs.dynamic_batching:
        config.dynamic_batching.max_queue_delay_microseconds = knobs.max_queue_delay_us
        del config.dynamic_batching.preferred_batch_size[:]
        config.dynamic_batching.preferred_batch_size.extend(knobs.preferred_batch_size)
    else:
        config.ClearField("dynamic_batching")
    first = mc.ModelInstanceGroup()
    if base.instance_group:
        first.CopyFrom(base.instance_group[0])
    else:
        first.kind = mc.ModelInstanceGroup.KIND_AUTO
    first.count = knobs.instance_count
    del config.instance_group[:]
    config.instance_group.append(first)
    if knobs.response_cache is True:
        config.response_cache.enable = True
    elif knobs.response_cache is False:
        config.ClearField("response_cache")
    return config


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
