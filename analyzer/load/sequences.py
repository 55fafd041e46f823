"""Correlated request streams for a stateful model, as perf_analyzer sends them (pure).

A sequence-batched model (``sequence_batching``) keeps state per *sequence*: every request
names its sequence (``sequence_id``, the correlation id), the first says ``sequence_start``,
the last ``sequence_end``, and a sequence has at most one request in flight (its next request
depends on the state the previous one left). :class:`SequenceStreams` hands out those three
fields with perf_analyzer's semantics:

* ``--num-of-sequences`` (``sequences``): how many sequences are live at once; each keeps one
  slot here, and a slot whose sequence ended starts a new one with a fresh id;
* ``--sequence-length`` and ``--sequence-length-variation`` (``length``, ``variation_pct``):
  each new sequence draws its length uniformly from ``length * (1 +- variation_pct / 100)``
  (at least 1), as perf_analyzer's ``GetRandomSequenceLength`` does;
* ``--sequence-id-range`` (``first_id``, ``id_range``): ids count up from ``first_id`` and wrap
  within ``id_range`` (never onto an id that is still live).

:meth:`SequenceStreams.next` gives the next request of an idle sequence (the one idle longest,
so no sequence starves) or None when every sequence has a request in flight;
:meth:`SequenceStreams.done` takes the completion back. A request that failed ends its
sequence here (the server may hold a half-built state for it, or have refused its START): the
slot starts a new sequence, and the server frees the old one after its idle timeout.

No clock, no locks, no gevent: the caller (a Locust user, one greenlet at a time) owns the
object, and the seed makes every run's lengths and ids the same.
"""

from __future__ import annotations

import collections
import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "IDS_PER_STREAM",
    "SequenceStep",
    "SequenceStreams",
    "is_sequence_model",
    "sequence_length",
    "stream_first_id",
]

#: Correlation ids each :class:`SequenceStreams` of a load owns (``id_range``): a block per
#: stream, so no two streams of one load, in any process, ever send the same id.
IDS_PER_STREAM = 1 << 24
#: Streams one generator process may start (blocks of ids per process), across all its levels.
STREAMS_PER_PROCESS = 1 << 20


def is_sequence_model(config: Mapping[str, Any]) -> bool:
    """Whether a model config (Triton's JSON, HTTP or gRPC ``as_json``) sets
    ``sequence_batching``: every request must then name its sequence."""
    return bool(config.get("sequence_batching"))


def stream_first_id(process_index: int, stream_index: int) -> int:
    """The first correlation id of stream ``stream_index`` (counted per process from 0, never
    reset between levels) of generator process ``process_index``: distinct blocks of
    :data:`IDS_PER_STREAM` ids, so a stream never reuses an id an earlier level's stream may
    still hold on the server (a sequence cut off by the end of a level lives there until the
    model's idle timeout)."""
    if not 0 <= stream_index < STREAMS_PER_PROCESS:
        raise ValueError(f"stream index {stream_index} outside [0, {STREAMS_PER_PROCESS})")
    return 1 + (process_index * STREAMS_PER_PROCESS + stream_index) * IDS_PER_STREAM


def sequence_length(rng: random.Random, length: int, variation_pct: float) -> int:
    """One sequence's length: uniform in ``length * (1 +- variation_pct / 100)``, at least 1.

    The offset is truncated toward zero, as perf_analyzer's integer conversion does.
    """
    offset = int((2.0 * rng.random() - 1.0) * (variation_pct / 100.0) * length)
    return max(1, length + offset)


@dataclass(frozen=True)
class SequenceStep:
    """One request of a sequence: what it must send, and where it came from.

    Attributes:
        correlation_id: ``sequence_id`` (uint64, never 0: 0 means "no sequence" to Triton).
        start: ``sequence_start``: the first request of the sequence.
        end: ``sequence_end``: the last request of the sequence.
        slot: Which of the live sequences it belongs to (0..sequences-1).
        index: Its position in the sequence (0 = the start).
    """

    correlation_id: int
    start: bool
    end: bool
    slot: int
    index: int

    def parameters(self) -> dict[str, Any]:
        """The request's ``parameters`` (KServe JSON body) and ``tritonclient`` ``infer``
        keyword arguments of the same names."""
        return {
            "sequence_id": self.correlation_id,
            "sequence_start": self.start,
            "sequence_end": self.end,
        }


@dataclass
class _Live:
    """A slot's current sequence."""

    correlation_id: int
    length: int
    sent: int = 0
    in_flight: bool = False


class SequenceStreams:
    """``sequences`` live sequences of random length; one request in flight per sequence.

    Args:
        length: Mean sequence length, requests (``--sequence-length``, default 20).
        variation_pct: Length variation, percent (``--sequence-length-variation``, default 20).
        sequences: Live sequences at once (``--num-of-sequences``, default 4).
        seed: Seed of the lengths.
        first_id: First correlation id (``--sequence-id-range`` start, default 1).
        id_range: How many ids to cycle through (None: never wrap); at least ``sequences``.

    Raises:
        ValueError: a length, a sequence count or a first id below 1, a negative variation, or
            an id range too small to keep every live sequence's id distinct.
    """

    def __init__(
        self,
        length: int = 20,
        variation_pct: float = 20.0,
        sequences: int = 4,
        seed: int = 0,
        *,
        first_id: int = 1,
        id_range: int | None = None,
    ) -> None:
        if length < 1 or sequences < 1 or first_id < 1:
            raise ValueError(
                f"length {length}, sequences {sequences} and first_id {first_id} must be >= 1"
            )
        if variation_pct < 0:
            raise ValueError(f"variation_pct {variation_pct} must be >= 0")
        if id_range is not None and id_range < sequences:
            raise ValueError(
                f"id_range {id_range} holds fewer ids than the {sequences} live sequences"
            )
        self.length = length
        self.variation_pct = variation_pct
        self.sequences = sequences
        self.first_id = first_id
        self.id_range = id_range
        self._rng = random.Random(seed)
        self._counter = 0
        self._slots: list[_Live | None] = [None] * sequences
        self._idle: collections.deque[int] = collections.deque(range(sequences))
        #: Sequences started and finished (ended or abandoned after a failure).
        self.started = 0
        self.finished = 0

    # -- state ------------------------------------------------------------------------------------

    @property
    def in_flight(self) -> int:
        """Sequences with a request in flight."""
        return self.sequences - len(self._idle)

    def live_ids(self) -> list[int]:
        """Correlation ids of the sequences started and not yet ended, by slot."""
        return [s.correlation_id for s in self._slots if s is not None]

    # -- hand out and take back -------------------------------------------------------------------

    def next(self) -> SequenceStep | None:
        """The next request of the sequence idle longest (None: all have one in flight)."""
        if not self._idle:
            return None
        slot = self._idle.popleft()
        live = self._slots[slot]
        if live is None:
            live = _Live(
                self._new_id(), sequence_length(self._rng, self.length, self.variation_pct)
            )
            self._slots[slot] = live
            self.started += 1
        index = live.sent
        live.sent += 1
        live.in_flight = True
        return SequenceStep(
            correlation_id=live.correlation_id,
            start=index == 0,
            end=live.sent == live.length,
            slot=slot,
            index=index,
        )

    def done(self, step: SequenceStep, ok: bool = True) -> None:
        """Take back the completion of ``step``; its sequence may send again.

        A failed request (``ok`` False) or the last one ends the sequence: the slot's next
        request starts a new one.

        Raises:
            ValueError: ``step`` is not the request in flight of its slot.
        """
        live = self._slots[step.slot] if 0 <= step.slot < self.sequences else None
        if (
            live is None
            or not live.in_flight
            or live.correlation_id != step.correlation_id
            or live.sent != step.index + 1
        ):
            raise ValueError(f"{step} is not the request in flight of slot {step.slot}")
        live.in_flight = False
        if step.end or not ok:
            self._slots[step.slot] = None
            self.finished += 1
        self._idle.append(step.slot)

    def closing(self) -> list[SequenceStep]:
        """END requests for every live sequence with no request in flight (a load level's end:
        the server frees their slots now, not after its idle timeout); each is in flight until
        handed to :meth:`done`, as any step."""
        steps = []
        for slot, live in enumerate(self._slots):
            if live is None or live.in_flight:
                continue
            self._idle.remove(slot)
            index = live.sent
            live.sent += 1
            live.length = live.sent
            live.in_flight = True
            steps.append(SequenceStep(live.correlation_id, index == 0, True, slot, index))
        return steps

    def _new_id(self) -> int:
        live = set(self.live_ids())
        while True:
            offset = self._counter if self.id_range is None else self._counter % self.id_range
            self._counter += 1
            candidate = self.first_id + offset
            if candidate not in live:
                return candidate
