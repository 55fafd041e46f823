"""The bad-input corpus: raw HTTP exchanges a broken or hostile client may send.

Every case is bytes on a socket (so nothing between the test and the server "fixes" them),
optionally sent in pieces with pauses (slow clients). :func:`exchange` returns what came back:
the status and body, or ``None`` when the server closed or reset without answering. Cases that
crash the real Triton 2.51 (or would harm its host) name why in ``not_for_triton``.
"""

from __future__ import annotations

import json
import socket
import time
from dataclasses import dataclass, field

#: The model every case talks to: FP32 INPUT0 -> OUTPUT0, dims [16], max_batch_size 8.
MODEL = "identity"
INFER = f"/v2/models/{MODEL}/infer"

#: Text that must never appear in a reply: Python internals and tracebacks.
INTERNALS = ("Traceback", 'File "', "RecursionError", "Exception", "site-packages", '.py"')


@dataclass(frozen=True)
class Case:
    """One exchange.

    Attributes:
        name: Short id (also the key of the Triton differences table).
        pieces: What the client writes, in order; with ``pause_s`` between pieces.
        pause_s: Pause after each piece (slow clients).
        not_for_triton: Why the case is never sent to Triton 2.51 ("" = it is sent): it
            crashes it, or would make it start thousands of processes or write outside its
            scratch directory.
        may_drop: The server may close or reset instead of answering (e.g. a 100 KB header:
            the close after the 400 meets unread bytes and resets the connection).
        reply_timeout_s: How long to wait for the reply.
    """

    name: str
    pieces: tuple[bytes, ...]
    pause_s: float = 0.0
    not_for_triton: str = ""
    may_drop: bool = False
    reply_timeout_s: float = 10.0


@dataclass
class Reply:
    """What the server sent back (``status`` None: nothing, connection closed or timed out)."""

    status: int | None
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""


def request(
    method: str,
    path: str,
    body: bytes = b"",
    headers: dict[str, str] | None = None,
    *,
    content_length: bool = True,
) -> bytes:
    """The bytes of one HTTP/1.1 request (``Connection: close``)."""
    lines = [f"{method} {path} HTTP/1.1", "Host: corpus", "Connection: close"]
    for key, value in (headers or {}).items():
        lines.append(f"{key}: {value}")
    if content_length and "Content-Length" not in (headers or {}):
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def exchange(address: str, case: Case) -> Reply:
    """Send ``case`` to ``host:port`` and read the first reply (bounded by its timeout)."""
    host, port = address.rsplit(":", 1)
    deadline = time.monotonic() + case.reply_timeout_s + case.pause_s * len(case.pieces)
    data = b""
    try:
        with socket.create_connection((host, int(port)), timeout=case.reply_timeout_s) as sock:
            for piece in case.pieces:
                sock.sendall(piece)
                if case.pause_s:
                    time.sleep(case.pause_s)  # the hostile client's pause is the case itself
            while time.monotonic() < deadline:
                sock.settimeout(max(0.05, deadline - time.monotonic()))
                chunk = sock.recv(65536)
                if not chunk:
                    break
                data += chunk
                if _complete(data):
                    break
    except (TimeoutError, ConnectionResetError, BrokenPipeError):
        pass
    return _parse(data)


def _complete(data: bytes) -> bool:
    head, sep, body = data.partition(b"\r\n\r\n")
    if not sep:
        return False
    for line in head.split(b"\r\n")[1:]:
        key, _, value = line.partition(b":")
        if key.strip().lower() == b"content-length":
            return len(body) >= int(value.strip())
    return False


def _parse(data: bytes) -> Reply:
    head, sep, body = data.partition(b"\r\n\r\n")
    if not sep:
        return Reply(None)
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    if len(parts) < 2 or not parts[1].isdigit():
        return Reply(None)
    headers = {}
    for line in lines[1:]:
        key, _, value = line.partition(":")
        headers[key.strip().lower()] = value.strip()
    return Reply(int(parts[1]), headers, body)


def _input(**fields: object) -> dict[str, object]:
    entry: dict[str, object] = {"name": "INPUT0", "shape": [1, 16], "datatype": "FP32"}
    entry.update(fields)
    return entry


def _infer(body: object) -> bytes:
    return request("POST", INFER, json.dumps(body).encode())


def _load(
    name: str, parameters: dict[str, object] | None = None, raw: bytes | None = None
) -> bytes:
    body = raw if raw is not None else json.dumps({"parameters": parameters or {}}).encode()
    return request("POST", f"/v2/repository/models/{name}/load", body)


def _override(backend: str, **changes: object) -> dict[str, object]:
    config: dict[str, object] = {
        "name": MODEL,
        "backend": backend,
        "max_batch_size": 8,
        "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [16]}],
        "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [16]}],
    }
    config.update(changes)
    return {"config": json.dumps(config)}


#: Why a case is not sent to Triton 2.51: it crashed on such input (std::bad_alloc on a huge
#: shape, no answer ever to 10 MB of "[").
CRASH = "crashes Triton"

_GOOD = json.dumps({"inputs": [_input(data=[1.0] * 16)]}).encode()
_HUGE_HEADER = b"a" * 100_000


