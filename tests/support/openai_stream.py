"""A minimal OpenAI-compatible streaming server: a test double for the SSE framing only.

It speaks what vLLM's OpenAI server speaks for a streaming benchmark and nothing else:
``POST /v1/completions`` and ``/v1/chat/completions`` with ``"stream": true`` answer, after
``--first-token-ms``, one ``data:`` chunk per token ``--token-ms`` apart (``max_tokens`` of them),
a usage chunk when ``stream_options.include_usage`` asks for it, then ``data: [DONE]``;
``GET /v1/models`` and ``GET /health``. Prompt tokens: the length of a token-id list, or the
words of a text. ``--close-after K`` cuts every stream after K tokens (no ``[DONE]``), as a
server that dies mid-stream does. ``--keepalive-ms T`` closes a keep-alive connection left idle
for T ms, as vLLM's server (uvicorn) does after 5 s. There is no engine and no batching: each request sleeps on
its own, so its figures are planted, not measured.

Run: ``python -m tests.support.openai_stream --port 0``; it prints ``READY <port>``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from typing import Any

from aiohttp import web


def _prompt_tokens(body: dict[str, Any]) -> int:
    if "messages" in body:
        return sum(len(str(m.get("content", "")).split()) for m in body["messages"])
    prompt = body.get("prompt", "")
    return len(prompt) if isinstance(prompt, list) else len(str(prompt).split())


def make_app(first_token_ms: float, token_ms: float, close_after: int | None) -> web.Application:
    """The server's routes."""

    async def stream(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        chat = request.path.endswith("/chat/completions")
        n = int(body.get("max_tokens", 16))
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await asyncio.sleep(first_token_ms / 1000.0)
        created = int(time.time())
        for i in range(n):
            if close_after is not None and i >= close_after:
                assert request.transport is not None
                request.transport.close()  # mid-stream: no [DONE]
                return response
            if i:
                await asyncio.sleep(token_ms / 1000.0)
            text = f" tok{i}"
            choice = (
                {"index": 0, "delta": {"content": text}} if chat else {"index": 0, "text": text}
            )
            chunk = {"id": "x", "created": created, "model": body.get("model"), "choices": [choice]}
            await response.write(f"data: {json.dumps(chunk)}\n\n".encode())
        if (body.get("stream_options") or {}).get("include_usage"):
            usage = {
                "prompt_tokens": _prompt_tokens(body),
                "completion_tokens": n,
                "total_tokens": _prompt_tokens(body) + n,
            }
            chunk = {"id": "x", "created": created, "choices": [], "usage": usage}
            await response.write(f"data: {json.dumps(chunk)}\n\n".encode())
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "llm", "object": "model"}]})

    async def health(request: web.Request) -> web.Response:
        return web.Response(status=200)

    app = web.Application()
    app.router.add_post("/v1/completions", stream)
    app.router.add_post("/v1/chat/completions", stream)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/health", health)
    return app


async def _serve(args: argparse.Namespace) -> None:
    runner = web.AppRunner(
        make_app(args.first_token_ms, args.token_ms, args.close_after),
        keepalive_timeout=args.keepalive_ms / 1000.0,
    )
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", args.port)
    await site.start()
    server = site._server
    assert server is not None
    port = server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    print(f"READY {port}", flush=True)
    await asyncio.Event().wait()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--first-token-ms", type=float, default=20.0)
    parser.add_argument("--token-ms", type=float, default=10.0)
    parser.add_argument("--close-after", type=int, default=None)
    parser.add_argument("--keepalive-ms", type=float, default=75_000.0)  # aiohttp's default
    asyncio.run(_serve(parser.parse_args()))


if __name__ == "__main__":
    main()
