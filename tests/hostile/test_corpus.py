"""The bad-input corpus against the reference server (and, where present, the real Triton).

One server for the module (:class:`reference_server.app.ServerThread` on port 0, as in
``tests/server/conftest.py``), with a 1 s body read timeout so that stalled bodies end quickly.
Beside its repository lies a planted model directory (``outside/evil``) that names and config
overrides try to reach. After every case, and between batches, these must hold:

* every error reply carries a status and a JSON ``{"error": "<message>"}``;
* no reply shows Python internals, the planted marker or the server's absolute paths;
* a well-behaved client still gets a correct inference (HTTP and gRPC), checked periodically;
* the planted files are never read (marker never served; atime unchanged where it moves);
* nothing is logged at ERROR (client mistakes are one-line warnings).

Our status for every case is pinned in :data:`EXPECTED`. The ``triton`` test sends the same
cases (except those that crash Triton 2.51 or would harm its host) to the wheel's real Triton and checks that every
difference is the one listed in :data:`DIFFERENCES` (the table in ``docs/concepts/reference-server.md``).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tritonclient.grpc import service_pb2 as pb

from reference_server.app import ServerOptions, ServerThread
from tests.hostile.corpus import CRASH, INFER, INTERNALS, MODEL, Case, Reply, build_cases, exchange
from tests.hostile.planted import Sentinel
from tests.support.real_triton import RealTriton, TritonInstall, identity_model_config
from tests.support.servers import for_reference, write_model

SENTINEL_DIR = "outside/evil"
CASES = build_cases(SENTINEL_DIR)

#: Our status for every case (None: the connection is closed without an answer).
EXPECTED: dict[str, int | None] = {
    "json-open-brace": 500,
    "json-open-bracket": 500,
    "json-null": 500,
    "json-array": 500,
    "json-number": 500,
    "json-string": 500,
    "json-not-utf8": 500,
    "json-whitespace": 500,
    "json-truncated": 500,
    "json-nested-50": 500,
    "json-nested-10MB": 400,
    "json-nan": 500,
    "inputs-missing": 500,
    "inputs-object": 500,
    "input-not-object": 400,
    "name-int": 500,
    "name-unknown": 400,
    "shape-string": 500,
    "shape-float": 500,
    "shape-negative": 500,
    "shape-huge": 500,
    "shape-overflow": 500,
    "datatype-bogus": 400,
    "data-null": 500,
    "data-ragged": 500,
    "data-too-short": 500,
    "data-strings": 500,
    "outputs-unknown": 400,
    "outputs-not-list": 500,
    "parameters-list": 500,
    "priority-huge": 500,
    "timeout-negative": 500,
    "binary-size-lies": 400,
    "header-length-garbage": 400,
    "header-length-huge": 400,
    "header-length-negative": 400,
    "gzip-garbage": 400,
    "body-empty": 400,
    "body-unsized": 400,
    "body-chunked-empty": 400,
    "unknown-model-malformed": 404,
    "unknown-model-empty": 404,
    "unknown-version-malformed": 404,
    "content-length-abc": 400,
    "content-length-negative": 400,
    "content-length-twice": 400,
    "content-length-shorter": 400,
    "content-length-longer": 408,
    "url-100KB": 400,
    "header-100KB": 400,
    "not-http": 400,
    "bad-method": 400,
    "path-not-v2": 404,
    "path-dot-dot": 404,
    "headers-byte-by-byte": 200,
    "body-stalls": 408,
    "body-trickles": 200,
    "load-traversal": 500,
    "load-dot-dot": 500,
    "load-dot": 500,
    "load-absolute": 500,
    "load-nul": 500,
    "load-backslash": 500,
    "unload-traversal": 200,
    "load-body-bracket": 500,
    "load-body-array": 500,
    "load-parameters-list": 500,
    "override-not-json": 500,
    "override-empty": 500,
    "override-null": 500,
    "override-wrong-type": 500,
    "override-unknown-field": 500,
    "override-name-mismatch": 500,
    "override-preferred-too-big": 500,
    "override-negative-batch": 500,
    "override-instances-10000": 400,
    "override-label-escape": 400,
    "override-profile-escape": 400,
    "override-files-escape": 500,
    "override-unknown-model": 500,
    "index-body-bracket": 500,
    "index-ready-string": 400,
}


class Hostile:
    """The module's server, its planted files and a well-behaved client."""

    def __init__(self, server: ServerThread, sentinel: Sentinel, root: Path) -> None:
        self.server = server
        self.sentinel = sentinel
        self.root = root
        self.http = httpclient.InferenceServerClient(server.http_url)
        self.grpc = grpcclient.InferenceServerClient(server.grpc_url)
        self._rng = np.random.default_rng(11)

    def check_serving(self) -> None:
        """A correct inference over HTTP and over gRPC."""
        data = self._rng.standard_normal((1, 16)).astype(np.float32)
        tensor = httpclient.InferInput("INPUT0", [1, 16], "FP32")
        tensor.set_data_from_numpy(data)
        np.testing.assert_array_equal(self.http.infer(MODEL, [tensor]).as_numpy("OUTPUT0"), data)
        gtensor = grpcclient.InferInput("INPUT0", [1, 16], "FP32")
        gtensor.set_data_from_numpy(data)
        np.testing.assert_array_equal(self.grpc.infer(MODEL, [gtensor]).as_numpy("OUTPUT0"), data)
        assert self.http.is_server_ready()

    def check_reply(self, name: str, reply: Reply) -> None:
        """The shape every reply must have (see the module docstring)."""
        text = reply.body.decode("utf-8", errors="replace")
        for secret in (*INTERNALS, self.sentinel.marker, str(self.root)):
            assert secret not in text, (name, secret, text[:300])
        if reply.status is not None and reply.status >= 400:
            assert reply.headers.get("content-type") == "application/json", (name, reply.headers)
            parsed = json.loads(reply.body)
            assert list(parsed) == ["error"], (name, parsed)
            assert isinstance(parsed["error"], str) and parsed["error"], name

    def check_untouched(self) -> None:
        assert self.sentinel.read_files() == [] or not self.sentinel.atime_works(self.root)

    def close(self) -> None:
        self.http.close()
        self.grpc.close()


