"""The pure batch-formation step (triton_spec §3.4) on planted scenarios and random queues.

The scenarios are Triton's own ``server/qa/L0_batcher`` cases. A small driver replays arrivals
against :func:`decide` the way the batcher thread does, with an instance that starts every
batch as soon as it is handed over (so each decision opens a new batch), and records batches.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reference_server.batching.decide import (
    BatchingParams,
    Candidate,
    OpenBatch,
    PriorityQueue,
    QueuePolicy,
    decide,
)

MS = 1_000_000


@dataclass(frozen=True)
class Arrival:
    at_ns: int
    batch_size: int
    shape: Hashable = None


def drive(
    arrivals: Sequence[Arrival], params: BatchingParams, horizon_ns: int = 10**12
) -> list[tuple[int, list[int]]]:
    """Replay arrivals; return ``(dispatch time, [arrival indexes])`` per batch.

    Time jumps from event to event: the next arrival or the wake-up time a decision asks for.
    """
    pending = sorted(range(len(arrivals)), key=lambda i: arrivals[i].at_ns)
    queue: list[int] = []
    batches: list[tuple[int, list[int]]] = []
    now = 0
    wake: int | None = None
    for _ in range(10_000):
        while pending and arrivals[pending[0]].at_ns <= now:
            queue.append(pending.pop(0))
        wake = None
        while queue:
            cands = [
                Candidate(arrivals[i].batch_size, arrivals[i].at_ns, None, arrivals[i].shape)
                for i in queue
            ]
            d = decide(cands, OpenBatch(), params, now)
            if d.take == 0:
                wake = d.wake_at_ns
                break
            batches.append((now, queue[: d.take]))
            queue = queue[d.take :]
        nexts = [t for t in (wake, arrivals[pending[0]].at_ns if pending else None) if t]
        if not nexts:
            break
        now = max(now, min(nexts))
        if now > horizon_ns:
            break
    assert not queue, "requests left undispatched"
    return batches


def sizes(arrivals: Sequence[Arrival], batches: list[tuple[int, list[int]]]) -> list[int]:
    return [sum(arrivals[i].batch_size for i in idx) for _, idx in batches]


D10S = BatchingParams(8, frozenset({2, 6}), 10_000 * MS)


def test_multi_batch_use_biggest_preferred() -> None:
    arrivals = [Arrival(0, 1) for _ in range(6)]
    assert sizes(arrivals, drive(arrivals, D10S)) == [6]


def test_multi_batch_use_best_preferred_partial_then_delay() -> None:
    # Three bs=1, all queued together: {2} at once (preferred), the third waits the delay.
    arrivals = [Arrival(0, 1), Arrival(0, 1), Arrival(0, 1)]
    batches = drive(arrivals, D10S)
    assert sizes(arrivals, batches) == [2, 1]
    assert batches[0][0] == 0 and batches[1][0] == 10_000 * MS


def test_multi_batch_gt_max_preferred() -> None:
    arrivals = [Arrival(0, 3), Arrival(0, 7)]
    batches = drive(arrivals, D10S)
    assert sizes(arrivals, batches) == [3, 7]
    assert [t for t, _ in batches] == [0, 0]


def test_multi_batch_sum_gt_max_preferred() -> None:
    arrivals = [Arrival(0, 3), Arrival(0, 4)]
    batches = drive(arrivals, D10S)
    assert sizes(arrivals, batches) == [3, 4]
    assert batches[0][0] == 0, "the prefix that fits under Pmax goes at once"
    assert batches[1][0] == 10_000 * MS, "the rest waits for the delay"


def test_multi_batch_delayed_use_max_batch() -> None:
    # 3 and 4 queued longer than D, then a bs=1 arrives: preferred sizes no longer cap.
    params = BatchingParams(8, frozenset({2, 6}), 10 * MS)
    cands = [Candidate(3, 0), Candidate(4, 0), Candidate(1, 20 * MS)]
    d = decide(cands, OpenBatch(), params, 20 * MS)
    assert d.take == 3
    assert d.seal


def test_multi_batch_delayed_preferred_different_shape() -> None:
    arrivals = [Arrival(0, 1, "A"), Arrival(0, 3, "A"), Arrival(0, 1, "B"), Arrival(0, 5, "B")]
    batches = drive(arrivals, D10S)
    assert sizes(arrivals, batches) == [4, 6]
    assert [idx for _, idx in batches] == [[0, 1], [2, 3]]


def test_shape_mismatch_sets_merge_blocked() -> None:
    d = decide([Candidate(1, 0, None, "A"), Candidate(1, 0, None, "B")], OpenBatch(), D10S, 0)
    assert (d.take, d.seal, d.merge_blocked) == (1, True, True)


def test_zero_delay_cuts_at_largest_preferred_prefix() -> None:
    params = BatchingParams(8, frozenset({4, 8}), 0)
    arrivals = [Arrival(0, 1) for _ in range(6)]
    assert sizes(arrivals, drive(arrivals, params)) == [4, 2]


def test_default_dynamic_batching_takes_everything_up_to_max() -> None:
    params = BatchingParams(8, frozenset({8}), 0)
    arrivals = [Arrival(0, 1) for _ in range(11)]
    assert sizes(arrivals, drive(arrivals, params)) == [8, 3]


def test_max_batch_size_zero_never_batches() -> None:
    params = BatchingParams(1, frozenset(), 5 * MS)
    arrivals = [Arrival(0, 1) for _ in range(4)]
    assert sizes(arrivals, drive(arrivals, params)) == [1, 1, 1, 1]


def test_delay_counts_from_oldest_pending_request() -> None:
    params = BatchingParams(8, frozenset({8}), 10 * MS)
    cands = [Candidate(1, 0), Candidate(1, 9 * MS)]
    d = decide(cands, OpenBatch(), params, 9 * MS)
    assert d.take == 0 and d.wake_at_ns == 10 * MS
    assert decide(cands, OpenBatch(), params, 10 * MS).take == 2


def test_wakes_for_the_nearest_queue_deadline() -> None:
    params = BatchingParams(8, frozenset({8}), 10 * MS)
    d = decide([Candidate(1, 0, 3 * MS)], OpenBatch(), params, 0)
    assert d.wake_at_ns == 3 * MS


def test_open_batch_at_preferred_absorbs_beyond_pmax_quirk() -> None:
    # §3.4 quirk: an unsealed queued batch sitting at a preferred size absorbs the next request.
    params = BatchingParams(8, frozenset({2, 6}), 10 * MS)
    d = decide([Candidate(1, 0)], OpenBatch(size=6), params, 0)
    assert d.take == 1 and d.seal


def test_open_batch_growing_in_prefetch_mode_with_zero_delay() -> None:
    params = BatchingParams(8, frozenset({8}), 0)
    d = decide([Candidate(1, 0)], OpenBatch(size=3), params, 0)
    assert d.take == 1 and not d.seal
    d = decide([Candidate(1, 0)], OpenBatch(size=7), params, 0)
    assert d.take == 1 and d.seal


def test_a_delayed_step_says_how_many_queued_items_wake_the_batcher_again() -> None:
    # Triton's next_preferred_batch_size_: the next preferred size above what is held, less
    # what the open batch held before the step (a quirk: 16 - 1, not 16 - 2, after growing).
    params = BatchingParams(16, frozenset({16}), 2 * MS)
    waiting = decide([Candidate(1, 0)], OpenBatch(), params, 0)
    assert waiting.take == 0 and waiting.next_preferred == 16
    growing = decide([Candidate(1, 0)], OpenBatch(size=1), params, 0)
    assert growing.take == 1 and growing.next_preferred == 15
    # Steps that send, and every step without a delay, leave it as it was (None).
    assert decide([Candidate(1, 0)], OpenBatch(), params, 2 * MS).next_preferred is None
    no_delay = BatchingParams(16, frozenset({16}), 0)
    assert decide([Candidate(1, 0)], OpenBatch(size=1), no_delay, 0).next_preferred is None
    with_preferred = BatchingParams(8, frozenset({4, 8}), 2 * MS)
    assert decide([Candidate(1, 0)] * 3, OpenBatch(), with_preferred, 0).next_preferred == 4
    assert decide([Candidate(1, 0)] * 5, OpenBatch(), with_preferred, 0).take == 4


# ------------------------------------------------------------------- properties

requests = st.lists(
    st.tuples(
        st.integers(min_value=0, max_value=30),  # arrival in ms
        st.integers(min_value=1, max_value=8),  # batch size
        st.sampled_from(["A", "B"]),
    ),
    min_size=1,
    max_size=25,
)
param_sets = st.builds(
    lambda mbs, prefs, delay_ms: BatchingParams(
        mbs, frozenset(p for p in prefs if p <= mbs), delay_ms * MS
    ),
    st.integers(min_value=1, max_value=16),
    st.sets(st.integers(min_value=1, max_value=16), max_size=3),
    st.integers(min_value=0, max_value=20),
)


@settings(max_examples=300, deadline=None)
@given(requests, param_sets)
@pytest.mark.usefixtures("takes_seconds")
def test_every_request_dispatched_once_in_order_within_limits(
    reqs: list[tuple[int, int, str]], params: BatchingParams
) -> None:
    arrivals = [Arrival(t * MS, min(bs, params.max_batch_size), shape) for t, bs, shape in reqs]
    batches = drive(arrivals, params)
    flat = [i for _, idx in batches for i in idx]
    order = sorted(range(len(arrivals)), key=lambda i: (arrivals[i].at_ns, i))
    # Each request exactly once, batches are consecutive prefixes of the arrival order.
    assert flat == order
    for at, idx in batches:
        total = sum(arrivals[i].batch_size for i in idx)
        assert total <= params.max_batch_size or len(idx) == 1
        assert len({arrivals[i].shape for i in idx}) == 1
        # Nobody is dispatched before arriving, nor kept past its delay (+ the scan moment).
        assert all(arrivals[i].at_ns <= at for i in idx)
        if params.max_queue_delay_ns:
            assert at - min(arrivals[i].at_ns for i in idx) <= params.max_queue_delay_ns
        else:
            assert at == max(arrivals[i].at_ns for i in idx), "D=0 never holds a request"


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.integers(min_value=1, max_value=8), min_size=1, max_size=20),
    st.integers(min_value=0, max_value=8),
    param_sets,
    st.integers(min_value=0, max_value=40),
)
@pytest.mark.usefixtures("takes_seconds")
def test_decision_takes_a_valid_prefix(
    bss: list[int], open_size: int, params: BatchingParams, now_ms: int
) -> None:
    mbs = params.max_batch_size
    cands = [Candidate(min(b, mbs), i * MS) for i, b in enumerate(bss)]
    open_size = min(open_size, mbs)
    d = decide(cands, OpenBatch(size=open_size), params, now_ms * MS)
    assert 0 <= d.take <= len(cands)
    taken = sum(c.batch_size for c in cands[: d.take])
    if open_size == 0 and d.take:
        assert d.take == 1 or taken <= mbs
    else:
        assert open_size + taken <= mbs
    if d.take == 0 and not (d.seal and open_size):
        assert (d.wake_at_ns is not None and d.wake_at_ns > now_ms * MS) or not cands


# ------------------------------------------------------------------- queue structure


def test_queue_scans_levels_in_order_unexpired_before_delayed() -> None:
    q: PriorityQueue[str] = PriorityQueue(
        QueuePolicy(), {2: QueuePolicy(delay_on_timeout=True, default_timeout_us=1)}
    )
    q.push(2, "a")
    q.push(2, "b")
    q.push(1, "c")
    removed = q.sweep(lambda x: False, lambda x: x == "a")
    assert removed == []
    assert list(q) == ["c", "b", "a"], "expired DELAY request moves behind its level"
    assert q.pop_front(2) == ["c", "b"]
    assert list(q) == ["a"]


def test_sweep_rejects_expired_and_drops_cancelled() -> None:
    q: PriorityQueue[str] = PriorityQueue(QueuePolicy(default_timeout_us=5))
    for item in "abc":
        q.push(0, item)
    removed = q.sweep(lambda x: x == "b", lambda x: x == "c")
    assert removed == [("b", "CANCELED"), ("c", "REJECTED")]
    assert list(q) == ["a"] and q.level_size(0) == 1


def test_timeout_override_can_only_shorten() -> None:
    policy = QueuePolicy(default_timeout_us=1_000_000, allow_timeout_override=True)
    assert policy.timeout_us(100_000) == 100_000
    assert policy.timeout_us(10_000_000) == 1_000_000
    assert policy.timeout_us(0) == 1_000_000
    assert QueuePolicy(allow_timeout_override=True).timeout_us(100) == 0
    assert QueuePolicy(default_timeout_us=50).timeout_us(10) == 50
