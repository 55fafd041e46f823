"""KServe v2 HTTP/REST frontend on aiohttp's low-level server (triton_spec §5, §2.6, §7).

Routing is a split of the raw path and a few dict lookups instead of a regex router, because
this handler sits on every inference request (the overhead perfsweep measures is the server's
own). Bodies are parsed and rendered by :mod:`reference_server.frontends.http_codec`; this module owns the
socket-facing parts: reading bodies under a size limit, compression, status codes, and turning
every failure into a ``{"error": ...}`` reply so that no exception reaches aiohttp.

A client that disconnects while its request waits cancels the handler (aiohttp's
``handler_cancellation``); the frontend then marks the core request cancelled so the batcher
drops it (counted as a CANCELED failure, §3.8).

Hostile or broken clients: requests aiohttp cannot parse (over-long URL or header line, bad
Content-Length, not HTTP) are answered 400 with a JSON ``error`` and logged at WARNING in one
line (aiohttp itself logs them at ERROR with a traceback); a body that sends no byte for
``read_timeout_s`` is answered 408 and its connection closed (Triton has no such timeout).

With ``--http-restricted-api``, a request to a restricted group without its header is answered
403 before it is routed (:mod:`reference_server.frontends.restricted`); the path-to-group lookup
runs only when something is restricted.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import gzip
import logging
import zlib
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

from aiohttp import web
from aiohttp.http_exceptions import LineTooLong
from aiohttp.web_protocol import RequestHandler

from reference_server.core.errors import Code, DecoupledRefusal, ServerError
from reference_server.frontends import generate, http_codec
from reference_server.frontends.restricted import (
    Restrictions,
    http_allows,
    http_group,
    http_refusal,
)

if TYPE_CHECKING:
    from reference_server.core.server import InferenceServer
    from reference_server.core.types import InferRequest

logger = logging.getLogger(__name__)

#: Default ``--http-max-input-size``: 64 MiB, Triton's default.
DEFAULT_MAX_INPUT_SIZE = 2**26

#: Default ``--http-read-timeout``: seconds a request body may go without sending a byte.
#: Triton waits forever; a real client never pauses this long inside one body.
DEFAULT_READ_TIMEOUT_S = 60.0

#: Triton's metrics content type (prometheus-cpp), not prometheus_client's versioned one.
METRICS_CONTENT_TYPE = "text/plain; charset=utf-8"

_JSON = "application/json"
_ACCEPTED_ENCODINGS = frozenset({"gzip", "deflate", "identity"})

Handler = Callable[[web.BaseRequest, tuple[str, ...]], Awaitable[web.StreamResponse]]


class HttpFrontend:
    """Serves one :class:`~reference_server.core.server.InferenceServer` over KServe v2 HTTP/REST.

    Args:
        core: The server facade; every call into it either returns or raises ``ServerError``.
        max_input_size: Largest JSON header, JSON-only body or raw-binary body accepted, in
            bytes (``--http-max-input-size``). Binary tensors after a JSON header may add up to
            ``http_codec.MAX_BINARY_SIZE`` more.
        read_timeout_s: Longest pause inside a request body, in seconds
            (``--http-read-timeout``); a body that stalls longer is answered 408.
        restrictions: ``--http-restricted-api``: the groups refused without their header.
    """

    def __init__(
        self,
        core: InferenceServer,
        *,
        max_input_size: int = DEFAULT_MAX_INPUT_SIZE,
        read_timeout_s: float = DEFAULT_READ_TIMEOUT_S,
        restrictions: Restrictions | None = None,
    ) -> None:
        self._core = core
        self._max_input_size = max_input_size
        self._read_timeout_s = read_timeout_s
        # None when nothing is restricted: the check costs one comparison per request.
        self._restrictions = restrictions or None
        self._runner: web.ServerRunner | None = None
        # Routes keyed by the path's fixed words; model routes are decided in _models().
        self._model_actions: dict[str, tuple[str, Handler]] = {
            "": ("GET", self._model_metadata),
            "ready": ("GET", self._model_ready),
            "config": ("GET", self._model_config),
            "infer": ("POST", self._infer),
            "stats": ("GET", self._model_stats),
            "generate": ("POST", self._generate),
            "generate_stream": ("POST", self._generate_stream),
        }
        # The OpenAI-compatible API (for generative models) and vLLM's health route.
        self._openai: dict[str, tuple[str, Handler]] = {
            "/v1/models": ("GET", self._openai_models),
            "/v1/completions": ("POST", self._openai_completions),
            "/v1/chat/completions": ("POST", self._openai_chat),
            "/health": ("GET", self._health),
        }

    # -- lifecycle ----------------------------------------------------------------------------

    async def start(self, host: str, port: int) -> int:
        """Listen on ``host:port`` (0 = a free port) and return the bound port.

        Raises:
            OSError: The address cannot be bound (typically: the port is in use).
        """
        # auto_decompress off: _read_body inflates, bounded, and refuses other encodings first.
        server = _Server(
            self.handle, handler_cancellation=True, access_log=None, auto_decompress=False
        )
        self._runner, bound = await _listen(server, host, port)
        return bound

    async def stop(self) -> None:
        """Stop listening and close open connections."""
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    # -- dispatch -----------------------------------------------------------------------------

    async def handle(self, request: web.BaseRequest) -> web.StreamResponse:
        """aiohttp entry point: route, run, and map every failure to Triton's error reply."""
        try:
            if self._restrictions is not None:
                restriction = self._restrictions.get(http_group(request.raw_path.split("?", 1)[0]))
                if restriction is not None and not http_allows(restriction, request.headers):
                    return _error(403, http_refusal(restriction))
            method, handler, args = self._route(request.raw_path)
            if method != request.method:
                return _error(405, "Method Not Allowed")
            return await handler(request, args)
        except _BodyTimeout as exc:
            logger.warning("%s %s: %s", request.remote, _short(request.path), exc.message)
            response = _error(408, exc.message)
            response.force_close()  # the rest of the body may still come: drop the connection
            return response
        except ServerError as exc:
            return _error(exc.code.http_status, exc.message)
        except asyncio.CancelledError:
            raise
        except RecursionError:
            # json.loads on deeply nested input ("[[[[..."); Triton crashes on 10 MB of "[".
            return _error(
                400,
                "failed to parse the request JSON buffer: the JSON is nested too deeply",
            )
        except Exception:  # a bug must not take the server or the connection down
            logger.exception("unhandled error serving %s %s", request.method, request.path)
            # Nothing of the exception goes to the client (it may name files or internals).
            return _error(500, "internal server error; the reference server's log has details")

    def _route(self, raw_path: str) -> tuple[str, Handler, tuple[str, ...]]:
        """``(allowed method, handler, handler args)`` for a path; raises 404 if none."""
        path = raw_path.split("?", 1)[0]
        parts = path.split("/")
        # parts[0] is "" (leading slash); everything lives under /v2 but the OpenAI routes.
        if len(parts) < 2 or parts[0] or parts[1] != "v2":
            route = self._openai.get(path.rstrip("/"))
            if route is not None:
                return route[0], route[1], ()
            raise _not_found()
        rest = parts[2:]
        if not rest:
            return "GET", self._server_metadata, ()
        head = rest[0]
        if head == "health" and len(rest) == 2:
            if rest[1] == "live":
                return "GET", self._live, ()
            if rest[1] == "ready":
                return "GET", self._ready, ()
        elif head == "models":
            return self._models(rest[1:])
        elif head == "repository":
            return self._repository(rest[1:])
        elif head in ("systemsharedmemory", "cudasharedmemory"):
            return self._shared_memory(head == "cudasharedmemory", rest[1:])
        raise _not_found()

    def _models(self, rest: list[str]) -> tuple[str, Handler, tuple[str, ...]]:
        if rest == ["stats"]:
            # Checked before model routes, as Triton does: a model named "stats" has no
            # metadata URL.
            return "GET", self._all_stats, ()
        if not rest or not rest[0]:
            raise _not_found()
        name = unquote(rest[0])
        version = ""
        tail = rest[1:]
        if tail[:1] == ["versions"]:
            if len(tail) < 2 or not tail[1].isdigit() or not tail[1].isascii():
                raise _not_found()
            version = tail[1]
            tail = tail[2:]
        if len(tail) > 1:
            raise _not_found()
        action = self._model_actions.get(tail[0] if tail else "")
        if action is None:
            raise _not_found()
        return action[0], action[1], (name, version)

    def _repository(self, rest: list[str]) -> tuple[str, Handler, tuple[str, ...]]:
        # /v2/repository[/<repo>]/index and /v2/repository[/<repo>]/models/<m>/(load|unload)
        if rest == ["index"] or (len(rest) == 2 and rest[1] == "index"):
            return "POST", self._repository_index, ()
        named_repo = len(rest) == 4
        if named_repo:
            rest = rest[1:]
        if len(rest) == 3 and rest[0] == "models" and rest[1] and rest[2] in ("load", "unload"):
            handler = self._load if rest[2] == "load" else self._unload
            if named_repo:
                return "POST", self._repository_named, ()
            return "POST", handler, (unquote(rest[1]),)
        raise _not_found()

    def _shared_memory(self, cuda: bool, rest: list[str]) -> tuple[str, Handler, tuple[str, ...]]:
        # /v2/{system,cuda}sharedmemory[/region/<r>]/(status|register|unregister)
        region = ""
        if len(rest) == 3 and rest[0] == "region" and rest[1]:
            region = unquote(rest[1])
            rest = rest[2:]
        if len(rest) == 1:
            action = rest[0]
            if action == "status":
                return "GET", self._cuda_shm_status if cuda else self._shm_status, (region,)
            if action == "register":
                handler = self._cuda_shm_register if cuda else self._shm_register
                return "POST", handler, (region,)
            if action == "unregister":
                handler = self._cuda_shm_unregister if cuda else self._shm_unregister
                return "POST", handler, (region,)
        raise _not_found()

    # -- shared-memory extensions -------------------------------------------------------------

    async def _shm_status(
        self, request: web.BaseRequest, args: tuple[str, ...]
    ) -> web.StreamResponse:
        return _json([region.to_json() for region in self._core.shared_memory.status(args[0])])

    async def _shm_register(
        self, request: web.BaseRequest, args: tuple[str, ...]
    ) -> web.StreamResponse:
        if not args[0]:
            raise ServerError(
                "'region name' is necessary to register system shared memory region",
                Code.INVALID_ARG,
            )
        body = await self._read_register_body(request)
        key, offset, byte_size = http_codec.parse_shm_register(body)
        self._core.shared_memory.register(args[0], key, offset, byte_size)
        return web.Response(content_type=_JSON)

    async def _shm_unregister(
        self, request: web.BaseRequest, args: tuple[str, ...]
    ) -> web.StreamResponse:
        self._core.shared_memory.unregister(args[0])
        return web.Response(content_type=_JSON)

    async def _cuda_shm_status(
        self, request: web.BaseRequest, args: tuple[str, ...]
    ) -> web.StreamResponse:
        return _json([region.to_json() for region in self._core.shared_memory.cuda_status(args[0])])

    async def _cuda_shm_register(
        self, request: web.BaseRequest, args: tuple[str, ...]
    ) -> web.StreamResponse:
        if not args[0]:
            raise ServerError(
                "'region name' is necessary to register cuda shared memory region",
                Code.INVALID_ARG,
            )
        http_codec.parse_cuda_shm_register(await self._read_register_body(request))
        self._core.shared_memory.cuda_register(args[0])
        raise AssertionError("cuda_register always raises")  # pragma: no cover

    async def _cuda_shm_unregister(
        self, request: web.BaseRequest, args: tuple[str, ...]
    ) -> web.StreamResponse:
        # No CUDA region is ever registered; Triton answers OK for any name.
        return web.Response(content_type=_JSON)

    async def _read_register_body(self, request: web.BaseRequest) -> Any:
        body = await self._read_body(request, self._max_input_size)
        if not body.strip():
            raise ServerError(
                "failed to parse the request JSON buffer: The document is empty. at 0",
                Code.INTERNAL,
            )
        return http_codec.parse_json(body)

    # -- health and metadata ------------------------------------------------------------------

    async def _live(self, request: web.BaseRequest, args: tuple[str, ...]) -> web.StreamResponse:
        if self._core.is_live():
            return web.Response()
        return _error(503, "Server exiting")

    async def _ready(self, request: web.BaseRequest, args: tuple[str, ...]) -> web.StreamResponse:
        # Triton answers "not ready" with 400 and an empty body (spec §12.11).
        return web.Response(status=200 if self._core.is_ready() else 400)

    async def _server_metadata(
        self, request: web.BaseRequest, args: tuple[str, ...]
    ) -> web.StreamResponse:
        return _json(self._core.server_metadata())

    async def _model_metadata(
        self, request: web.BaseRequest, args: tuple[str, ...]
    ) -> web.StreamResponse:
        return _json(self._core.model_metadata(*args))

    async def _model_ready(
        self, request: web.BaseRequest, args: tuple[str, ...]
    ) -> web.StreamResponse:
        if self._core.model_ready(*args):
            return web.Response()
        return _error(400, "Model version not ready")

    async def _model_config(
        self, request: web.BaseRequest, args: tuple[str, ...]
    ) -> web.StreamResponse:
        from reference_server.core.config import config_to_json

        return _json(config_to_json(self._core.model_config(*args)))

    async def _model_stats(
        self, request: web.BaseRequest, args: tuple[str, ...]
    ) -> web.StreamResponse:
        return _json(self._core.model_statistics(*args))

    async def _all_stats(
        self, request: web.BaseRequest, args: tuple[str, ...]
    ) -> web.StreamResponse:
        return _json(self._core.model_statistics())

    # -- repository extension -----------------------------------------------------------------

    async def _repository_index(
        self, request: web.BaseRequest, args: tuple[str, ...]
    ) -> web.StreamResponse:
        body = await self._read_json_object(request)
        ready = body.get("ready", False)
        if not isinstance(ready, bool):
            raise ServerError("Invalid value for 'ready': expected a boolean", Code.INVALID_ARG)
        return _json(self._core.repository_index(ready_only=ready))

    async def _load(self, request: web.BaseRequest, args: tuple[str, ...]) -> web.StreamResponse:
        body = await self._read_json_object(request)
        parameters = body.get("parameters")
        if parameters is None:
            parameters = {}
        if not isinstance(parameters, dict):  # Triton's wording (2.51, checked)
            raise ServerError("attempt to get members for non-object", Code.INTERNAL)
        config: str | None = None
        files: dict[str, bytes] = {}
        for key, value in parameters.items():
            # Triton fails to build a parameter of any other name or type with this INTERNAL
            # message (spec §2.6); keep it so clients see the same error.
            if not (key == "config" or key.startswith("file:")):
                raise ServerError("unexpected error on creating Triton parameter", Code.INTERNAL)
            if not isinstance(value, str):
                raise ServerError("attempt to access JSON non-string as string", Code.INTERNAL)
            if key == "config":
                config = value
            else:
                try:
                    files[key] = base64.b64decode(value, validate=True)
                except (binascii.Error, ValueError):
                    raise ServerError(
                        f"failed to decode base64 content of '{key}'", Code.INVALID_ARG
                    ) from None
        # Loading builds models (seconds for ONNX); keep the event loop serving meanwhile.
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, self._core.load_model, args[0], config, files or None)
        return web.Response(content_type=_JSON)  # empty, but typed as Triton does

    async def _unload(self, request: web.BaseRequest, args: tuple[str, ...]) -> web.StreamResponse:
        body = await self._read_json_object(request)
        parameters = body.get("parameters") or {}
        if not isinstance(parameters, dict):
            raise ServerError("Unable to parse 'parameters'", Code.INTERNAL)
        # Triton ignores an unload_dependents that is not a boolean; so does this server.
        dependents = parameters.get("unload_dependents") is True
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, self._core.unload_model, args[0], dependents)
        return web.Response(content_type=_JSON)

    async def _repository_named(
        self, request: web.BaseRequest, args: tuple[str, ...]
    ) -> web.StreamResponse:
        raise ServerError("'repository_name' specification is not supported", Code.UNSUPPORTED)

    # -- inference ----------------------------------------------------------------------------

    async def _infer(self, request: web.BaseRequest, args: tuple[str, ...]) -> web.StreamResponse:
        name, version = args
        try:
            infer_request = await self._parse_infer(request, name, version)
        except ServerError:
            # Triton looks the model up before it reads the body: an unknown model is a 404
            # whatever the body. Done only on failure, to keep the lookup off the fast path.
            self._core.model_ready(name, version)
            raise
        try:
            response = await self._core.infer(infer_request)
        except asyncio.CancelledError:
            # The client went away (aiohttp cancels the handler): let the batcher drop it.
            infer_request.cancel()
            raise
        except DecoupledRefusal:
            raise ServerError(
                "HTTP end point doesn't support models with decoupled transaction policy",
                Code.UNSUPPORTED,
            ) from None
        parts, json_length = http_codec.render_infer_response(infer_request, response)
        headers = {}
        if json_length is not None:
            headers["Inference-Header-Content-Length"] = str(json_length)
            content_type = "application/octet-stream"
        else:
            content_type = _JSON
        return _compressed(request, parts, content_type, headers)

    async def _generate(
        self, request: web.BaseRequest, args: tuple[str, ...]
    ) -> web.StreamResponse:
        body = await self._read_json_body(request)
        return _json(await generate.generate(self._core, args[0], args[1], body))

    async def _generate_stream(
        self, request: web.BaseRequest, args: tuple[str, ...]
    ) -> web.StreamResponse:
        body = await self._read_json_body(request)
        return await generate.generate_stream(self._core, request, args[0], args[1], body)

    async def _read_json_body(self, request: web.BaseRequest) -> Any:
        return http_codec.parse_json(await self._read_body(request, self._max_input_size))

    async def _health(self, request: web.BaseRequest, args: tuple[str, ...]) -> web.StreamResponse:
        return web.Response(status=200 if self._core.is_ready() else 503)

    async def _openai_models(
        self, request: web.BaseRequest, args: tuple[str, ...]
    ) -> web.StreamResponse:
        return web.json_response(generate.list_models(self._core))

    async def _openai_completions(
        self, request: web.BaseRequest, args: tuple[str, ...]
    ) -> web.StreamResponse:
        return await self._openai_call(request, chat=False)

    async def _openai_chat(
        self, request: web.BaseRequest, args: tuple[str, ...]
    ) -> web.StreamResponse:
        return await self._openai_call(request, chat=True)

    async def _openai_call(self, request: web.BaseRequest, chat: bool) -> web.StreamResponse:
        try:
            try:
                body = await self._read_json_body(request)
            except ServerError as exc:
                raise generate.OpenAIError(exc.message) from exc
            return await generate.completions(self._core, request, body, chat)
        except generate.OpenAIError as exc:
            return exc.response()

    async def _parse_infer(self, request: web.BaseRequest, name: str, version: str) -> InferRequest:
        """The core request for an infer call's headers and body."""
        # A compressed body's Content-Length says nothing about the inflated header length;
        # that case is checked against the inflated body below.
        compressed = "Content-Encoding" in request.headers
        header_length = http_codec.parse_header_length(
            request.headers.get("Inference-Header-Content-Length"),
            None if compressed else request.content_length,
        )
        if header_length is None:
            body = await self._read_body(request, self._max_input_size)
            if not body:
                # Triton 2.51 takes an empty (or unsized) body as a raw one: 400 byte size
                # mismatch (or 404 for an unknown model), not a JSON error.
                return http_codec.parse_raw_request(
                    name, version, body, self._core.model_config(name, version)
                )
            header = http_codec.parse_json(body)
            infer_request = http_codec.parse_infer_request(
                name,
                version,
                header,
                memoryview(b""),
                has_header_length=False,
                shared_memory=self._core.shared_memory,
            )
        elif header_length == 0:
            body = await self._read_body(request, self._max_input_size)
            infer_request = http_codec.parse_raw_request(
                name, version, body, self._core.model_config(name, version)
            )
        else:
            _check_size(header_length, self._max_input_size, "Request JSON")
            body = await self._read_body(request, header_length + http_codec.MAX_BINARY_SIZE)
            if header_length > len(body):
                raise ServerError(
                    f"inference header size should be in range (0, {len(body)}), "
                    f"got: {header_length}",
                    Code.INVALID_ARG,
                )
            view = memoryview(body)
            header = http_codec.parse_json(view[:header_length])
            infer_request = http_codec.parse_infer_request(
                name,
                version,
                header,
                view[header_length:],
                has_header_length=True,
                shared_memory=self._core.shared_memory,
            )
        return infer_request

    # -- bodies -------------------------------------------------------------------------------

    async def _read_body(self, request: web.BaseRequest, limit: int) -> bytes:
        """Read the body, inflating gzip/deflate, refusing more than ``limit`` inflated bytes.

        Inflation happens here rather than in aiohttp's parser so that an unsupported encoding
        is refused before any byte is decoded, and a small compressed bomb is stopped at
        ``limit``.
        """
        encoding = request.headers.get("Content-Encoding")
        inflater = None
        if encoding is not None:
            encoding = encoding.strip().lower()
            if encoding not in _ACCEPTED_ENCODINGS:
                raise _UnsupportedEncoding()
            if encoding != "identity":
                # wbits 32+15: zlib or gzip header, detected automatically.
                inflater = zlib.decompressobj(32 + zlib.MAX_WBITS)
        if inflater is None and request.content_length is not None:
            _check_size(request.content_length, limit, "Request body")
        if request.headers.get("Expect", "").lower() == "100-continue":
            # curl and others wait for this before sending a large body; aiohttp's low-level
            # server (no router) leaves it to the handler.
            await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        chunks: list[bytes] = []
        total = 0
        content = request.content
        loop = asyncio.get_running_loop()
        try:
            # A stall timer, pushed back on every chunk; skipped when the whole body is
            # already buffered (the common case for small requests).
            async with asyncio.timeout(
                None if content.is_eof() else loop.time() + self._read_timeout_s
            ) as timer:
                async for chunk in content.iter_any():
                    if not content.is_eof():
                        timer.reschedule(loop.time() + self._read_timeout_s)
                    if inflater is not None:
                        chunk = inflater.decompress(chunk, limit - total + 1)
                    total += len(chunk)
                    if total > limit:
                        _check_size(total, limit, "Request body")
                    chunks.append(chunk)
        except TimeoutError:
            raise _BodyTimeout(self._read_timeout_s, total) from None
        except (ServerError, asyncio.CancelledError, ConnectionError):
            raise
        except zlib.error as exc:
            raise ServerError(
                f"failed to decompress the request body (Content-Encoding: {encoding}): {exc}",
                Code.INVALID_ARG,
            ) from None
        except Exception as exc:  # truncated chunked body and the like
            reason = getattr(exc, "message", None) or type(exc).__name__
            raise ServerError(
                f"failed to read the request body: {str(reason).splitlines()[0]}",
                Code.INVALID_ARG,
            ) from None
        if inflater is not None and not inflater.eof:
            raise ServerError(
                f"the request body is not a complete {encoding} stream", Code.INVALID_ARG
            )
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    async def _read_json_object(self, request: web.BaseRequest) -> dict[str, Any]:
        """A repository call's body: empty or a JSON object."""
        body = await self._read_body(request, self._max_input_size)
        if not body.strip():
            return {}
        parsed = http_codec.parse_json(body)
        if not isinstance(parsed, dict):
            raise ServerError(
                "failed to parse the request JSON buffer: expected a JSON object", Code.INTERNAL
            )
        return parsed


