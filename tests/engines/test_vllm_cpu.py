"""vLLM's CPU build, as the load generator and the benchmarks meet it: the OpenAI-compatible
streaming endpoints with the test model of ``tests/support/llm_model.py``.

These pin down what the generative client relies on of a real engine: a completion asked for N
tokens with ``ignore_eos`` streams N tokens in many chunks (not one), token-id prompts are
counted exactly, the last chunk carries ``usage`` when asked, ``data: [DONE]`` ends the stream,
the chat endpoint serves through the model's chat template, and ``/metrics`` counts what was
generated under vLLM's metric names. One server for the file (about a minute to start): the tests
are ``live`` and run in the suite's last tier.
"""

from __future__ import annotations

import http.client
import json
import re
from collections.abc import Iterator
from typing import Any

from tests.support.llm_model import MODEL_NAME, VllmServer


def stream(server: VllmServer, path: str, body: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """POST ``body`` with ``stream: true`` and yield each SSE ``data:`` event's JSON; the
    stream must end with ``data: [DONE]``."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=120)
    try:
        conn.request(
            "POST",
            path,
            json.dumps({**body, "stream": True}),
            {"Content-Type": "application/json"},
        )
        reply = conn.getresponse()
        assert reply.status == 200, reply.read()[:500]
        assert reply.getheader("Content-Type", "").startswith("text/event-stream")
        done = False
        for raw in reply:
            line = raw.decode().strip()
            if not line.startswith("data:"):
                continue
            data = line[len("data:") :].strip()
            if data == "[DONE]":
                done = True
                break
            yield json.loads(data)
        assert done, "the stream ended without data: [DONE]"
    finally:
        conn.close()


def metric(text: str, name: str) -> float:
    """The value of ``name{...model_name="rand-llama"...}`` in a Prometheus exposition."""
    pattern = re.compile(rf'^{re.escape(name)}\{{[^}}]*model_name="{MODEL_NAME}"[^}}]*\}} (\S+)$')
    values = [float(m.group(1)) for m in map(pattern.match, text.splitlines()) if m]
    assert values, f"{name} with model_name={MODEL_NAME!r} not in /metrics"
    return sum(values)


def test_completion_streams_every_token_with_usage(vllm_server: VllmServer) -> None:
    prompt = list(range(10, 58))  # 48 token ids: the input length is exact, no tokenizer asked
    events = list(
        stream(
            vllm_server,
            "/v1/completions",
            {
                "model": MODEL_NAME,
                "prompt": prompt,
                "max_tokens": 32,
                "min_tokens": 32,
                "ignore_eos": True,
                "stream_options": {"include_usage": True},
            },
        )
    )
    text_chunks = [e for e in events if e["choices"] and e["choices"][0]["text"]]
    usage = events[-1]["usage"]
    assert usage["prompt_tokens"] == len(prompt)
    assert usage["completion_tokens"] == 32
    # Streamed, not answered at once: most tokens come in a chunk of their own (a token whose
    # bytes are not yet a whole character is held back and sent with the next).
    assert len(text_chunks) >= 16, f"{len(text_chunks)} chunks for 32 tokens"


def test_chat_streams_through_the_chat_template(vllm_server: VllmServer) -> None:
    events = list(
        stream(
            vllm_server,
            "/v1/chat/completions",
            {
                "model": MODEL_NAME,
                "messages": [{"role": "user", "content": "What is the time to first token?"}],
                "max_tokens": 8,
                "min_tokens": 8,
                "ignore_eos": True,
                "stream_options": {"include_usage": True},
            },
        )
    )
    usage = events[-1]["usage"]
    assert usage["completion_tokens"] == 8
    assert usage["prompt_tokens"] > 8  # the template's "user: ... assistant:" around the text
    assert any(e["choices"] and e["choices"][0]["delta"].get("content") for e in events)


def test_metrics_count_the_generated_tokens(vllm_server: VllmServer) -> None:
    def scrape() -> str:
        conn = http.client.HTTPConnection("127.0.0.1", vllm_server.port, timeout=30)
        try:
            conn.request("GET", "/metrics")
            return conn.getresponse().read().decode()
        finally:
            conn.close()

    before = scrape()
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting"):
        metric(before, name)
    reply = vllm_server.completion(
        {"model": MODEL_NAME, "prompt": [5] * 20, "max_tokens": 12, "ignore_eos": True}
    )
    assert reply["usage"]["completion_tokens"] == 12  # type: ignore[index]
    after = scrape()
    generated = metric(after, "vllm:generation_tokens_total") - metric(
        before, "vllm:generation_tokens_total"
    )
    prompted = metric(after, "vllm:prompt_tokens_total") - metric(
        before, "vllm:prompt_tokens_total"
    )
    assert (generated, prompted) == (12, 20)
    # The KV cache's share in use: vLLM 0.32 calls it kv_cache_usage_perc.
    assert 0.0 <= metric(after, "vllm:kv_cache_usage_perc") <= 1.0
