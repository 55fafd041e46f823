"""Streaming clients of generative models: one request, a stream of tokens, each one timed.

One client per protocol, behind :class:`StreamClient` (``stream`` fills a
:class:`~analyzer.measure.tokens.StreamRecord` as the tokens arrive, and raises
:class:`~analyzer.load.prepared.InferError` when the stream failed, after recording the tokens
that came):

* ``grpc-stream``: Triton's gRPC ``ModelStreamInfer`` on a decoupled model with the interface of
  Triton's vLLM backend (``text_input``, ``stream``, ``sampling_parameters``,
  ``exclude_input_in_output``; output ``text_output``). One bidirectional stream per request;
  each response with text is a token, the one flagged ``triton_final_response`` ends it (the
  request asks for an empty final response, so the end is never guessed). An error response
  or a stream that ends without the final flag is a failed request.
* ``generate-stream``: Triton's generate extension, ``POST /v2/models/{m}/generate_stream``,
  answered with Server-Sent Events, each a JSON object with ``text_output``; an ``error`` event,
  or a connection cut mid-stream, is a failed request.
* ``openai`` / ``openai-chat``: ``POST /v1/completions`` (the prompt as token ids: exact input
  lengths without a tokenizer) / ``/v1/chat/completions`` (a prompt of N words: the reference
  engine counts words as tokens; a real tokenizer makes the count approximate), ``stream: true``
  with ``stream_options.include_usage`` (the server's token count wins over the chunks counted)
  and vLLM's ``ignore_eos``/``min_tokens`` so each request generates exactly its output length.
  A stream that ends before ``data: [DONE]`` is a failed request.

Each non-empty chunk counts as one token (the engines stream one token a chunk); the server's
usage count, when given, corrects the total. HTTP streams use ``http.client`` on gevent's
sockets: one keep-alive connection per request in flight, reused.
"""

from __future__ import annotations

import analyzer.load._gevent  # noqa: F401  (isort: skip) patch first
import http.client
import json
import ssl
import struct
import time
from collections.abc import Iterator
from typing import Any, Protocol

import gevent
import gevent.event
import grpc
from tritonclient.grpc import service_pb2, service_pb2_grpc

from analyzer.config.access import PLAIN, ServerAccess
from analyzer.config.sections import STREAM_PROTOCOLS as STREAM_PROTOCOLS  # (re-exported)
from analyzer.errors import InputError
from analyzer.load.prepared import InferError, _split_url
from analyzer.measure.lengths import GenRequest, prompt_ids, prompt_words
from analyzer.measure.tokens import StreamRecord

#: A stream that sends nothing for this long has failed.
STREAM_TIMEOUT_S = 300.0


class StreamClient(Protocol):
    """Sends one generative request and times its tokens."""

    def stream(self, request: GenRequest, salt: int, record: StreamRecord) -> None:
        """Send ``request`` (its prompt made from ``salt`` unless it has its own), fill
        ``record`` (chunks, usage, end); raise ``InferError`` when the stream failed."""
        ...

    def close(self) -> None:
        """Release connections."""
        ...


def sampling(request: GenRequest) -> dict[str, Any]:
    """The output length as vLLM takes it: exactly ``output_tokens`` (no early end of sequence)."""
    n = request.output_tokens
    return {"max_tokens": n, "min_tokens": n, "ignore_eos": True}


def _text(request: GenRequest, salt: int) -> str:
    return (
        request.prompt if request.prompt is not None else prompt_words(request.input_tokens, salt)
    )


def make_stream_client(
    protocol: str,
    url: str,
    model: str,
    access: ServerAccess = PLAIN,
    tls: bool = False,
) -> StreamClient:
    """The client of ``protocol`` (one of :data:`STREAM_PROTOCOLS`) for ``model`` at ``url``."""
    if protocol == "grpc-stream":
        return GrpcStreamClient(url, model, access)
    if protocol in ("generate-stream", "openai", "openai-chat"):
        return SseClient(protocol, url, model, access, tls)
    raise InputError(
        f"unknown streaming protocol {protocol!r}; one of {', '.join(STREAM_PROTOCOLS)}"
    )


# ---- Triton gRPC ModelStreamInfer ----------------------------------------------------------------


def _bytes_tensor(value: bytes) -> bytes:
    """One BYTES element as Triton's raw contents carry it: a 4-byte length, then the bytes."""
    return struct.pack("<I", len(value)) + value


