"""The profile phase of a generative engine: a few streams that time its steps.

Over the load's own streaming protocol (any :class:`~analyzer.load.streams.StreamClient`), on
the config the server runs:

* **prefill**: lone requests (one at a time, :attr:`EngineProbePlan.repeats` each) of a short
  and a long prompt, two output tokens: the first token comes after one prefill step,
  ``fixed + prefill * prompt`` plus what the engine does not see;
* **decode**: ``k`` requests sent together for ``k`` = 1, 2, 4, ... up to the running set
  (:attr:`EngineProbePlan.max_seqs`, never above the config's ``max_num_seqs``), a short prompt
  and :attr:`EngineProbePlan.decode_tokens` output tokens each: once all have their first token
  they decode together, one step per token, ``fixed + decode * k`` apart.

:func:`~analyzer.predict.engine_profile.fit_steps` turns the samples into step costs; the jitter
is the spread of a lone request's gaps; the KV cache's size is read from the server's metrics
(``vllm:cache_config_info`` or ``vllm:num_kv_cache_blocks_total``) when it has them.

Bounded: ``2 * repeats + sum(k)`` requests of a few tokens each, a few seconds on the bundled
engine. The long prompt stays within the config's token budget (one prefill step) and the
cache.
"""

from __future__ import annotations

import itertools
import statistics
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING

from analyzer.measure.lengths import GenRequest
from analyzer.measure.tokens import StreamRecord
from analyzer.predict import ProfileError
from analyzer.predict.engine_profile import (
    DecodeSample,
    EngineConfig,
    EngineProfile,
    PrefillSample,
    fit_steps,
    kv_blocks_from_metrics,
    with_share,
)

if TYPE_CHECKING:
    from analyzer.load.streams import StreamClient

__all__ = ["EngineProbePlan", "decode_samples", "probe_engine"]

#: Gaps of a decode request left out before its steady state: the step that admitted the
#: others (their prefill rides in it) and the one after.
SETTLING_GAPS = 2


@dataclass(frozen=True)
class EngineProbePlan:
    """What the engine probe sends.

    Attributes:
        short_prompt: Prompt tokens of the short prefill requests (and of the decode ones).
        long_prompt: Prompt tokens of the long prefill requests (capped by the config's token
            budget).
        repeats: Lone requests per prompt length.
        max_seqs: Most requests decoding together.
        decode_tokens: Output tokens of each decode request.
    """

    short_prompt: int = 16
    long_prompt: int = 1024
    repeats: int = 3
    max_seqs: int = 16
    decode_tokens: int = 24


def _concurrencies(most: int) -> list[int]:
    out, k = [], 1
    while k < most:
        out.append(k)
        k *= 2
    out.append(most)
    return sorted(set(out))


def decode_samples(seqs: int, records: list[StreamRecord]) -> list[DecodeSample]:
    """One sample per gap of ``seqs`` requests decoding together: each gap after the last of
    them got its first token (and :data:`SETTLING_GAPS` more), in ms."""
    firsts = [r.chunks[0][0] for r in records if r.chunks]
    if len(firsts) < len(records):
        raise ProfileError("a decode probe request streamed no token")
    start = max(firsts)
    out: list[DecodeSample] = []
    for r in records:
        chunks = [(at, n) for at, n in r.chunks if at > start]
        # A chunk of k tokens after a gap g is k steps of g / k (a server may batch tokens
        # into one chunk, as analyzer.measure.tokens counts its gaps).
        gaps = [
            (at - before) / n
            for (before, _), (at, n) in itertools.pairwise(chunks)
            for _ in range(n)
        ][SETTLING_GAPS:]
        out.extend(DecodeSample(seqs, g * 1000.0) for g in gaps)
    if not out:
        raise ProfileError(f"the decode probe at {seqs} requests left no steady gaps")
    return out


def probe_engine(
    client: Callable[[], StreamClient],
    model: str,
    config: EngineConfig,
    *,
    plan: EngineProbePlan = EngineProbePlan(),
    metrics: Callable[[], str] | None = None,
) -> EngineProfile:
    """Time the engine's steps (see the module docstring).

    Args:
        client: Makes a stream client (one per concurrent stream).
        model: The model probed (recorded).
        config: The engine settings the server runs (bounds the probe; completes what its
            metrics do not say about its cache).
        plan: What to send.
        metrics: Reads the server's Prometheus text (None: the cache's size is unknown).

    Raises:
        ProfileError: a stream failed, or the samples cannot be fitted.
    """
    from analyzer.load.prepared import InferError

    long_prompt = max(plan.short_prompt + 1, min(plan.long_prompt, config.max_num_batched_tokens))
    salt = [0]

    def send(c: StreamClient, prompt: int, output: int) -> StreamRecord:
        now = time.perf_counter()
        record = StreamRecord(intended=now, sent=now, input_tokens=prompt)
        salt[0] += 1
        try:
            c.stream(GenRequest(prompt, output), 1_000_003 + salt[0], record)
        except InferError as exc:
            raise ProfileError(f"a probe stream failed: {exc}") from exc
        return record

    prefill: list[PrefillSample] = []
    lone = client()
    try:
        send(lone, plan.short_prompt, 2)  # warm the connection and the engine
        for prompt in (plan.short_prompt, long_prompt):
            for _ in range(plan.repeats):
                r = send(lone, prompt, 2)
                if r.ttft_s is None:
                    raise ProfileError("a prefill probe request streamed no token")
                prefill.append(PrefillSample(prompt, r.ttft_s * 1000.0))
    finally:
        lone.close()

    decode: list[DecodeSample] = []
    lone_gaps: list[float] = []
    most = max(1, min(plan.max_seqs, config.max_num_seqs))
    for k in _concurrencies(most):
        clients = [client() for _ in range(k)]
        try:
            with ThreadPoolExecutor(max_workers=k) as pool:
                records = list(
                    pool.map(lambda c: send(c, plan.short_prompt, plan.decode_tokens), clients)
                )
        finally:
            for c in clients:
                c.close()
        samples = decode_samples(k, records)
        decode.extend(samples)
        if k == 1:
            lone_gaps = [s.itl_ms for s in samples]
    jitter = 0.0
    if len(lone_gaps) >= 3:
        mid = statistics.median(lone_gaps)
        mad = statistics.median(abs(g - mid) for g in lone_gaps)
        jitter = 1.4826 * mad / mid if mid > 0 else 0.0
    kv = None
    if metrics is not None:
        try:
            kv = with_share(kv_blocks_from_metrics(metrics()), config)
        except Exception:  # a server without metrics: the cache stays unknown
            kv = None
    cache = (
        f"KV cache {kv[1]} blocks of {kv[2]} at gpu_memory_utilization {kv[0]:g}"
        if kv is not None
        else "KV cache size unknown (the server's metrics did not say): taken as unbounded"
    )
    return fit_steps(
        model,
        prefill,
        decode,
        jitter=jitter,
        kv_blocks=kv,
        provenance=(
            f"probed: {len(prefill)} lone requests of {plan.short_prompt} and {long_prompt} "
            f"prompt tokens, decoding at {', '.join(map(str, _concurrencies(most)))} "
            f"concurrent requests under {config.describe()}; {cache}"
        ),
    )