def build_cases(sentinel_dir: str, backend: str = "identity") -> list[Case]:
    """Every case; ``sentinel_dir`` is the planted model directory's path relative to the
    repository's parent (e.g. ``outside/evil``), which names and overrides try to reach;
    ``backend`` is the served model's (``python`` on Triton)."""
    infer_head = (
        f"POST {INFER} HTTP/1.1\r\nHost: corpus\r\nConnection: close\r\n"
        f"Content-Length: {len(_GOOD)}\r\n\r\n"
    ).encode()
    escape = f"../../{sentinel_dir}"  # from <repository>/<model>/
    cases = [
        # -- malformed JSON
        Case("json-open-brace", (request("POST", INFER, b"{"),)),
        Case("json-open-bracket", (request("POST", INFER, b"["),)),
        Case("json-null", (request("POST", INFER, b"null"),)),
        Case("json-array", (request("POST", INFER, b"[]"),)),
        Case("json-number", (request("POST", INFER, b"1"),)),
        Case("json-string", (request("POST", INFER, b'"inputs"'),)),
        Case("json-not-utf8", (request("POST", INFER, b'{"id":"\xff\xfe"}'),)),
        Case("json-whitespace", (request("POST", INFER, b"   "),)),
        Case("json-truncated", (request("POST", INFER, _GOOD[:-7]),)),
        Case("json-nested-50", (request("POST", INFER, b"[" * 50),)),
        Case("json-nested-10MB", (request("POST", INFER, b"[" * 10_000_000),), not_for_triton=CRASH),
        Case("json-nan", (request("POST", INFER, b'{"inputs":[{"name":"INPUT0","shape":[1,16],"datatype":"FP32","data":[NaN]}]}'),)),
        # -- well-formed JSON, wrong KServe body
        Case("inputs-missing", (_infer({}),)),
        Case("inputs-object", (_infer({"inputs": {"name": "INPUT0"}}),)),
        Case("input-not-object", (_infer({"inputs": [5]}),)),
        Case("name-int", (_infer({"inputs": [_input(name=5, data=[1] * 16)]}),)),
        Case("name-unknown", (_infer({"inputs": [_input(name="NOPE", data=[1] * 16)]}),)),
        Case("shape-string", (_infer({"inputs": [_input(shape=["a"], data=[1])]}),)),
        Case("shape-float", (_infer({"inputs": [_input(shape=[1.5, 16], data=[1] * 16)]}),)),
        Case("shape-negative", (_infer({"inputs": [_input(shape=[-1, 16], data=[1] * 16)]}),)),
        Case("shape-huge", (_infer({"inputs": [_input(shape=[1, 3, 224, 99999999], data=[1])]}),), not_for_triton=CRASH),
        Case("shape-overflow", (_infer({"inputs": [_input(shape=[2**62, 2**62], data=[1])]}),), not_for_triton=CRASH),
        Case("datatype-bogus", (_infer({"inputs": [_input(datatype="FP99", data=[1] * 16)]}),)),
        Case("data-null", (_infer({"inputs": [_input(data=None)]}),)),
        Case("data-ragged", (_infer({"inputs": [_input(data=[[1, 2], [3]])]}),)),
        Case("data-too-short", (_infer({"inputs": [_input(data=[1] * 15)]}),)),
        Case("data-strings", (_infer({"inputs": [_input(data=["x"] * 16)]}),)),
        Case("outputs-unknown", (_infer({"inputs": [_input(data=[1] * 16)], "outputs": [{"name": "NOPE"}]}),)),
        Case("outputs-not-list", (_infer({"inputs": [_input(data=[1] * 16)], "outputs": 7}),)),
        Case("parameters-list", (_infer({"inputs": [_input(data=[1] * 16)], "parameters": []}),)),
        Case("priority-huge", (_infer({"inputs": [_input(data=[1] * 16)], "parameters": {"priority": 2**70}}),)),
        Case("timeout-negative", (_infer({"inputs": [_input(data=[1] * 16)], "parameters": {"timeout": -5}}),)),
        Case("binary-size-lies", (request("POST", INFER, json.dumps({"inputs": [_input(parameters={"binary_data_size": 10**12})]}).encode(), {"Inference-Header-Content-Length": str(len(json.dumps({"inputs": [_input(parameters={"binary_data_size": 10**12})]})))}),)),
        Case("header-length-garbage", (request("POST", INFER, _GOOD, {"Inference-Header-Content-Length": "abc"}),)),
        Case("header-length-huge", (request("POST", INFER, _GOOD, {"Inference-Header-Content-Length": "99999999999999"}),)),
        Case("header-length-negative", (request("POST", INFER, _GOOD, {"Inference-Header-Content-Length": "-4"}),)),
        Case("gzip-garbage", (request("POST", INFER, b"not gzip at all", {"Content-Encoding": "gzip"}),)),
        # -- empty and unsized bodies, unknown models
        Case("body-empty", (request("POST", INFER),)),
        Case("body-unsized", (request("POST", INFER, content_length=False),)),
        Case("body-chunked-empty", (request("POST", INFER, b"0\r\n\r\n", {"Transfer-Encoding": "chunked"}, content_length=False),)),
        Case("unknown-model-malformed", (request("POST", "/v2/models/nope/infer", b"{"),)),
        Case("unknown-model-empty", (request("POST", "/v2/models/nope/infer"),)),
        Case("unknown-version-malformed", (request("POST", f"/v2/models/{MODEL}/versions/9/infer", b"["),)),
        # -- HTTP framing
        Case("content-length-abc", (infer_head.replace(f"Content-Length: {len(_GOOD)}".encode(), b"Content-Length: abc") + _GOOD,)),
        Case("content-length-negative", (infer_head.replace(f"Content-Length: {len(_GOOD)}".encode(), b"Content-Length: -1") + _GOOD,)),
        Case("content-length-twice", (infer_head.replace(b"\r\n\r\n", b"\r\nContent-Length: 3\r\n\r\n") + _GOOD,)),
        Case("content-length-shorter", (request("POST", INFER, _GOOD, {"Content-Length": "20"}),)),
        Case("content-length-longer", (request("POST", INFER, _GOOD, {"Content-Length": str(len(_GOOD) + 50)}),), reply_timeout_s=5.0),
        Case("url-100KB", (b"GET /v2/" + b"a" * 100_000 + b" HTTP/1.1\r\nHost: corpus\r\n\r\n",), may_drop=True),
        Case("header-100KB", (b"GET /v2 HTTP/1.1\r\nHost: corpus\r\nX-Big: " + _HUGE_HEADER + b"\r\n\r\n",), may_drop=True),
        Case("not-http", (b"\x16\x03\x01\x02\x00\x01\x00garbage\r\n\r\n",)),
        Case("bad-method", (b"FOO /v2 HTTP/1.1\r\nHost: corpus\r\n\r\n",)),
        Case("path-not-v2", (request("GET", "/etc/passwd"),)),
        Case("path-dot-dot", (request("GET", "/v2/../../etc/passwd"),)),
        # -- slow clients
        Case("headers-byte-by-byte", tuple(bytes([b]) for b in request("GET", "/v2/health/ready")), pause_s=0.002),
        Case("body-stalls", (infer_head + _GOOD[:10],), reply_timeout_s=5.0),
        Case("body-trickles", (infer_head, *(bytes([b]) for b in _GOOD[:40]), _GOOD[40:]), pause_s=0.01),
        # -- repository API: names and overrides
        Case("load-traversal", (_load(f"..%2F{sentinel_dir.replace('/', '%2F')}"),)),
        Case("load-dot-dot", (_load(".."),)),
        Case("load-dot", (_load("."),)),
        Case("load-absolute", (_load("%2Fetc"),)),
        Case("load-nul", (_load("a%00b"),)),
        Case("load-backslash", (_load("..%5C..%5Cx"),)),
        Case("unload-traversal", (request("POST", f"/v2/repository/models/..%2F{sentinel_dir.replace('/', '%2F')}/unload"),)),
        Case("load-body-bracket", (_load(MODEL, raw=b"["),)),
        Case("load-body-array", (_load(MODEL, raw=b"[]"),)),
        Case("load-parameters-list", (_load(MODEL, raw=b'{"parameters": []}'),)),
        Case("override-not-json", (_load(MODEL, {"config": "{"}),)),
        Case("override-empty", (_load(MODEL, {"config": ""}),)),
        Case("override-null", (_load(MODEL, {"config": "null"}),)),
        Case("override-wrong-type", (_load(MODEL, {"config": '{"max_batch_size": "x"}'}),)),
        Case("override-unknown-field", (_load(MODEL, {"config": '{"colour": 1}'}),)),
        Case("override-name-mismatch", (_load(MODEL, _override(backend, name="other")),)),
        Case("override-preferred-too-big", (_load(MODEL, _override(backend, dynamic_batching={"preferred_batch_size": [64]})),)),
        Case("override-negative-batch", (_load(MODEL, _override(backend, max_batch_size=-1)),)),
        Case("override-instances-10000", (_load(MODEL, _override(backend, instance_group=[{"count": 10000, "kind": "KIND_CPU"}])),), not_for_triton="starts 10,000 Python stub processes"),
        Case("override-label-escape", (_load(MODEL, _override(backend, output=[{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [16], "label_filename": f"{escape}/labels.txt"}])),)),
        Case("override-profile-escape", (_load(MODEL, _override("simulated", parameters={"profile": {"string_value": f"{escape}/profile.toml"}})),)),
        Case("override-files-escape", (_load(MODEL, {**_override(backend, ), "file:../../evil.txt": "eA=="}),), not_for_triton="may write outside its scratch directory"),
        Case("override-unknown-model", (_load("ghost", _override(backend, name="ghost")),)),
        Case("index-body-bracket", (request("POST", "/v2/repository/index", b"["),)),
        Case("index-ready-string", (request("POST", "/v2/repository/index", b'{"ready": "yes"}'),)),
    ]  # fmt: skip
    names = [case.name for case in cases]
    assert len(names) == len(set(names)), "duplicate case names"
    return cases
