"""Traffic classes of a priority mix: what each class sends, and the seeded draw of a request's class.

Pure (no locust or gevent import; the clients a :class:`RoutedClient` routes to are made elsewhere). A scenario's ``[[traffic.classes]]`` become
:class:`RequestClass` values on ``EngineOptions.classes``; every generator process draws each
request's class with its own :class:`ClassDraw` (seeded per process, so two processes do not
draw in lock-step) and sends the class's ``priority`` and ``timeout`` request parameters exactly
as tritonclient does: only when set (priority 0 and no timeout send nothing, so the model's
``default_priority_level`` and queue policy decide).

No classes is one implicit class (index 0) that sends neither parameter: today's traffic.
A class may name the model its requests go to (:attr:`RequestClass.model`): classes of several
models are a mix of models (:func:`mix_models`), each request sent to its class's model.
"""

from __future__ import annotations

import bisect
import random
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from itertools import accumulate
from typing import TYPE_CHECKING, Any

from analyzer.errors import InputError

if TYPE_CHECKING:
    from analyzer.config.traffic import TrafficSection
    from analyzer.load.prepared import InferClient
    from analyzer.load.sequences import SequenceStep


@dataclass(frozen=True)
class RequestClass:
    """One class of the offered load and the request parameters its requests carry."""

    name: str
    #: Share of the requests drawn into this class (the shares of a mix sum to 1).
    share: float = 1.0
    #: ``priority`` request parameter (1 = highest); 0 sends none: the model's default level.
    priority: int = 0
    #: ``timeout`` request parameter, microseconds; 0 sends none: the queue policy's default.
    timeout_us: int = 0
    #: The model the class's requests go to; "": the load's model (a mix names several).
    model: str = ""
    #: A rate of its own, req/s (``share`` is then 0 until :func:`level_classes` sets it).
    rate_rps: float = 0.0

    def infer_kwargs(self) -> dict[str, int]:
        """``priority=``/``timeout=`` for tritonclient's ``infer`` and ``generate_request_body``
        (absent when unset, as tritonclient leaves them out of the request)."""
        out: dict[str, int] = {}
        if self.priority:
            out["priority"] = self.priority
        if self.timeout_us:
            out["timeout"] = self.timeout_us
        return out

    def to_dict(self) -> dict[str, Any]:
        """Plain dict (it crosses processes inside ``EngineConfig``)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RequestClass:
        """Inverse of ``to_dict``."""
        return cls(**data)


def request_classes(traffic: TrafficSection) -> tuple[RequestClass, ...]:
    """The generator's classes of a scenario's ``[traffic]`` (empty without a mix)."""
    return tuple(
        RequestClass(c.name, c.share, c.priority, c.timeout_us, c.model, c.rate_rps)
        for c in traffic.classes
    )


def level_classes(classes: Sequence[RequestClass], rate_rps: float) -> tuple[RequestClass, ...]:
    """The classes of one open-loop level at ``rate_rps`` (the whole load's), each ``share`` its
    part of the level's requests: a class with a rate of its own keeps that rate, the classes
    with shares divide what is left. Unchanged when no class has a rate of its own.

    Raises:
        InputError: the level's rate does not exceed the fixed rates.
    """
    fixed = sum(c.rate_rps for c in classes)
    if not fixed:
        return tuple(classes)
    rest = rate_rps - fixed
    if rest <= 0:
        raise InputError(
            f"a level of {rate_rps:g} req/s leaves nothing for the classes with shares: the "
            f"classes' own rates take {fixed:g} (a level's rate is the whole load's)"
        )
    return tuple(
        replace(c, share=(c.rate_rps if c.rate_rps else c.share * rest) / rate_rps) for c in classes
    )


def mix_models(classes: Sequence[RequestClass], model: str) -> tuple[str, ...]:
    """The models the classes send to, ``model`` (the load's) first, each once; ``(model,)``
    without a mix of models."""
    names = [model, *(c.model or model for c in classes)]
    return tuple(dict.fromkeys(names))


def class_models(classes: Sequence[RequestClass], model: str) -> tuple[str, ...]:
    """The model of each class, by class index (``(model,)`` without classes)."""
    return tuple(c.model or model for c in classes) or (model,)


class ClassDraw:
    """Draws each request's class index by share; always 0 without classes (greenlet-safe: no
    yields). ``seed`` should differ per generator process."""

    def __init__(self, classes: Sequence[RequestClass], seed: int) -> None:
        self._bounds = list(accumulate(c.share for c in classes))
        self._rng = random.Random(seed)

    def __call__(self) -> int:
        """The next request's class index."""
        bounds = self._bounds
        if len(bounds) < 2:
            return 0
        index = bisect.bisect_right(bounds, self._rng.random() * bounds[-1])
        return min(index, len(bounds) - 1)


class RoutedClient:
    """A mix of models' client: each request goes to its traffic class's model, through that
    model's own client (its requests built from its own inputs)."""

    def __init__(self, by_class: Sequence[InferClient], clients: Sequence[InferClient]) -> None:
        self._by_class = tuple(by_class)
        self._clients = tuple(clients)

    def infer(
        self, payload_index: int, klass: int = 0, sequence: SequenceStep | None = None
    ) -> None:
        self._by_class[klass].infer(payload_index, klass, sequence)

    def close(self) -> None:
        for client in self._clients:
            client.close()