@pytest.fixture(scope="module")
def hostile(tmp_path_factory: pytest.TempPathFactory, serves: None) -> Iterator[Hostile]:
    root = tmp_path_factory.mktemp("hostile")
    repo = root / "repo"
    write_model(repo, "identity", for_reference(identity_model_config()))
    sentinel = Sentinel(root / "outside")
    # Named as the traversal reads, so that a server joining names onto paths would serve it.
    sentinel.plant_model("evil", "../outside/evil")
    sentinel.arm()
    options = ServerOptions(
        model_repositories=(repo,), models=(MODEL,), device="cpu", read_timeout_s=1.0
    )
    with ServerThread(options) as server:
        state = Hostile(server, sentinel, root)
        state.check_serving()
        yield state
        state.close()


# -- HTTP ---------------------------------------------------------------------------------------


def test_http_corpus(hostile: Hostile, caplog: pytest.LogCaptureFixture) -> None:
    seen: dict[str, int | None] = {}
    with caplog.at_level(logging.WARNING):
        for index, case in enumerate(CASES):
            reply = exchange(hostile.server.http_url, case)
            if reply.status is None:
                assert case.may_drop or EXPECTED.get(case.name, 0) is None, case.name
            hostile.check_reply(case.name, reply)
            seen[case.name] = reply.status
            if index % 10 == 9:
                hostile.check_serving()
    hostile.check_serving()
    hostile.check_untouched()
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert not errors, [r.getMessage()[:200] for r in errors]
    multiline = [r.getMessage() for r in caplog.records if "\n" in r.getMessage()]
    assert not multiline, multiline[:3]
    drops = {name for name, case in ((c.name, c) for c in CASES) if case.may_drop}
    assert {k: v for k, v in seen.items() if k not in drops} == {
        k: v for k, v in EXPECTED.items() if k not in drops
    }


# -- hypothesis-generated KServe v2 bodies --------------------------------------------------------