async def _listen(server: web.Server, host: str, port: int) -> tuple[web.ServerRunner, int]:
    """Bind ``server`` to ``host:port``; returns the runner (for cleanup) and the bound port."""
    runner = web.ServerRunner(server, shutdown_timeout=5.0)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port, reuse_address=True).start()
    except OSError:
        await runner.cleanup()
        raise
    bound: int = runner.addresses[0][1]
    return runner, bound


class _Server(web.Server):
    """aiohttp's low-level server whose connections answer unparsable requests Triton-style."""

    def __call__(self) -> RequestHandler:
        return _RequestHandler(self, loop=self._loop, **self._kwargs)


class _RequestHandler(RequestHandler):
    """Answers requests aiohttp cannot parse with a JSON error; logs one WARNING line.

    aiohttp's own ``handle_error`` logs every malformed request at ERROR with a traceback
    (a hostile client could flood the log) and answers text/plain. A client's mistake is a
    warning; the answer is Triton's ``{"error": ...}`` shape, and the connection is closed.
    """

    def handle_error(
        self,
        request: web.BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        if status >= 500:
            return super().handle_error(request, status, exc, message)
        if isinstance(exc, LineTooLong):
            text = "the request line or a header is too long (more than 8190 bytes)"
        else:  # aiohttp's message: a description, then the offending bytes
            text = _short(str(getattr(exc, "message", None) or message or "").split(":\n")[0])
        logger.warning("bad HTTP request from %s: %s", request.remote, text)
        if request.writer.output_size > 0:
            raise ConnectionError("response already started")
        response = _error(status, f"Bad Request: {text}" if text else "Bad Request")
        response.force_close()
        return response


def _short(text: object, limit: int = 200) -> str:
    """One line of at most ``limit`` characters (client input may be huge or multi-line)."""
    line = " ".join(str(text).split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


class _BodyTimeout(ServerError):
    def __init__(self, timeout_s: float, received: int) -> None:
        super().__init__(
            f"request body timed out: no data for {timeout_s:g} s after {received} bytes "
            "(--http-read-timeout)",
            Code.INVALID_ARG,
        )


class _UnsupportedEncoding(ServerError):
    def __init__(self) -> None:
        super().__init__("Unsupported compression type", Code.UNSUPPORTED)


def _not_found() -> ServerError:
    return ServerError("Not Found", Code.NOT_FOUND)


def _check_size(size: int, limit: int, what: str) -> None:
    if size > limit:
        raise ServerError(
            f"{what} size of {size} bytes exceeds the maximum allowed value of {limit} bytes. "
            "Use --http-max-input-size to increase the limit.",
            Code.INVALID_ARG,
        )


def _json(value: Any) -> web.Response:
    return web.Response(body=http_codec.dumps(value), content_type=_JSON)


def _error(status: int, message: str) -> web.Response:
    response = web.Response(status=status, body=http_codec.error_body(message), content_type=_JSON)
    if status == 501 and message == "Unsupported compression type":
        response.headers["Accept-Encoding"] = "gzip, deflate"
    return response


def _compressed(
    request: web.BaseRequest,
    parts: list[bytes | memoryview],
    content_type: str,
    headers: dict[str, str],
) -> web.Response:
    """The reply body, gzip/deflate-compressed when the client's Accept-Encoding prefers it."""
    body = parts[0] if len(parts) == 1 else b"".join(parts)
    accept = request.headers.get("Accept-Encoding")
    encoding = _preferred_encoding(accept) if accept else None
    if encoding == "gzip":
        body = gzip.compress(body, compresslevel=6, mtime=0)
        headers["Content-Encoding"] = "gzip"
    elif encoding == "deflate":
        body = zlib.compress(body)
        headers["Content-Encoding"] = "deflate"
    return web.Response(body=body, content_type=content_type, headers=headers)


def _preferred_encoding(accept: str) -> str | None:
    """gzip or deflate if the client ranks one of them above identity (q-values honoured)."""
    best: str | None = None
    best_q = 0.0
    for item in accept.split(","):
        token, _, params = item.strip().partition(";")
        token = token.strip().lower()
        if token not in ("gzip", "deflate"):
            continue
        q = 1.0
        params = params.strip()
        if params.startswith("q="):
            try:
                q = float(params[2:])
            except ValueError:
                q = 0.0
        if q > best_q:
            best, best_q = token, q
    return best


class MetricsFrontend:
    """``GET /metrics`` on its own port: Prometheus text rendered from the core's registry.

    Args:
        render: Returns the exposition text, e.g. ``InferenceServer.metrics_text`` (Triton's
            names: counters without the ``_total`` suffix ``prometheus_client`` would add).
    """

    def __init__(self, render: Callable[[], str]) -> None:
        self._render = render
        self._runner: web.ServerRunner | None = None

    async def start(self, host: str, port: int) -> int:
        """Listen on ``host:port`` (0 = a free port) and return the bound port."""
        self._runner, bound = await _listen(web.Server(self.handle, access_log=None), host, port)
        return bound

    async def stop(self) -> None:
        """Stop listening."""
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def handle(self, request: web.BaseRequest) -> web.StreamResponse:
        """Serve ``/metrics`` (and ``/metrics/``, as Triton does); 404 elsewhere."""
        if request.path not in ("/metrics", "/metrics/"):
            return _error(404, "Not Found")
        if request.method != "GET":
            return _error(405, "Method Not Allowed")
        try:
            text = self._render().encode("utf-8")
        except Exception as exc:  # a failing collector must not kill the endpoint
            logger.exception("rendering /metrics failed")
            return _error(500, f"internal server error: {exc}")
        return web.Response(body=text, headers={"Content-Type": METRICS_CONTENT_TYPE})