def stream_infer_request(model: str, prompt: str, request: GenRequest, rid: str) -> Any:
    """The ``ModelInferRequest`` of one generative request (vLLM backend's inputs)."""
    req = service_pb2.ModelInferRequest(model_name=model, id=rid)
    raw = []
    for name, datatype, data in (
        ("text_input", "BYTES", _bytes_tensor(prompt.encode())),
        ("stream", "BOOL", b"\x01"),
        ("sampling_parameters", "BYTES", _bytes_tensor(json.dumps(sampling(request)).encode())),
        ("exclude_input_in_output", "BOOL", b"\x01"),
    ):
        tensor = req.inputs.add()
        tensor.name, tensor.datatype = name, datatype
        tensor.shape.append(1)
        raw.append(data)
    req.raw_input_contents.extend(raw)
    req.parameters["triton_enable_empty_final_response"].bool_param = True
    # The same sampling parameters as request parameters, as the generate extension passes
    # its "parameters" (the vLLM backend reads both).
    for key, value in sampling(request).items():
        if isinstance(value, bool):
            req.parameters[key].bool_param = value
        else:
            req.parameters[key].int64_param = value
    return req


def _response_text(response: Any) -> str:
    """``text_output`` of one ``ModelInferResponse`` ("" when it has none)."""
    for index, output in enumerate(response.outputs):
        if output.name != "text_output":
            continue
        if index < len(response.raw_output_contents):
            raw = response.raw_output_contents[index]
            parts, at = [], 0
            while at + 4 <= len(raw):
                (n,) = struct.unpack_from("<I", raw, at)
                parts.append(raw[at + 4 : at + 4 + n].decode(errors="replace"))
                at += 4 + n
            return "".join(parts)
        return "".join(v.decode(errors="replace") for v in output.contents.bytes_contents)
    return ""


class GrpcStreamClient:
    """Triton's ``ModelStreamInfer``: one bidirectional stream per request, one channel."""

    def __init__(self, url: str, model: str, access: ServerAccess = PLAIN) -> None:
        self.model = model
        target = url.split("://", 1)[-1]
        if access.grpc_tls:
            creds = grpc.ssl_channel_credentials(
                _read(access.ssl_ca),
                _read(access.ssl_key or access.ssl_cert),
                _read(access.ssl_cert),
            )
            self._channel = grpc.secure_channel(target, creds)
        else:
            self._channel = grpc.insecure_channel(target)
        self._stub = service_pb2_grpc.GRPCInferenceServiceStub(self._channel)
        self._metadata = tuple(access.grpc_metadata().items()) or None
        self._next_id = 0

    def stream(self, request: GenRequest, salt: int, record: StreamRecord) -> None:
        self._next_id += 1
        req = stream_infer_request(self.model, _text(request, salt), request, str(self._next_id))
        finished = gevent.event.Event()

        def requests() -> Iterator[Any]:
            yield req
            # Keep the client's side open until the final response: a half-closed stream
            # may be ended by the server before its responses are all sent.
            finished.wait(STREAM_TIMEOUT_S)

        record.sent = time.perf_counter()
        error: str | None = None
        final = False
        call = self._stub.ModelStreamInfer(
            requests(), metadata=self._metadata, timeout=STREAM_TIMEOUT_S
        )
        try:
            for message in call:
                now = time.perf_counter()
                if message.error_message:
                    error = message.error_message
                    break
                response = message.infer_response
                if _response_text(response):
                    record.token(now)
                param = response.parameters.get("triton_final_response")
                if param is not None and param.bool_param:
                    final = True
                    break
        except grpc.RpcError as exc:
            code = exc.code().name if hasattr(exc, "code") else "UNKNOWN"
            details = exc.details() if hasattr(exc, "details") else str(exc)
            error = f"gRPC {code}: {details}"
        finally:
            finished.set()
            call.cancel()
            record.end = time.perf_counter()
        if error is None and not final:
            error = "stream closed before its final response"
        if error is not None:
            record.failed = True
            raise InferError(error)

    def close(self) -> None:
        self._channel.close()


def _read(path: str | None) -> bytes | None:
    if not path:
        return None
    with open(path, "rb") as f:
        return f.read()


# ---- Server-Sent Events: Triton's generate_stream, OpenAI's completions ---------------------------


