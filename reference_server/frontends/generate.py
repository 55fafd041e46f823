"""Text-generation endpoints of the HTTP port: Triton's generate extension and OpenAI's API.

Triton's generate extension (``protocol/extension_generate.md``):
``POST /v2/models/<m>[/versions/<v>]/generate`` answers one JSON object,
``.../generate_stream`` answers Server-Sent Events, one ``data: {...}`` per response. A request
body's keys (and its ``parameters``' keys) that name a model input become that input's tensor;
the other ``parameters`` become request parameters. A response is ``{"model_name",
"model_version", <output name>: <value>...}``; an error during a stream is a ``data:
{"error": ...}`` event, one before it an ordinary JSON error with its status.

The OpenAI-compatible API as vLLM serves it, for models with the inputs of Triton's vLLM
backend (``text_input``, ``stream``, ``sampling_parameters``, ``exclude_input_in_output``):
``POST /v1/completions`` (``prompt`` a string or a list of token ids; each id counts as one
token), ``POST /v1/chat/completions`` (the messages' contents form the prompt), with
``stream``, ``max_tokens`` (or ``max_completion_tokens``), vLLM's ``min_tokens`` and
``ignore_eos``, and ``stream_options.include_usage`` (a last chunk with ``usage`` and no
choices); ``data: [DONE]`` ends a stream. ``GET /v1/models`` lists the decoupled models that
are ready, ``GET /health`` answers 200 when the server is ready.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import numpy as np
from aiohttp import web
from tritonclient.grpc import model_config_pb2 as mc

from reference_server.backends.generative import prompt_tokens_of
from reference_server.core.config import numpy_dtype, protocol_datatype
from reference_server.core.errors import Code, ServerError
from reference_server.core.types import InferRequest, InferResponse

if TYPE_CHECKING:
    from reference_server.core.server import InferenceServer

_SSE_HEADERS = {"Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache"}


# -- Triton's generate extension ----------------------------------------------------------------


def _tensor(name: str, value: Any, spec: mc.ModelInput) -> tuple[np.ndarray, str]:
    datatype = protocol_datatype(spec.data_type)
    values = value if isinstance(value, list) else [value]
    try:
        if datatype == "BYTES":
            array = np.array(
                [v.encode("utf-8") if isinstance(v, str) else str(v).encode() for v in values],
                dtype=np.object_,
            )
        else:
            array = np.array(values, dtype=numpy_dtype(datatype))
    except (TypeError, ValueError) as exc:
        raise ServerError(
            f"value of '{name}' does not convert to the input's datatype {datatype}",
            Code.INVALID_ARG,
        ) from exc
    return array, datatype


def generate_request(name: str, version: str, body: Any, config: mc.ModelConfig) -> InferRequest:
    """The core request for a generate body (see the module docstring for the mapping).

    Raises:
        ServerError: INVALID_ARG for a body that is not an object or a value that does not fit.
    """
    if not isinstance(body, dict):
        raise ServerError("the generate request body must be a JSON object", Code.INVALID_ARG)
    params = body.get("parameters", {})
    if not isinstance(params, dict):
        raise ServerError("'parameters' must be a JSON object", Code.INVALID_ARG)
    specs = {i.name: i for i in config.input}
    request = InferRequest(model_name=name, model_version=version)
    fields = [(k, v) for k, v in body.items() if k != "parameters"] + list(params.items())
    for key, value in fields:
        if key in specs:
            request.inputs[key], request.input_datatypes[key] = _tensor(key, value, specs[key])
        elif isinstance(value, (bool, int, float, str)):
            request.parameters[key] = value
        else:
            raise ServerError(
                f"parameter '{key}' must be a string, number or boolean", Code.INVALID_ARG
            )
    return request


def generate_response(response: InferResponse) -> dict[str, Any]:
    """The generate extension's JSON object for one response."""
    out: dict[str, Any] = {
        "model_name": response.model_name,
        "model_version": response.model_version,
    }
    for key, array in response.outputs.items():
        values = [
            v.decode("utf-8", errors="replace") if isinstance(v, bytes) else v
            for v in array.reshape(-1).tolist()
        ]
        out[key] = values[0] if len(values) == 1 else values
    return out


def _event(value: Any) -> bytes:
    return b"data: " + json.dumps(value, separators=(",", ":")).encode() + b"\n\n"


async def _first(stream: AsyncIterator[InferResponse]) -> InferResponse:
    """The first response (errors before it reach the caller as an ordinary JSON error)."""
    async for response in stream:
        return response
    raise ServerError("the model sent no response", Code.INTERNAL)