_json_leaf = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=8)
)
_json_value = st.recursive(
    _json_leaf,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=6), children, max_size=4)
    ),
    max_leaves=12,
)
_datatypes = st.sampled_from(
    ["FP32", "INT32", "BYTES", "BOOL", "FP16", "UINT8", "INT64", "BF16", "FP99", "", "fp32"]
)
_shape = st.lists(st.integers(min_value=-3, max_value=2**40), max_size=4) | _json_value
_tensor = st.fixed_dictionaries(
    {"name": st.sampled_from(["INPUT0", "INPUT1", "", "OUTPUT0"]) | _json_value},
    optional={
        "shape": _shape,
        "datatype": _datatypes | _json_value,
        "data": st.lists(st.floats(allow_nan=False, width=32), max_size=20) | _json_value,
        "parameters": st.dictionaries(
            st.sampled_from(["binary_data_size", "shared_memory_region", "x", "classification"]),
            _json_value,
            max_size=2,
        ),
    },
)
_body = st.fixed_dictionaries(
    {},
    optional={
        "id": st.text(max_size=10) | _json_value,
        "inputs": st.lists(_tensor, max_size=3) | _json_value,
        "outputs": st.lists(
            st.fixed_dictionaries({"name": st.sampled_from(["OUTPUT0", "NOPE"]) | _json_value}),
            max_size=2,
        )
        | _json_value,
        "parameters": st.dictionaries(
            st.sampled_from(["priority", "timeout", "binary_data_output", "triton_x", "custom"]),
            _json_value,
            max_size=3,
        ),
    },
)


