"""The sequence batcher's pure parts, without threads: slots, backlog, batch formation, controls.

The oldest strategy's batches come from three pure pieces run by a small clock-driven loop
here (:func:`_run_oldest`): :class:`SequenceRouter` binds sequences to slots,
:class:`OldestSlots` decides which request each slot issues, and ``decide`` forms the dynamic
batcher's batches. The planted stream is the one the differential test sends to the real
Triton (``tests/differential/test_sequence_vs_triton.py``), with the batches Triton formed.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
from tritonclient.grpc import model_config_pb2 as mc

from reference_server.batching.decide import BatchingParams, Candidate, OpenBatch, decide
from reference_server.batching.sequence import (
    Controls,
    OldestSlots,
    SequenceInfo,
    SequenceParams,
    SequenceRouter,
    SlotRef,
    UnknownSequence,
    direct_step,
)
from reference_server.core.config import normalize, validate
from reference_server.core.errors import ModelConfigError
from reference_server.zoo.accumulator import accumulator_config

MS = 1_000_000


@dataclass(frozen=True)
class Req:
    """A request of the planted stream: its index and sequence fields."""

    index: int
    info: SequenceInfo


def _req(index: int, cid: int, *, start: bool = False, end: bool = False) -> Req:
    return Req(index, SequenceInfo(cid, start, end))


def _is_end(req: Req) -> bool:
    return req.info.end


def _run_oldest(
    stream: list[tuple[int, Req]], *, candidates: int, params: BatchingParams, exec_ns: int
) -> list[tuple[int, ...]]:
    """Batches (request indices, in execution order) of one instance under ``oldest``.

    ``stream`` gives each request's arrival time. One instance executes one batch at a time
    for ``exec_ns``; the dynamic batcher starts a batch when ``decide`` seals it.
    """
    router: SequenceRouter[Req] = SequenceRouter([SlotRef(s, 0) for s in range(candidates)], 10**12)
    slots: OldestSlots[Req] = OldestSlots(candidates)
    issued: list[tuple[Req, int]] = []  # the dynamic batcher's queue with issue times
    where: dict[int, SlotRef] = {}
    batches: list[tuple[int, ...]] = []
    running: tuple[list[Req], int] | None = None  # batch and its end time
    arrivals = sorted(stream, key=lambda a: a[0])
    now = 0

    def advance(slot: SlotRef) -> None:
        def release() -> list[Req] | None:
            handed = router.release(slot)
            return None if handed is None else handed[1]

        item = slots.advance(slot.seq_slot, _is_end, release)
        if item is not None:
            where[item.index] = slot
            issued.append((item, now))

    while arrivals or issued or running or slots.queued():
        events = [t for t, _ in arrivals[:1]] + ([running[1]] if running else [])
        wake = None
        if running is None and issued:
            # An idle instance starts the batch as soon as a step puts requests into it.
            members: list[Req] = []
            while issued:
                queue = [Candidate(1, t) for _, t in issued]
                decision = decide(queue, OpenBatch(len(members)), params, now)
                members += [r for r, _ in issued[: decision.take]]
                del issued[: decision.take]
                wake = decision.wake_at_ns
                if decision.seal or not decision.take:
                    break
            if members:
                running = (members, now + exec_ns)
                batches.append(tuple(sorted(r.index for r in members)))
                continue
        if wake is not None:
            events.append(wake)
        assert events, "stuck"
        now = max(now, min(events))
        if running is not None and running[1] <= now:
            done, _ = running
            running = None
            for req in done:  # release callbacks, in batch order
                advance(where.pop(req.index))
        while arrivals and arrivals[0][0] <= now:
            _, req = arrivals.pop(0)
            slot = router.route(req.info, req, now // 1000)
            if slot is not None and slots.push(slot.seq_slot, req):
                advance(slot)
    return batches


#: The differential test's stream: A, B, C start; D waits for a slot (3 candidates).
PLANTED = [
    _req(0, 1, start=True),
    _req(1, 2, start=True),
    _req(2, 3, start=True),
    _req(3, 4, start=True),
    _req(4, 1),
    _req(5, 2, end=True),
    _req(6, 4, end=True),
    _req(7, 3),
    _req(8, 1, end=True),
    _req(9, 3, end=True),
]


def test_oldest_forms_the_batches_triton_formed() -> None:
    params = BatchingParams(4, frozenset({3}), 1000 * MS)
    stream = [(i * MS, r) for i, r in enumerate(PLANTED)]  # all queued during the first batch
    batches = _run_oldest(stream, candidates=3, params=params, exec_ns=1500 * MS)
    assert batches == [(0, 1, 2), (4, 5, 7), (3, 8, 9), (6,)]


def test_oldest_issues_one_request_per_sequence_at_a_time() -> None:
    # One sequence of four requests: however many wait, each batch holds one of them.
    stream = [(0, _req(0, 9, start=True))] + [(MS, _req(i, 9, end=i == 3)) for i in (1, 2, 3)]
    params = BatchingParams(4, frozenset({4}), 0)
    batches = _run_oldest(stream, candidates=4, params=params, exec_ns=10 * MS)
    assert batches == [(0,), (1,), (2,), (3,)]


def test_oldest_candidates_bound_the_batch() -> None:
    # Six single-request sequences, two candidate slots: never more than two per batch,
    # although max_batch_size is 8 and the delay lets the queue fill. An END request frees its
    # slot when it is issued, so 1 takes slot 0 behind 0 (still running) and 2 gets slot 1.
    stream = [(0, _req(i, 100 + i, start=True, end=True)) for i in range(6)]
    params = BatchingParams(8, frozenset({8}), 5 * MS)
    batches = _run_oldest(stream, candidates=2, params=params, exec_ns=MS)
    assert batches == [(0, 2), (1, 3), (4, 5)]


# ------------------------------------------------------------------------------ the router


def test_router_binds_lowest_free_slot_then_backlogs() -> None:
    router: SequenceRouter[str] = SequenceRouter([SlotRef(1, 0), SlotRef(0, 0)], 1000)
    assert router.route(SequenceInfo(7, start=True), "a", 0) == SlotRef(0, 0)
    assert router.route(SequenceInfo(8, start=True), "b", 0) == SlotRef(1, 0)
    assert router.route(SequenceInfo(9, start=True), "c", 0) is None  # backlog
    assert router.route(SequenceInfo(9), "c2", 0) is None  # joins its backlog
    assert router.route(SequenceInfo(7), "a2", 0) == SlotRef(0, 0)  # bound: same slot
    assert router.backlog_size() == 2
    # The slot of a released sequence goes to the oldest backlog, with all its requests.
    assert router.release(SlotRef(0, 0)) == (9, ["c", "c2"])
    assert router.route(SequenceInfo(9, end=True), "c3", 0) == SlotRef(0, 0)
    assert router.release(SlotRef(0, 0)) is None  # nothing waits: the slot is free
    assert router.route(SequenceInfo(10, start=True), "d", 0) == SlotRef(0, 0)


def test_router_refuses_unknown_sequence_without_start() -> None:
    router: SequenceRouter[str] = SequenceRouter([SlotRef(0, 0)], 1000)
    with pytest.raises(UnknownSequence):
        router.route(SequenceInfo(5), "x", 0)
    router.route(SequenceInfo(5, start=True, end=True), "y", 0)
    with pytest.raises(UnknownSequence):  # ended with its END
        router.route(SequenceInfo(5), "z", 0)


def test_router_reaps_idle_sequences_only() -> None:
    router: SequenceRouter[str] = SequenceRouter([SlotRef(0, 0)], 1000)
    router.route(SequenceInfo(1, start=True), "a", 0)
    router.route(SequenceInfo(2, start=True), "b", 500)  # backlog
    ended, next_us = router.reap(900)
    assert ended == [] and next_us == 1000
    ended, next_us = router.reap(1000)
    # 1 held a slot: force-ended; 2 waits in the backlog and is looked at again.
    assert ended == [(1, SlotRef(0, 0))]
    assert next_us == 1500
    assert not router.known(1) and router.known(2)


# ------------------------------------------------------------------------------ direct strategy


def test_direct_batch_pads_empty_slots_with_null_requests() -> None:
    step = direct_step(
        [None, 5, None, 7], 10, max_batch_size=4, max_queue_delay_ns=0, minimum_slot_utilization=0
    )
    assert step.slots == (0, 1, 2, 3)
    assert step.null_slots == (0, 2)


def test_direct_waits_for_utilization_until_the_delay() -> None:
    kw = {"max_batch_size": 4, "max_queue_delay_ns": 100, "minimum_slot_utilization": 0.5}
    step = direct_step([20, None, None, None], 50, **kw)  # type: ignore[arg-type]
    assert step.slots == () and step.wait_ns == 70
    assert direct_step([20, None, None, None], 121, **kw).slots == (0,)  # type: ignore[arg-type]
    assert direct_step([20, 40, None, None], 50, **kw).slots == (0, 1)  # type: ignore[arg-type]
    assert direct_step([None] * 4, 50, **kw).slots == ()  # type: ignore[arg-type]


# ------------------------------------------------------------------------------ controls


def test_control_tensors_of_each_kind_of_request() -> None:
    cfg = accumulator_config(control_type="fp32")
    controls = Controls.from_config(cfg)
    first = controls.tensors(SequenceInfo(2**40 + 3, start=True))
    assert first["START"].tolist() == [[1.0]] and first["START"].dtype == np.float32
    assert first["END"].tolist() == [[0.0]] and first["READY"].tolist() == [[1.0]]
    assert first["CORRID"].tolist() == [[2**40 + 3]] and first["CORRID"].dtype == np.uint64
    null = controls.tensors(SequenceInfo(9, end=True), ready=False)
    assert null["READY"].tolist() == [[0.0]] and null["END"].tolist() == [[0.0]]
    assert null["CORRID"].tolist() == [[0]]


def test_bool_and_string_controls_and_narrow_corrid() -> None:
    cfg = accumulator_config(control_type="bool", max_batch_size=0)
    cfg.sequence_batching.control_input[3].control[0].data_type = mc.TYPE_STRING
    controls = Controls.from_config(cfg)
    out = controls.tensors(SequenceInfo("user-7", end=True))
    assert out["END"].tolist() == [True] and out["START"].tolist() == [False]
    assert out["CORRID"].tolist() == [b"user-7"]  # no batch dim: max_batch_size 0
    cfg.sequence_batching.control_input[3].control[0].data_type = mc.TYPE_INT32
    narrow = Controls.from_config(cfg).tensors(SequenceInfo(2**32 + 5))
    assert narrow["CORRID"].tolist() == [5]  # Triton copies the low bytes


# ------------------------------------------------------------------------------ config


def test_normalize_fills_idle_default_and_oldest_preferred() -> None:
    cfg = normalize(accumulator_config(max_batch_size=6))
    assert cfg.sequence_batching.max_sequence_idle_microseconds == 1_000_000
    assert list(cfg.sequence_batching.oldest.preferred_batch_size) == [6]
    params = SequenceParams.from_config(cfg)
    assert params.oldest and params.slots_per_instance == 6
    assert params.preferred == frozenset({6})
    limited = normalize(accumulator_config(max_candidate_sequences=3, oldest=True))
    assert SequenceParams.from_config(limited).slots_per_instance == 3
    direct = SequenceParams.from_config(normalize(accumulator_config(oldest=False)))
    assert not direct.oldest and direct.slots_per_instance == 8


def test_invalid_sequence_config_is_refused() -> None:
    cfg = normalize(accumulator_config(preferred=(9,)))
    with pytest.raises(ModelConfigError, match="preferred batch size must be <= max batch size"):
        validate(cfg)