async def generate(core: InferenceServer, name: str, version: str, body: Any) -> dict[str, Any]:
    """``/generate``: exactly one response."""
    request = generate_request(name, version, body, core.model_config(name, version))
    responses = [r async for r in core.infer_stream(request)]
    if len(responses) != 1:
        raise ServerError(
            "generate expects model to produce exactly 1 response, use generate stream for "
            "model that generates various number of responses",
            Code.INVALID_ARG,
        )
    return generate_response(responses[0])


async def generate_stream(
    core: InferenceServer, http: web.BaseRequest, name: str, version: str, body: Any
) -> web.StreamResponse:
    """``/generate_stream``: one SSE event per response."""
    request = generate_request(name, version, body, core.model_config(name, version))
    stream = core.infer_stream(request)
    first = await _first(stream)
    reply = web.StreamResponse(headers=_SSE_HEADERS)
    await reply.prepare(http)
    await reply.write(_event(generate_response(first)))
    if not first.final:
        try:
            async for response in stream:
                await reply.write(_event(generate_response(response)))
        except ServerError as exc:
            await reply.write(_event({"error": exc.message}))
    await reply.write_eof()
    return reply


# -- OpenAI-compatible API ------------------------------------------------------------------------


class OpenAIError(Exception):
    """An error answered in OpenAI's shape."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status

    def response(self) -> web.Response:
        kind = {400: "BadRequestError", 404: "NotFoundError"}.get(
            self.status, "InternalServerError"
        )
        body = {"error": {"message": str(self), "type": kind, "param": None, "code": self.status}}
        return web.json_response(body, status=self.status)


def _served_models(core: InferenceServer) -> list[str]:
    names = []
    for entry in core.repository_index(ready_only=True):
        name = entry.get("name", "")
        try:
            if name and core.is_decoupled(name):
                names.append(name)
        except ServerError:
            continue
    return sorted(set(names))


def list_models(core: InferenceServer) -> dict[str, Any]:
    """``GET /v1/models``."""
    now = int(time.time())
    return {
        "object": "list",
        "data": [
            {"id": n, "object": "model", "created": now, "owned_by": "reference_server"}
            for n in _served_models(core)
        ],
    }


def _int_field(body: dict[str, Any], *names: str, default: int) -> int:
    for name in names:
        if body.get(name) is not None:
            value = body[name]
            if isinstance(value, bool) or not isinstance(value, int):
                raise OpenAIError(f"'{name}' must be an integer")
            return value
    return default


def _prompt_text(body: dict[str, Any], chat: bool) -> str:
    if chat:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise OpenAIError("'messages' must be a non-empty list")
        parts: list[str] = []
        for message in messages:
            content = message.get("content") if isinstance(message, dict) else None
            if isinstance(content, list):
                content = " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
            if not isinstance(content, str):
                raise OpenAIError("each message needs a 'content' string")
            parts.append(content)
        return " ".join(parts)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return prompt
    if (
        isinstance(prompt, list)
        and prompt
        and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt)
    ):
        # Token ids: each is one token of the reference engine's count (one word each).
        return " ".join(f"t{t}" for t in prompt)
    raise OpenAIError("'prompt' must be a string or a list of token ids (one prompt per request)")


def _model_name(core: InferenceServer, body: dict[str, Any]) -> str:
    name = body.get("model")
    served = _served_models(core)
    if name is None:
        if len(served) == 1:
            return served[0]
        raise OpenAIError(f"'model' is required; served: {', '.join(served) or 'none'}")
    if not isinstance(name, str) or name not in served:
        raise OpenAIError(
            f"The model `{name}` does not exist; served: {', '.join(served) or 'none'}", 404
        )
    return name


def _core_request(name: str, text: str, max_tokens: int, body: dict[str, Any]) -> InferRequest:
    sampling = {"max_tokens": max_tokens}
    if body.get("min_tokens") is not None:
        sampling["min_tokens"] = _int_field(body, "min_tokens", default=0)
    if body.get("ignore_eos") is not None:
        if not isinstance(body["ignore_eos"], bool):
            raise OpenAIError("'ignore_eos' must be true or false")
        sampling["ignore_eos"] = body["ignore_eos"]
    request = InferRequest(model_name=name)
    request.inputs = {
        "text_input": np.array([text.encode("utf-8")], dtype=np.object_),
        "stream": np.array([True]),
        "sampling_parameters": np.array([json.dumps(sampling).encode()], dtype=np.object_),
        "exclude_input_in_output": np.array([True]),
    }
    request.input_datatypes = {
        "text_input": "BYTES",
        "stream": "BOOL",
        "sampling_parameters": "BYTES",
        "exclude_input_in_output": "BOOL",
    }
    return request


def _text_of(response: InferResponse) -> str:
    array = response.outputs.get("text_output")
    if array is None or array.size == 0:
        return ""
    value = array.reshape(-1)[0]
    return value.decode("utf-8", errors="replace") if isinstance(value, bytes) else str(value)


async def completions(
    core: InferenceServer, http: web.BaseRequest, body: Any, chat: bool
) -> web.StreamResponse:
    """``POST /v1/completions`` and ``/v1/chat/completions``, streamed or not."""
    if not isinstance(body, dict):
        raise OpenAIError("the request body must be a JSON object")
    name = _model_name(core, body)
    text = _prompt_text(body, chat)
    max_tokens = _int_field(body, "max_tokens", "max_completion_tokens", default=16)
    if max_tokens < 1:
        raise OpenAIError("'max_tokens' must be at least 1")
    stream_wanted = body.get("stream", False) is True
    options = body.get("stream_options") or {}
    include_usage = isinstance(options, dict) and options.get("include_usage") is True
    prompt_tokens = prompt_tokens_of(text)
    request = _core_request(name, text, max_tokens, body)
    stream = core.infer_stream(request)
    try:
        first = await _first(stream)
    except ServerError as exc:
        raise OpenAIError(exc.message, 404 if exc.code == Code.NOT_FOUND else 400) from exc
    rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
    created = int(time.time())
    kind = "chat.completion" if chat else "text_completion"

    def choice(piece: str | None, finish: str | None) -> dict[str, Any]:
        if chat:
            delta: dict[str, Any] = {} if piece is None else {"content": piece}
            return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        return {"index": 0, "text": piece or "", "logprobs": None, "finish_reason": finish}

    def chunk(choices: list[dict[str, Any]], usage: dict[str, int] | None = None) -> bytes:
        obj: dict[str, Any] = {
            "id": rid,
            "object": kind + ".chunk" if chat else kind,
            "created": created,
            "model": name,
            "choices": choices,
        }
        if usage is not None:
            obj["usage"] = usage
        return _event(obj)

    pieces = [_text_of(first)]
    finish = "length"
    if not stream_wanted:
        error: ServerError | None = None
        if not first.final:
            try:
                async for response in stream:
                    pieces.append(_text_of(response))
            except ServerError as exc:
                error = exc
        if error is not None:
            raise OpenAIError(error.message, 500)
        finish = "length" if len(pieces) >= max_tokens else "stop"
        usage = _usage(prompt_tokens, len(pieces))
        message: dict[str, Any]
        if chat:
            message = {
                "index": 0,
                "message": {"role": "assistant", "content": "".join(pieces)},
                "logprobs": None,
                "finish_reason": finish,
            }
        else:
            message = {
                "index": 0,
                "text": "".join(pieces),
                "logprobs": None,
                "finish_reason": finish,
            }
        return web.json_response(
            {
                "id": rid,
                "object": kind,
                "created": created,
                "model": name,
                "choices": [message],
                "usage": usage,
            }
        )
    reply = web.StreamResponse(headers=_SSE_HEADERS)
    await reply.prepare(http)
    if chat:
        await reply.write(
            chunk(
                [
                    {
                        "index": 0,
                        "delta": {"role": "assistant", "content": ""},
                        "logprobs": None,
                        "finish_reason": None,
                    }
                ]
            )
        )
    done = first.final
    await reply.write(chunk([choice(pieces[0], _finish(done, 1, max_tokens))]))
    try:
        async for response in stream:
            pieces.append(_text_of(response))
            await reply.write(
                chunk([choice(pieces[-1], _finish(response.final, len(pieces), max_tokens))])
            )
    except ServerError as exc:
        await reply.write(
            _event(
                {
                    "error": {
                        "message": exc.message,
                        "type": "InternalServerError",
                        "param": None,
                        "code": 500,
                    }
                }
            )
        )
    if include_usage:
        await reply.write(chunk([], _usage(prompt_tokens, len(pieces))))
    await reply.write(b"data: [DONE]\n\n")
    await reply.write_eof()
    return reply


def _finish(final: bool, count: int, max_tokens: int) -> str | None:
    if not final:
        return None
    return "length" if count >= max_tokens else "stop"


def _usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }
