"""Iteration-level scheduling (continuous batching): the next step of a generative engine.

The counterpart of :mod:`reference_server.batching.decide` for engines that batch per step, as
vLLM's V1 scheduler (``vllm/v1/core/sched/scheduler.py``) does. Pure: no clock, no I/O, no
mutation; the reference engine (:mod:`reference_server.backends.generative`) steps it on a
simulated device in real time, and a simulator can step the same functions in virtual time.

One step, as :func:`decide_step` decides it:

1. **Running first**, in running order. Each running sequence asks for the tokens it has not
   computed yet (``prompt + generated - computed``: one for a decode, the rest of the prompt
   for a prefill chunk), capped by what is left of the token budget
   (``max_num_batched_tokens``). Its KV blocks must hold ``computed + scheduled`` tokens; when
   the free blocks do not suffice, the **last** running sequence is preempted (its blocks freed,
   its computed tokens reset: recompute, vLLM V1's only mode) and put at the head of the
   waiting queue, until the allocation fits or the sequence preempted itself.
2. **Then waiting, in FCFS order**, only when nothing was preempted in this step: while the
   running set is below ``max_num_seqs`` and budget remains. Without chunked prefill a
   sequence whose uncomputed tokens exceed the remaining budget stops admission (vLLM's
   ``break``); with it, the sequence is admitted with a chunk of the remaining budget. A
   sequence whose blocks do not fit stops admission too.

After the device ran the step, :func:`complete_step` advances the state: every scheduled
sequence whose computed tokens caught up with its tokens samples one token (a decode, or the
last chunk of a prefill); a sequence finishes at ``max_tokens`` or at an EOS the caller drew,
and its blocks return to the pool. :func:`abort` drops sequences (cancelled requests).

Left out of vLLM's rules: prefix caching, speculative decoding, priorities, LoRA, encoder
inputs, ``long_prefill_token_threshold``, async scheduling, the watermark and ``max_model_len``
(the engine refuses a request that cannot fit instead; see :func:`admissible`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class EngineLimits:
    """The engine settings the scheduler obeys (vLLM's names).

    Attributes:
        max_num_seqs: Most sequences in the running set.
        max_num_batched_tokens: Most tokens one step may carry (decodes and prefill alike).
        enable_chunked_prefill: Whether a prompt may be prefilled over several steps.
        num_blocks: KV-cache blocks of the engine.
        block_size: Tokens per KV-cache block.
    """

    max_num_seqs: int
    max_num_batched_tokens: int
    enable_chunked_prefill: bool
    num_blocks: int
    block_size: int = 16

    def __post_init__(self) -> None:
        for name in ("max_num_seqs", "max_num_batched_tokens", "num_blocks", "block_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")

    def blocks_for(self, tokens: int) -> int:
        """KV blocks that hold ``tokens`` tokens."""
        return -(-tokens // self.block_size)


@dataclass(frozen=True, slots=True)
class Seq:
    """One request as the scheduler sees it.

    Attributes:
        id: Unique id (the engine's request id).
        prompt_tokens: Prompt length.
        max_tokens: Output tokens at most.
        generated: Tokens sampled so far.
        computed: Tokens whose KV is computed (reset to 0 by preemption).
        blocks: KV blocks held.
        preemptions: Times preempted.
    """

    id: str
    prompt_tokens: int
    max_tokens: int
    generated: int = 0
    computed: int = 0
    blocks: int = 0
    preemptions: int = 0

    @property
    def num_tokens(self) -> int:
        """Prompt plus generated tokens: what the KV cache must hold once caught up."""
        return self.prompt_tokens + self.generated

    @property
    def uncomputed(self) -> int:
        return self.num_tokens - self.computed


@dataclass(frozen=True)
class EngineState:
    """Running set (in running order), waiting queue (head first) and free KV blocks."""

    running: tuple[Seq, ...] = ()
    waiting: tuple[Seq, ...] = ()
    free_blocks: int = 0

    @classmethod
    def empty(cls, limits: EngineLimits) -> EngineState:
        return cls(free_blocks=limits.num_blocks)

    def add(self, seq: Seq) -> EngineState:
        """Queue a new request at the tail of the waiting queue."""
        return replace(self, waiting=(*self.waiting, seq))

    @property
    def used_blocks(self) -> int:
        return sum(s.blocks for s in self.running)

    @property
    def idle(self) -> bool:
        return not self.running and not self.waiting


@dataclass(frozen=True, slots=True)
class Scheduled:
    """One sequence's share of a step.

    Attributes:
        id: Sequence id.
        tokens: Tokens computed for it in this step.
        decode: True for a decode (one token of a sequence that has sampled before and whose
            KV is otherwise complete); False for a prefill chunk (also a recompute).
        new_blocks: Blocks allocated to it in this step.
    """

    id: str
    tokens: int
    decode: bool
    new_blocks: int


@dataclass(frozen=True)
class Step:
    """The scheduler's decision for one step and the state it leaves.

    Attributes:
        scheduled: Sequences that run in this step, running ones first, then admitted ones.
        preempted: Sequences preempted in this step (now at the head of the waiting queue).
        admitted: Waiting sequences moved to the running set in this step.
        state: The state with the step scheduled (computed tokens advanced, blocks allocated).
    """

    scheduled: tuple[Scheduled, ...]
    preempted: tuple[str, ...]
    admitted: tuple[str, ...]
    state: EngineState

    @property
    def num_tokens(self) -> int:
        return sum(s.tokens for s in self.scheduled)

    @property
    def prefill_tokens(self) -> int:
        return sum(s.tokens for s in self.scheduled if not s.decode)

    @property
    def decode_seqs(self) -> int:
        return sum(1 for s in self.scheduled if s.decode)

    @property
    def empty(self) -> bool:
        return not self.scheduled


@dataclass(frozen=True)
class Completion:
    """What a step produced.

    Attributes:
        sampled: Sequences that sampled one token in this step, in schedule order.
        finished: Sequences that ended (max_tokens or EOS); their blocks are free again.
        state: The state after the step.
    """

    sampled: tuple[str, ...]
    finished: tuple[Seq, ...]
    state: EngineState


def admissible(limits: EngineLimits, prompt_tokens: int, max_tokens: int) -> str | None:
    """Why a request can never run under ``limits`` (None when it can).

    A request whose whole sequence needs more blocks than the cache has would preempt itself
    forever. Without chunked prefill a prefill runs whole in one step, and a preempted request
    recomputes its prompt and the tokens it generated (up to ``max_tokens - 1``) as one prefill:
    a sequence longer than the token budget could wait forever after a preemption (vLLM refuses
    a ``max_num_batched_tokens`` below ``max_model_len`` without chunked prefill for this).
    """
    if prompt_tokens < 1:
        return "the prompt must have at least one token"
    if max_tokens < 1:
        return f"max_tokens must be at least 1, got {max_tokens}"
    total = prompt_tokens + max_tokens
    if limits.blocks_for(total) > limits.num_blocks:
        return (
            f"the prompt ({prompt_tokens} tokens) and max_tokens ({max_tokens}) need "
            f"{limits.blocks_for(total)} KV-cache blocks of {limits.block_size} tokens, the "
            f"cache has {limits.num_blocks}: shorten the request or raise "
            "gpu_memory_utilization in model.json"
        )
    longest_prefill = prompt_tokens + max_tokens - 1  # a recompute after a preemption
    if not limits.enable_chunked_prefill and longest_prefill > limits.max_num_batched_tokens:
        return (
            f"the prompt ({prompt_tokens} tokens) and max_tokens ({max_tokens}) need a prefill "
            f"of up to {longest_prefill} tokens (a recompute after a preemption), over "
            f"max_num_batched_tokens ({limits.max_num_batched_tokens}) with chunked prefill "
            "off: raise max_num_batched_tokens or set enable_chunked_prefill in model.json"
        )
    return None


def _preempted(seq: Seq) -> Seq:
    return Seq(seq.id, seq.prompt_tokens, seq.max_tokens, seq.generated, 0, 0, seq.preemptions + 1)


def _advanced(seq: Seq, tokens: int, blocks: int) -> Seq:
    # A constructor call, not dataclasses.replace: the simulator steps this millions of times.
    return Seq(
        seq.id,
        seq.prompt_tokens,
        seq.max_tokens,
        seq.generated,
        seq.computed + tokens,
        seq.blocks + blocks,
        seq.preemptions,
    )


def decide_step(limits: EngineLimits, state: EngineState) -> Step:
    """Schedule one step (vLLM V1's rules; see the module docstring)."""
    budget = limits.max_num_batched_tokens
    free = state.free_blocks
    running = list(state.running)
    waiting = list(state.waiting)
    scheduled: list[Scheduled] = []
    preempted: list[str] = []
    updated: dict[str, Seq] = {}

    index = 0
    while index < len(running) and budget > 0:
        seq = running[index]
        tokens = min(seq.uncomputed, budget)
        if tokens <= 0:
            index += 1
            continue
        fitted = True
        while True:
            need = limits.blocks_for(seq.computed + tokens) - seq.blocks
            if need <= free:
                break
            victim = running.pop()
            free += victim.blocks
            preempted.append(victim.id)
            waiting.insert(0, _preempted(victim))
            if victim.id == seq.id:
                fitted = False
                break
        if not fitted:
            break
        free -= need
        decode = seq.generated > 0 and seq.uncomputed == 1
        scheduled.append(Scheduled(seq.id, tokens, decode, need))
        updated[seq.id] = _advanced(seq, tokens, need)
        budget -= tokens
        index += 1

    admitted: list[str] = []
    if not preempted:
        while waiting and budget > 0 and len(running) < limits.max_num_seqs:
            seq = waiting[0]
            tokens = seq.uncomputed
            if not limits.enable_chunked_prefill and tokens > budget:
                break
            tokens = min(tokens, budget)
            need = limits.blocks_for(seq.computed + tokens) - seq.blocks
            if need > free:
                break
            waiting.pop(0)
            free -= need
            running.append(seq)
            admitted.append(seq.id)
            scheduled.append(Scheduled(seq.id, tokens, False, need))
            updated[seq.id] = _advanced(seq, tokens, need)
            budget -= tokens

    new_running = tuple(updated.get(s.id, s) for s in running)
    return Step(
        scheduled=tuple(scheduled),
        preempted=tuple(preempted),
        admitted=tuple(admitted),
        state=EngineState(new_running, tuple(waiting), free),
    )


def complete_step(step: Step, eos: frozenset[str] = frozenset()) -> Completion:
    """Advance the state past a step the device ran.

    Args:
        step: The step :func:`decide_step` returned.
        eos: Sequences whose sampled token is an end-of-sequence token (the caller draws
            them; ignored for sequences that did not sample).
    """
    state = step.state
    ids = {s.id for s in step.scheduled}
    sampled: list[str] = []
    finished: list[Seq] = []
    running: list[Seq] = []
    free = state.free_blocks
    for seq in state.running:
        if seq.id in ids and seq.computed == seq.num_tokens:
            seq = Seq(
                seq.id,
                seq.prompt_tokens,
                seq.max_tokens,
                seq.generated + 1,
                seq.computed,
                seq.blocks,
                seq.preemptions,
            )
            sampled.append(seq.id)
            if seq.generated >= seq.max_tokens or seq.id in eos:
                finished.append(seq)
                free += seq.blocks
                continue
        running.append(seq)
    order = {s.id: i for i, s in enumerate(step.scheduled)}
    sampled.sort(key=order.__getitem__)
    return Completion(
        sampled=tuple(sampled),
        finished=tuple(finished),
        state=EngineState(tuple(running), state.waiting, free),
    )


def abort(state: EngineState, ids: frozenset[str]) -> tuple[EngineState, tuple[Seq, ...]]:
    """Drop sequences (cancelled requests) from wherever they are; their blocks are freed."""
    dropped = tuple(s for s in (*state.running, *state.waiting) if s.id in ids)
    if not dropped:
        return state, ()
    return (
        EngineState(
            tuple(s for s in state.running if s.id not in ids),
            tuple(s for s in state.waiting if s.id not in ids),
            state.free_blocks + sum(s.blocks for s in state.running if s.id in ids),
        ),
        dropped,
    )