class SseClient:
    """``generate_stream`` and the OpenAI-compatible endpoints over HTTP/1.1 with SSE."""

    def __init__(
        self,
        protocol: str,
        url: str,
        model: str,
        access: ServerAccess = PLAIN,
        tls: bool = False,
    ) -> None:
        self.protocol = protocol
        self.model = model
        self.host, self.port = _split_url(url)
        self.tls = tls or url.startswith("https://")
        self._context: ssl.SSLContext | None = access.ssl_context() if self.tls else None
        self._headers = {
            "Content-Type": "application/json",
            "Accept": "text/event-stream",
            **access.http_headers(),
        }
        self._idle: list[http.client.HTTPConnection] = []
        self.path = {
            "generate-stream": f"/v2/models/{model}/generate_stream",
            "openai": "/v1/completions",
            "openai-chat": "/v1/chat/completions",
        }[protocol]

    def body(self, request: GenRequest, salt: int) -> dict[str, Any]:
        """The JSON body of ``request`` in this protocol."""
        if self.protocol == "generate-stream":
            return {
                "text_input": _text(request, salt),
                "parameters": {"stream": True, **sampling(request)},
            }
        common = {
            "model": self.model,
            "stream": True,
            "stream_options": {"include_usage": True},
            **sampling(request),
        }
        if self.protocol == "openai":
            prompt: Any = (
                request.prompt
                if request.prompt is not None
                else prompt_ids(request.input_tokens, salt)
            )
            return {**common, "prompt": prompt}
        return {**common, "messages": [{"role": "user", "content": _text(request, salt)}]}

    def _connection(self) -> http.client.HTTPConnection:
        if self._idle:
            return self._idle.pop()
        if self._context is not None:
            return http.client.HTTPSConnection(
                self.host, self.port, timeout=STREAM_TIMEOUT_S, context=self._context
            )
        return http.client.HTTPConnection(self.host, self.port, timeout=STREAM_TIMEOUT_S)

    def stream(self, request: GenRequest, salt: int, record: StreamRecord) -> None:
        payload = json.dumps(self.body(request, salt)).encode()
        conn = self._connection()
        reusable = False
        record.sent = time.perf_counter()
        try:
            try:
                conn.request("POST", self.path, payload, self._headers)
                response = conn.getresponse()
            except (OSError, http.client.HTTPException) as exc:
                record.failed = True
                raise InferError(f"{type(exc).__name__}: {exc}") from None
            if response.status != 200:
                text = response.read()[:200].decode(errors="replace")
                record.failed = True
                reusable = not response.will_close
                raise InferError(f"HTTP {response.status}: {text}")
            error, done = self._read_events(response, record)
            reusable = done and not response.will_close
            if error is not None:
                record.failed = True
                raise InferError(error)
        finally:
            record.end = time.perf_counter()
            if reusable:
                self._idle.append(conn)
            else:
                conn.close()

    def _read_events(
        self, response: http.client.HTTPResponse, record: StreamRecord
    ) -> tuple[str | None, bool]:
        """Read the events to the stream's end: (the error, None when it succeeded; whether
        the response was read to its end)."""
        openai = self.protocol != "generate-stream"
        data: list[str] = []
        try:
            while True:
                line = response.readline()
                if not line:  # the end of the body, or of the connection
                    # readline hides a connection cut mid-body (its peek swallows the
                    # IncompleteRead); read() raises it.
                    response.read()
                    if data:
                        error = self._event("\n".join(data), record)
                        if error is not None:
                            return error, True
                    if openai:
                        return "stream closed before data: [DONE]", False
                    return None, True
                text = line.decode(errors="replace").rstrip("\r\n")
                if text.startswith("data:"):
                    data.append(text[5:].lstrip(" "))
                    continue
                if text or not data:
                    continue  # a comment, an event name, or a blank line between events
                event, data = "\n".join(data), []
                if openai and event.strip() == "[DONE]":
                    response.read()  # the rest of the body (the chunked terminator)
                    return None, True
                error = self._event(event, record)
                if error is not None:
                    response.read()
                    return error, True
        except (OSError, http.client.HTTPException) as exc:
            return f"stream closed early ({type(exc).__name__})", False

    def _event(self, event: str, record: StreamRecord) -> str | None:
        """One event's tokens into ``record``; its error, if it is one."""
        now = time.perf_counter()
        try:
            message = json.loads(event)
        except json.JSONDecodeError:
            return f"not JSON in the stream: {event[:80]!r}"
        if not isinstance(message, dict):
            return f"unexpected event in the stream: {event[:80]!r}"
        if "error" in message:
            error = message["error"]
            text = error.get("message", error) if isinstance(error, dict) else error
            return f"server error in the stream: {str(text)[:120]}"
        if self.protocol == "generate-stream":
            if message.get("text_output"):
                record.token(now)
            return None
        usage = message.get("usage")
        if isinstance(usage, dict) and usage.get("completion_tokens") is not None:
            record.usage_tokens = int(usage["completion_tokens"])
        for choice in message.get("choices") or ():
            if self.protocol == "openai":
                text = choice.get("text")
            else:
                text = (choice.get("delta") or {}).get("content")
            if text:
                record.token(now)
        return None

    def close(self) -> None:
        for conn in self._idle:
            conn.close()
        self._idle.clear()


def check_streaming_model(model_config: Any, model: str, protocol: str) -> None:
    """A Triton model measured for TTFT must be decoupled (``model_transaction_policy {
    decoupled: true }``): a model that answers once has no first token to time.

    Raises:
        InputError: the model is not decoupled.
    """
    policy = model_config.get("model_transaction_policy") or {}
    if not policy.get("decoupled"):
        raise InputError(
            f"model {model!r} is not decoupled: it answers each request once, so --protocol "
            f"{protocol} has no tokens to time (TTFT, ITL). Measure it with --protocol http or "
            "grpc, or serve it decoupled (model_transaction_policy { decoupled: true })"
        )
