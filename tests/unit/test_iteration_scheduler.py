"""The pure iteration-level scheduler (vLLM V1's rules) on planted cases and random workloads."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reference_server.batching.iteration import (
    EngineLimits,
    EngineState,
    Seq,
    abort,
    admissible,
    complete_step,
    decide_step,
)


def limits(**kw: object) -> EngineLimits:
    base: dict[str, object] = {
        "max_num_seqs": 4,
        "max_num_batched_tokens": 64,
        "enable_chunked_prefill": True,
        "num_blocks": 100,
        "block_size": 4,
    }
    base.update(kw)
    return EngineLimits(**base)  # type: ignore[arg-type]


def with_waiting(lim: EngineLimits, *seqs: Seq) -> EngineState:
    state = EngineState.empty(lim)
    for s in seqs:
        state = state.add(s)
    return state


def test_a_lone_request_prefills_then_decodes_one_token_a_step() -> None:
    lim = limits()
    state = with_waiting(lim, Seq("a", prompt_tokens=10, max_tokens=3))
    step = decide_step(lim, state)
    assert [(s.id, s.tokens, s.decode) for s in step.scheduled] == [("a", 10, False)]
    assert step.admitted == ("a",)
    done = complete_step(step)
    assert done.sampled == ("a",)  # the prefill's last position samples the first token
    step = decide_step(lim, done.state)
    assert [(s.id, s.tokens, s.decode) for s in step.scheduled] == [("a", 1, True)]
    done = complete_step(decide_step(lim, complete_step(step).state))
    assert [s.id for s in done.finished] == ["a"]
    assert done.state.idle and done.state.free_blocks == lim.num_blocks


def test_chunked_prefill_splits_a_long_prompt_over_the_token_budget() -> None:
    lim = limits(max_num_batched_tokens=16)
    state = with_waiting(lim, Seq("a", prompt_tokens=40, max_tokens=2))
    chunks = []
    while True:
        step = decide_step(lim, state)
        chunks.append(step.scheduled[0].tokens)
        done = complete_step(step)
        state = done.state
        if done.sampled:
            break
    assert chunks == [16, 16, 8]


def test_without_chunked_prefill_a_prompt_over_the_budget_waits_for_a_whole_budget() -> None:
    lim = limits(max_num_batched_tokens=16, enable_chunked_prefill=False)
    state = with_waiting(lim, Seq("a", 10, 5), Seq("b", 10, 5))
    step = decide_step(lim, state)
    # b's 10 tokens do not fit in the 6 left: admission stops (no chunk), b waits.
    assert [s.id for s in step.scheduled] == ["a"]
    assert [s.id for s in step.state.waiting] == ["b"]
    lim_on = limits(max_num_batched_tokens=16)
    step_on = decide_step(lim_on, with_waiting(lim_on, Seq("a", 10, 5), Seq("b", 10, 5)))
    assert [(s.id, s.tokens) for s in step_on.scheduled] == [("a", 10), ("b", 6)]


def test_running_first_then_waiting_in_arrival_order() -> None:
    lim = limits(max_num_batched_tokens=12)
    state = with_waiting(lim, Seq("a", 4, 5), Seq("b", 4, 5))
    state = complete_step(decide_step(lim, state)).state  # a and b prefilled
    state = state.add(Seq("c", 4, 5)).add(Seq("d", 4, 5)).add(Seq("e", 4, 5))
    step = decide_step(lim, state)
    # decodes of a and b first (2 tokens), then c and d take 8 of the 10 left; e waits.
    assert [(s.id, s.tokens, s.decode) for s in step.scheduled] == [
        ("a", 1, True),
        ("b", 1, True),
        ("c", 4, False),
        ("d", 4, False),
    ]
    assert [s.id for s in step.state.waiting] == ["e"]


def test_max_num_seqs_caps_the_running_set() -> None:
    lim = limits(max_num_seqs=2)
    state = with_waiting(lim, *(Seq(str(i), 2, 3) for i in range(5)))
    step = decide_step(lim, state)
    assert step.admitted == ("0", "1")
    assert len(step.state.running) == 2


def test_out_of_blocks_preempts_the_last_running_request_and_recomputes_it() -> None:
    # 4-token blocks, 5 blocks: a and b each hold 2 blocks after their 8-token prompts.
    lim = limits(num_blocks=5, block_size=4)
    state = with_waiting(lim, Seq("a", 8, 10), Seq("b", 8, 10))
    state = complete_step(decide_step(lim, state)).state
    assert state.free_blocks == 1
    # Decoding: a needs a 3rd block (1 free); then b needs a 3rd block (0 free): b, the last
    # running request, is preempted (itself) and goes back to the head of the queue.
    step = decide_step(lim, state)
    assert [s.id for s in step.scheduled] == ["a"]
    assert step.preempted == ("b",)
    waiting = step.state.waiting
    assert [s.id for s in waiting] == ["b"] and waiting[0].computed == 0
    assert waiting[0].blocks == 0 and waiting[0].generated == 1 and waiting[0].preemptions == 1
    assert step.admitted == ()  # no admission in a step that preempted
    # b resumes by recomputing prompt + its generated token once a finishes.
    state = complete_step(step).state
    for _ in range(20):
        step = decide_step(lim, state)
        if "b" in step.admitted:
            assert [s.tokens for s in step.scheduled if s.id == "b"] == [9]
            break
        state = complete_step(step).state
    else:
        pytest.fail("b never resumed")


def test_preemption_frees_room_for_an_earlier_request() -> None:
    lim = limits(num_blocks=6, block_size=4)
    state = with_waiting(lim, Seq("a", 8, 10), Seq("b", 8, 10), Seq("c", 4, 10))
    state = complete_step(decide_step(lim, state)).state  # 2 + 2 + 1 blocks, 1 free
    step = decide_step(lim, state)
    # a takes the free block; b needs one more: c, the last running request, is preempted
    # for b (not b for itself), and both a and b decode.
    assert step.preempted == ("c",)
    assert [s.id for s in step.scheduled] == ["a", "b"]
    assert step.state.free_blocks + step.state.used_blocks == lim.num_blocks


def test_abort_frees_blocks_and_forgets_the_request() -> None:
    lim = limits()
    state = complete_step(decide_step(lim, with_waiting(lim, Seq("a", 8, 4)))).state
    state = state.add(Seq("b", 4, 4))
    state, dropped = abort(state, frozenset({"a", "b"}))
    assert {s.id for s in dropped} == {"a", "b"}
    assert state.idle and state.free_blocks == lim.num_blocks


def test_eos_ends_a_request_early() -> None:
    lim = limits()
    state = with_waiting(lim, Seq("a", 4, 50))
    done = complete_step(decide_step(lim, state), eos=frozenset({"a"}))
    assert [s.id for s in done.finished] == ["a"] and done.finished[0].generated == 1


def test_admissible_names_the_fix() -> None:
    lim = limits(num_blocks=4, block_size=4, max_num_batched_tokens=8, enable_chunked_prefill=False)
    assert admissible(lim, 4, 4) is None
    assert "gpu_memory_utilization" in (admissible(lim, 8, 20) or "")
    assert "enable_chunked_prefill" in (admissible(lim, 12, 1) or "")
    assert "max_tokens" in (admissible(lim, 4, 0) or "")


@st.composite
def workloads(draw: st.DrawFn) -> tuple[EngineLimits, list[tuple[int, int, int]]]:
    lim = EngineLimits(
        max_num_seqs=draw(st.integers(1, 6)),
        max_num_batched_tokens=draw(st.integers(8, 64)),
        enable_chunked_prefill=draw(st.booleans()),
        num_blocks=draw(st.integers(8, 40)),
        block_size=draw(st.sampled_from([1, 2, 4, 8])),
    )
    arrivals = []
    for _ in range(draw(st.integers(1, 12))):
        prompt = draw(st.integers(1, 40))
        out = draw(st.integers(1, 12))
        if admissible(lim, prompt, out) is None:
            arrivals.append((draw(st.integers(0, 20)), prompt, out))
    return lim, arrivals


@settings(max_examples=200, deadline=None)
@given(workloads())
def test_invariants_hold_and_every_request_finishes(
    case: tuple[EngineLimits, list[tuple[int, int, int]]],
) -> None:
    lim, arrivals = case
    state = EngineState.empty(lim)
    finished: dict[str, int] = {}
    order: list[str] = []
    for step_no in range(2000):
        for i, (at, prompt, out) in enumerate(arrivals):
            if at == step_no:
                state = state.add(Seq(str(i), prompt, out))
        step = decide_step(lim, state)
        # the token budget, the running set and the block pool hold every step
        assert step.num_tokens <= lim.max_num_batched_tokens
        assert len(step.state.running) <= lim.max_num_seqs
        assert step.state.free_blocks >= 0
        assert step.state.free_blocks + step.state.used_blocks == lim.num_blocks
        for seq in step.state.running:
            assert seq.blocks == lim.blocks_for(seq.computed)
            assert seq.computed <= seq.num_tokens
        if not lim.enable_chunked_prefill:
            # without chunking an admitted prompt is prefilled whole
            for s in step.scheduled:
                if s.id in step.admitted and s.id not in order:
                    prompt = arrivals[int(s.id)][1]
                    assert s.tokens == prompt
        order.extend(a for a in step.admitted if a not in order)
        done = complete_step(step)
        for seq in done.finished:
            finished[seq.id] = seq.generated
        state = done.state
        if step_no > max((a[0] for a in arrivals), default=0) and state.idle:
            break
    assert finished == {str(i): out for i, (_, _, out) in enumerate(arrivals)}
    # first admissions follow arrival order (FCFS): ties by index
    arrival_order = sorted(range(len(arrivals)), key=lambda i: (arrivals[i][0], i))
    assert order == [str(i) for i in arrival_order]


def test_a_preempted_sequence_longer_than_the_budget_is_refused_without_chunked_prefill() -> None:
    # Preempted at 6 + 3 tokens, request 0 would recompute 9 tokens in one prefill, over the
    # budget of 8 with chunked prefill off: it would wait forever. Refused up front instead.
    lim = limits(
        max_num_seqs=2,
        max_num_batched_tokens=8,
        enable_chunked_prefill=False,
        num_blocks=8,
        block_size=2,
    )
    assert "recompute" in (admissible(lim, 6, 4) or "")
    assert admissible(lim, 6, 3) is None  # at most 6 + 2 = 8 tokens to recompute
    assert admissible(limits(max_num_batched_tokens=8), 6, 4) is None  # chunks fit any budget