@settings(
    max_examples=80,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(body=_body)
def test_generated_kserve_bodies(hostile: Hostile, body: dict[str, object]) -> None:
    from tests.hostile.corpus import request

    reply = exchange(
        hostile.server.http_url,
        Case("generated", (request("POST", INFER, json.dumps(body).encode()),)),
    )
    assert reply.status is not None, body
    assert reply.status in (200, 400, 404, 500), (reply.status, body)
    hostile.check_reply(json.dumps(body)[:200], reply)
    if reply.status == 200:
        assert json.loads(reply.body)["model_name"] == MODEL


def test_still_serving_after_generated_bodies(hostile: Hostile) -> None:
    hostile.check_serving()
    hostile.check_untouched()


# -- gRPC ---------------------------------------------------------------------------------------


def _tensor_msg(**fields: object) -> pb.ModelInferRequest.InferInputTensor:
    values: dict[str, object] = {"name": "INPUT0", "datatype": "FP32", "shape": [1, 16]}
    values.update(fields)
    return pb.ModelInferRequest.InferInputTensor(**values)


def _grpc_cases(sentinel_dir: str, backend: str = "identity") -> dict[str, tuple[str, object]]:
    """name -> (method, request message or raw bytes)."""
    good = pb.InferTensorContents(fp32_contents=[1.0] * 16)
    infer = pb.ModelInferRequest
    return {
        "infer-unknown-model": ("ModelInfer", infer(model_name="nope", inputs=[_tensor_msg(contents=good)])),
        "infer-no-inputs": ("ModelInfer", infer(model_name=MODEL)),
        "infer-shape-negative": ("ModelInfer", infer(model_name=MODEL, inputs=[_tensor_msg(shape=[-1, 16], contents=good)])),
        "infer-shape-huge": ("ModelInfer", infer(model_name=MODEL, inputs=[_tensor_msg(shape=[1, 3, 224, 99999999], contents=good)])),
        "infer-datatype-bogus": ("ModelInfer", infer(model_name=MODEL, inputs=[_tensor_msg(datatype="FP99", contents=good)])),
        "infer-contents-short": ("ModelInfer", infer(model_name=MODEL, inputs=[_tensor_msg(contents=pb.InferTensorContents(fp32_contents=[1.0]))])),
        "infer-raw-short": ("ModelInfer", infer(model_name=MODEL, inputs=[_tensor_msg()], raw_input_contents=[b"\0" * 7])),
        "infer-raw-and-contents": ("ModelInfer", infer(model_name=MODEL, inputs=[_tensor_msg(contents=good)], raw_input_contents=[b"\0" * 64])),
        "infer-raw-extra": ("ModelInfer", infer(model_name=MODEL, inputs=[_tensor_msg()], raw_input_contents=[b"\0" * 64, b"\0" * 64])),
        "infer-output-unknown": ("ModelInfer", infer(model_name=MODEL, inputs=[_tensor_msg(contents=good)], outputs=[infer.InferRequestedOutputTensor(name="NOPE")])),
        "infer-not-protobuf": ("ModelInfer", b"\xff\xff\xff\xff\x0f garbage"),
        "load-traversal": ("RepositoryModelLoad", pb.RepositoryModelLoadRequest(model_name=f"../{sentinel_dir}")),
        "load-dot-dot": ("RepositoryModelLoad", pb.RepositoryModelLoadRequest(model_name="..")),
        "load-empty-name": ("RepositoryModelLoad", pb.RepositoryModelLoadRequest(model_name="")),
        "load-absolute": ("RepositoryModelLoad", pb.RepositoryModelLoadRequest(model_name="/etc")),
        "load-nul": ("RepositoryModelLoad", pb.RepositoryModelLoadRequest(model_name="a\x00b")),
        "load-override-not-json": ("RepositoryModelLoad", pb.RepositoryModelLoadRequest(model_name=MODEL, parameters={"config": pb.ModelRepositoryParameter(string_param="{")})),
        "load-override-wrong-kind": ("RepositoryModelLoad", pb.RepositoryModelLoadRequest(model_name=MODEL, parameters={"config": pb.ModelRepositoryParameter(int64_param=5)})),
        "load-unknown-parameter": ("RepositoryModelLoad", pb.RepositoryModelLoadRequest(model_name=MODEL, parameters={"colour": pb.ModelRepositoryParameter(string_param="red")})),
        "unload-traversal": ("RepositoryModelUnload", pb.RepositoryModelUnloadRequest(model_name=f"../{sentinel_dir}")),
        "metadata-traversal": ("ModelMetadata", pb.ModelMetadataRequest(name=f"../{sentinel_dir}")),
        "config-traversal": ("ModelConfig", pb.ModelConfigRequest(name=f"../{sentinel_dir}")),
    }  # fmt: skip


GRPC_CASES = _grpc_cases(SENTINEL_DIR)
#: Not sent to Triton 2.51: the JSON twin of this shape made it throw std::bad_alloc.
GRPC_TRITON_UNSAFE = {"infer-shape-huge"}


def grpc_exchange(address: str, method: str, message: object) -> tuple[str, str]:
    """``(status code name, details)`` of one unary call; ``("OK", "")`` on success."""
    with grpc.insecure_channel(address) as channel:
        raw = isinstance(message, bytes)
        call = channel.unary_unary(
            f"/inference.GRPCInferenceService/{method}",
            request_serializer=None if raw else (lambda m: m.SerializeToString()),
            response_deserializer=None,
        )
        try:
            call(message, timeout=20)
        except grpc.RpcError as exc:
            return exc.code().name, exc.details() or ""
    return "OK", ""


#: Our gRPC code for every case.
GRPC_EXPECTED: dict[str, str] = {
    "infer-unknown-model": "NOT_FOUND",
    "infer-no-inputs": "INVALID_ARGUMENT",
    "infer-shape-negative": "INVALID_ARGUMENT",
    "infer-shape-huge": "INVALID_ARGUMENT",
    "infer-datatype-bogus": "INVALID_ARGUMENT",
    "infer-contents-short": "INVALID_ARGUMENT",
    "infer-raw-short": "INVALID_ARGUMENT",
    "infer-raw-and-contents": "INVALID_ARGUMENT",
    "infer-raw-extra": "OK",
    "infer-output-unknown": "INVALID_ARGUMENT",
    "infer-not-protobuf": "INTERNAL",
    "load-traversal": "INTERNAL",
    "load-dot-dot": "INTERNAL",
    "load-empty-name": "INTERNAL",
    "load-absolute": "INTERNAL",
    "load-nul": "INTERNAL",
    "load-override-not-json": "INTERNAL",
    "load-override-wrong-kind": "INVALID_ARGUMENT",
    "load-unknown-parameter": "INVALID_ARGUMENT",
    "unload-traversal": "OK",
    "metadata-traversal": "NOT_FOUND",
    "config-traversal": "NOT_FOUND",
}


def test_grpc_corpus(hostile: Hostile, caplog: pytest.LogCaptureFixture) -> None:
    seen = {}
    with caplog.at_level(logging.WARNING):
        for name, (method, message) in GRPC_CASES.items():
            code, details = grpc_exchange(hostile.server.grpc_url, method, message)
            seen[name] = code
            if code != "OK":
                assert details, name
            for secret in (*INTERNALS, hostile.sentinel.marker, str(hostile.root)):
                assert secret not in details, (name, details)
    hostile.check_serving()
    hostile.check_untouched()
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert seen == GRPC_EXPECTED


# -- the same corpus on Triton 2.51 ---------------------------------------------------------------

#: case -> (Triton 2.51's answer, ours, why the difference stays). A case not sent to Triton
#: shows the reason instead of a status (see ``Case.not_for_triton``); None = no answer
#: (connection closed, reset, or left waiting until the client gave up).
#: docs/concepts/reference-server.md ("Broken and hostile clients") has the same table.
DIFFERENCES: dict[str, tuple[int | str | None, int | str | None, str]] = {
    "http:json-nested-10MB": (CRASH, 400, "Triton never answers; a client error, with a message"),
    "http:shape-huge": (CRASH, 500, "Triton throws std::bad_alloc; here the data/shape check"),
    "http:shape-overflow": (CRASH, 500, "as shape-huge"),
    "http:override-instances-10000": (
        "starts 10,000 Python stub processes", 400,
        "this server caps instances per model (MAX_INSTANCES_PER_MODEL = 64)",
    ),
    "http:override-files-escape": (
        "may write outside its scratch directory", 500,
        "refused here at the poll stage (file path leaves the model directory)",
    ),
    "http:content-length-abc": (None, 400, "Triton drops the connection; a JSON 400 is clearer"),
    "http:content-length-negative": (None, 400, "as content-length-abc"),
    "http:content-length-shorter": (
        500, 400,
        "Triton parses the short body as JSON; aiohttp refuses the bytes after it "
        "(the request said Connection: close)",
    ),
    "http:content-length-longer": (None, 408, "Triton waits forever; --http-read-timeout here"),
    "http:body-stalls": (None, 408, "as content-length-longer"),
    "http:url-100KB": (None, 400, "Triton resets; aiohttp's 8190-byte line limit, JSON 400"),
    "http:header-100KB": (None, 400, "as url-100KB"),
    "http:not-http": (None, 400, "Triton closes without answering"),
    "http:bad-method": (405, 400, "aiohttp's parser refuses unknown methods before routing"),
    "http:headers-byte-by-byte": (
        404, 200, "Triton (libevhtp) mis-parses a request line that arrives in pieces",
    ),
    "http:load-body-array": (200, 500, "a load body must be a JSON object here"),
    "http:index-ready-string": (
        500, 400, "kept from before: spec (Triton main) answers 400 with its own message",
    ),
    "grpc:infer-shape-huge": (CRASH, "INVALID_ARGUMENT", "the JSON twin crashed Triton"),
}  # fmt: skip


@pytest.mark.triton
def test_differences_from_triton_are_the_documented_ones(
    hostile: Hostile, triton_install: TritonInstall, tmp_path: Path
) -> None:
    triton = RealTriton(triton_install, tmp_path, models=[identity_model_config()])
    triton.start()
    try:
        found: dict[str, tuple[int | str | None, int | str | None]] = {}
        theirs_cases = {c.name: c for c in build_cases(SENTINEL_DIR, backend="python")}
        for case in CASES:
            ours = exchange(hostile.server.http_url, case).status
            if case.not_for_triton:
                theirs: int | str | None = case.not_for_triton
            else:
                theirs = exchange(triton.http_url, theirs_cases[case.name]).status
            if theirs != ours:
                found[f"http:{case.name}"] = (theirs, ours)
        theirs_grpc = _grpc_cases(SENTINEL_DIR, backend="python")
        for name, (method, message) in GRPC_CASES.items():
            ours_code = grpc_exchange(hostile.server.grpc_url, method, message)[0]
            if name in GRPC_TRITON_UNSAFE:
                theirs_code = CRASH
            else:
                theirs_code = grpc_exchange(triton.grpc_url, *theirs_grpc[name])[0]
            if theirs_code != ours_code:
                found[f"grpc:{name}"] = (theirs_code, ours_code)
    finally:
        triton.stop()
    hostile.check_serving()
    assert found == {name: (t, o) for name, (t, o, _) in DIFFERENCES.items()}
