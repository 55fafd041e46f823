"""The reference engine over the wire: the bundled ``tinyllm`` on a real server (port 0).

gRPC ``ModelStreamInfer`` with the real ``tritonclient.grpc`` streaming API, Triton's generate
extension (``generate``, ``generate_stream``) and the OpenAI-compatible endpoints with plain
HTTP, vLLM's metrics on ``/metrics``, and Triton's refusals for decoupled models.
"""

from __future__ import annotations

import json
import queue
import re
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from reference_server import ServerOptions, ServerThread
from reference_server.core.errors import ServerError
from reference_server.zoo import tinyllm
from tests.server.conftest import raw_request, wait_until

MODEL = tinyllm.MODEL_NAME


@pytest.fixture(scope="module")
def llm(tmp_path_factory: pytest.TempPathFactory, serves: None) -> Iterator[ServerThread]:
    """A server with the bundled ``tinyllm`` and a non-decoupled model beside it."""
    root = tmp_path_factory.mktemp("llm_repo")
    tinyllm.make_repository(root)
    (root / "plain" / "1").mkdir(parents=True)
    (root / "plain" / "config.pbtxt").write_text(
        'name: "plain" backend: "identity" max_batch_size: 0\n'
        'input { name: "INPUT0" data_type: TYPE_STRING dims: [1] }\n'
        'output { name: "OUTPUT0" data_type: TYPE_STRING dims: [1] }\n'
    )
    options = ServerOptions(model_repositories=(root,), models=(MODEL, "plain"), device="sim")
    with ServerThread(options) as running:
        yield running


def _inputs(prompt: str, sampling: dict[str, Any], stream: bool = True) -> list[Any]:
    text = grpcclient.InferInput("text_input", [1], "BYTES")
    text.set_data_from_numpy(np.array([prompt.encode()], dtype=np.object_))
    flag = grpcclient.InferInput("stream", [1], "BOOL")
    flag.set_data_from_numpy(np.array([stream]))
    params = grpcclient.InferInput("sampling_parameters", [1], "BYTES")
    params.set_data_from_numpy(np.array([json.dumps(sampling).encode()], dtype=np.object_))
    return [text, flag, params]


def _stream(
    url: str, requests: list[tuple[str, str, dict[str, Any]]], timeout_s: float = 60.0
) -> dict[str, list[tuple[str, bool]]]:
    """Send requests on one gRPC stream; per request id, its (text, final) responses."""
    results: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client = grpcclient.InferenceServerClient(url)
    out: dict[str, list[tuple[str, bool]]] = {rid: [] for rid, _, _ in requests}
    try:
        client.start_stream(callback=lambda result, error: results.put((result, error)))
        for rid, prompt, sampling in requests:
            client.async_stream_infer(MODEL, _inputs(prompt, sampling), request_id=rid)
        open_ids = set(out)
        while open_ids:
            result, error = results.get(timeout=timeout_s)
            assert error is None, error
            response = result.get_response()
            final = response.parameters["triton_final_response"].bool_param
            text = result.as_numpy("text_output")[0].decode()
            out[response.id].append((text, final))
            if final:
                open_ids.discard(response.id)
    finally:
        client.stop_stream()
        client.close()
    return out


def test_grpc_stream_sends_one_response_per_token_the_last_flagged_final(
    llm: ServerThread,
) -> None:
    sampling = {"max_tokens": 12, "min_tokens": 12, "ignore_eos": True}
    got = _stream(llm.grpc_url, [("a", "one two three four", sampling)])["a"]
    assert [text for text, _ in got] == [f" tok{i}" for i in range(12)]
    assert [final for _, final in got] == [False] * 11 + [True]


def test_concurrent_streams_each_get_their_own_tokens(llm: ServerThread) -> None:
    sampling = {"max_tokens": 8, "ignore_eos": True}
    requests = [(f"r{i}", "word " * (10 + i), sampling) for i in range(6)]
    got = _stream(llm.grpc_url, requests)
    for rid, _, _ in requests:
        assert [text for text, _ in got[rid]] == [f" tok{i}" for i in range(8)], rid


def test_without_ignore_eos_a_stream_may_end_early_but_keeps_min_tokens(llm: ServerThread) -> None:
    sampling = {"max_tokens": 400, "min_tokens": 5}
    got = _stream(llm.grpc_url, [("e", "hello there", sampling)], timeout_s=120)["e"]
    assert 5 <= len(got) <= 400
    assert got[-1][1] and not any(final for _, final in got[:-1])


def test_a_non_streaming_request_answers_once_with_the_prompt_and_the_text(
    llm: ServerThread,
) -> None:
    results: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client = grpcclient.InferenceServerClient(llm.grpc_url)
    try:
        client.start_stream(callback=lambda result, error: results.put((result, error)))
        inputs = _inputs("say hi", {"max_tokens": 3, "ignore_eos": True}, stream=False)
        client.async_stream_infer(MODEL, inputs, request_id="n")
        result, error = results.get(timeout=30)
        assert error is None
        assert result.as_numpy("text_output")[0].decode() == "say hi tok0 tok1 tok2"
        assert result.get_response().parameters["triton_final_response"].bool_param
    finally:
        client.stop_stream()
        client.close()


def test_a_request_that_cannot_fit_is_answered_with_the_fix(llm: ServerThread) -> None:
    results: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client = grpcclient.InferenceServerClient(llm.grpc_url)
    try:
        client.start_stream(callback=lambda result, error: results.put((result, error)))
        client.async_stream_infer(MODEL, _inputs("x " * 10, {"max_tokens": 10**6}))
        _, error = results.get(timeout=30)
        assert error is not None and "gpu_memory_utilization" in str(error)
        client.async_stream_infer(MODEL, _inputs("x", {"max_tokens": "many"}))
        _, error = results.get(timeout=30)
        assert error is not None and "max_tokens" in str(error)
    finally:
        client.stop_stream()
        client.close()


def test_decoupled_models_are_refused_on_single_response_endpoints(llm: ServerThread) -> None:
    grpc_client = grpcclient.InferenceServerClient(llm.grpc_url)
    with pytest.raises(InferenceServerException, match="decoupled transaction policy") as info:
        grpc_client.infer(MODEL, _inputs("hi", {}))
    assert info.value.status() == "StatusCode.UNIMPLEMENTED"
    http_client = httpclient.InferenceServerClient(llm.http_url)
    text = httpclient.InferInput("text_input", [1], "BYTES")
    text.set_data_from_numpy(np.array([b"hi"], dtype=np.object_))
    with pytest.raises(InferenceServerException, match="HTTP end point doesn't support"):
        http_client.infer(MODEL, [text])


def test_a_non_decoupled_model_answers_a_stream_once_flagged_final(
    llm: ServerThread,
) -> None:
    results: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client = grpcclient.InferenceServerClient(llm.grpc_url)
    try:
        client.start_stream(callback=lambda result, error: results.put((result, error)))
        tensor = grpcclient.InferInput("INPUT0", [1], "BYTES")
        tensor.set_data_from_numpy(np.array([b"x"], dtype=np.object_))
        client.async_stream_infer("plain", [tensor])
        result, error = results.get(timeout=30)
        assert error is None
        # as Triton 2.51 answers a stream request to a model that is not decoupled
        assert result.get_response().parameters["triton_final_response"].bool_param
        assert results.empty()
    finally:
        client.stop_stream()
        client.close()


def _sse(address: str, path: str, body: dict[str, Any]) -> tuple[int, str, list[str]]:
    status, headers, raw = raw_request(
        address, "POST", path, json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    events = [
        line[len("data: ") :] for line in raw.decode().splitlines() if line.startswith("data: ")
    ]
    return status, headers.get("Content-Type", ""), events


def test_generate_stream_sends_one_event_per_token(llm: ServerThread) -> None:
    body = {
        "text_input": "a b c",
        "parameters": {"stream": True, "max_tokens": 5, "min_tokens": 5, "ignore_eos": True},
    }
    status, ctype, events = _sse(llm.http_url, f"/v2/models/{MODEL}/generate_stream", body)
    assert status == 200 and ctype.startswith("text/event-stream")
    parsed = [json.loads(e) for e in events]
    assert [p["text_output"] for p in parsed] == [f" tok{i}" for i in range(5)]
    assert all(p["model_name"] == MODEL and p["model_version"] == "1" for p in parsed)


def test_generate_answers_one_object_and_errors_are_json(llm: ServerThread) -> None:
    body = {"text_input": "a b", "parameters": {"max_tokens": 2, "ignore_eos": True}}
    status, _, raw = raw_request(
        llm.http_url, "POST", f"/v2/models/{MODEL}/generate", json.dumps(body).encode()
    )
    assert status == 200
    assert json.loads(raw) == {
        "model_name": MODEL,
        "model_version": "1",
        "text_output": "a b tok0 tok1",
    }
    bad = {"text_input": "a", "parameters": {"max_tokens": 0}}
    status, _, raw = raw_request(
        llm.http_url, "POST", f"/v2/models/{MODEL}/generate_stream", json.dumps(bad).encode()
    )
    assert status == 400 and "max_tokens" in json.loads(raw)["error"]


def test_openai_completions_stream_with_usage_from_token_ids(llm: ServerThread) -> None:
    body = {
        "model": MODEL,
        "prompt": list(range(100, 140)),
        "max_tokens": 7,
        "min_tokens": 7,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    status, ctype, events = _sse(llm.http_url, "/v1/completions", body)
    assert status == 200 and ctype.startswith("text/event-stream")
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    texts = [c["choices"][0]["text"] for c in chunks if c["choices"]]
    assert texts == [f" tok{i}" for i in range(7)]
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"
    assert chunks[-1]["choices"] == []
    assert chunks[-1]["usage"] == {"prompt_tokens": 40, "completion_tokens": 7, "total_tokens": 47}


def test_openai_chat_stream_and_non_stream(llm: ServerThread) -> None:
    messages = [{"role": "user", "content": "tell me a story"}]
    body = {
        "model": MODEL,
        "messages": messages,
        "max_tokens": 4,
        "ignore_eos": True,
        "stream": True,
    }
    status, _, events = _sse(llm.http_url, "/v1/chat/completions", body)
    assert status == 200 and events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == (
        " tok0 tok1 tok2 tok3"
    )
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    body["stream"] = False
    status, _, raw = raw_request(
        llm.http_url, "POST", "/v1/chat/completions", json.dumps(body).encode()
    )
    reply = json.loads(raw)
    assert status == 200 and reply["choices"][0]["message"]["content"] == " tok0 tok1 tok2 tok3"
    assert reply["usage"] == {"prompt_tokens": 4, "completion_tokens": 4, "total_tokens": 8}


def test_openai_models_health_and_errors(llm: ServerThread) -> None:
    status, _, raw = raw_request(llm.http_url, "GET", "/v1/models")
    assert status == 200 and [m["id"] for m in json.loads(raw)["data"]] == [MODEL]
    assert raw_request(llm.http_url, "GET", "/health")[0] == 200
    status, _, raw = raw_request(
        llm.http_url,
        "POST",
        "/v1/completions",
        json.dumps({"model": "nope", "prompt": "x"}).encode(),
    )
    assert status == 404 and "nope" in json.loads(raw)["error"]["message"]
    status, _, raw = raw_request(
        llm.http_url, "POST", "/v1/completions", json.dumps({"model": MODEL, "prompt": 5}).encode()
    )
    assert status == 400 and "prompt" in json.loads(raw)["error"]["message"]


def _metric(text: str, name: str) -> float:
    match = re.search(
        rf'^{re.escape(name)}\{{[^}}]*model_name="{MODEL}"[^}}]*\}} (\S+)$', text, re.M
    )
    assert match, f"{name} not in /metrics"
    return float(match.group(1))


def _scrape(llm: Any) -> str:
    with urllib.request.urlopen(llm.metrics_url, timeout=10) as reply:
        return str(reply.read().decode())


def test_vllm_metrics_move_with_the_load(llm: ServerThread) -> None:
    before = _scrape(llm)
    prompt_before = _metric(before, "vllm:prompt_tokens_total")
    generated_before = _metric(before, "vllm:generation_tokens_total")
    success_before = _metric(before, "vllm:request_success_total")
    seen_running: list[float] = []
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            text = _scrape(llm)
            seen_running.append(_metric(text, "vllm:num_requests_running"))
            seen_running.append(_metric(text, "vllm:kv_cache_usage_perc"))

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        sampling = {"max_tokens": 30, "min_tokens": 30, "ignore_eos": True}
        _stream(llm.grpc_url, [(f"m{i}", "w " * 20, sampling) for i in range(4)])
    finally:
        stop.set()
        watcher.join()
    after = _scrape(llm)
    assert _metric(after, "vllm:prompt_tokens_total") - prompt_before >= 80
    assert _metric(after, "vllm:generation_tokens_total") - generated_before == 120
    assert _metric(after, "vllm:request_success_total") - success_before == 4
    assert max(seen_running) > 0  # requests were running and held KV blocks while streaming
    wait_until(lambda: _metric(_scrape(llm), "vllm:num_requests_running") == 0, 30, "engine idle")
    assert "vllm:num_preemptions_total" in after and "vllm:num_requests_waiting" in after


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (("decoupled: true", "decoupled: false"), "must be configured to use decoupled model"),
        (("backend:", "max_batch_size: 4\nbackend:"), "set max_batch_size: 0"),
        (("backend:", "dynamic_batching { }\nbackend:"), "remove dynamic_batching"),
        (("", ""), "model.json' containing vllm engine args must be provided"),
    ],
)
def test_a_vllm_model_triton_would_refuse_does_not_load(
    tmp_path: Path, start_server: Any, edit: tuple[str, str], message: str
) -> None:
    tinyllm.make_repository(tmp_path)
    config = tmp_path / MODEL / "config.pbtxt"
    assert edit[0] in config.read_text()
    config.write_text(config.read_text().replace(*edit, 1))
    if not edit[0]:
        (tmp_path / MODEL / "1" / "model.json").unlink()
    with pytest.raises(ServerError, match=message):
        start_server(tmp_path, device="sim")


def test_a_tight_kv_cache_preempts_and_every_stream_still_completes(
    tmp_path: Path, start_server: Any
) -> None:
    # 0.5767 of 24 GiB leaves 20 blocks of 16 tokens after the weights: 6 requests of 20 + 40
    # tokens (4 blocks each at the end) cannot all hold their KV at once.
    tinyllm.make_repository(tmp_path, engine={"gpu_memory_utilization": 0.5767})
    running = start_server(tmp_path, (MODEL,), device="sim")
    with urllib.request.urlopen(running.metrics_url, timeout=10) as reply:
        assert _metric(reply.read().decode(), "vllm:num_kv_cache_blocks_total") == 20
    sampling = {"max_tokens": 40, "min_tokens": 40, "ignore_eos": True}
    got = _stream(running.grpc_url, [(f"p{i}", "w " * 20, sampling) for i in range(6)], 120)
    for rid, responses in got.items():
        assert [text for text, _ in responses] == [f" tok{i}" for i in range(40)], rid
    text = _scrape(running)
    assert _metric(text, "vllm:num_preemptions_total") > 0
    # recomputed prompts count again as prefill tokens: more than the 6 x 20 prompt tokens
    assert _metric(text, "vllm:prompt_tokens_total") > 120


def test_a_load_with_an_engine_file_runs_its_settings_and_a_load_without_puts_them_back(
    tmp_path: Path, start_server: Any
) -> None:
    # What a sweep does to a vLLM model through the repository API (perfsweep's own target:
    # the running model unloaded first, as Triton needs): the trial's 1/model.json beside the
    # config, then the config alone, which loads the file in the repository again.
    from analyzer.target.remote import RemoteTarget

    tinyllm.make_repository(tmp_path)
    running = start_server(tmp_path, (MODEL,), device="sim")
    target = RemoteTarget(f"http://{running.http_url}", MODEL)
    config = target.model_config()
    blocks = "vllm:num_kv_cache_blocks_total"
    assert _metric(_scrape(running), blocks) == 1013
    engine = {**tinyllm.ENGINE_SETTINGS, "gpu_memory_utilization": 0.5767}
    target.load_config(config, files={"file:1/model.json": json.dumps(engine).encode()})
    assert _metric(_scrape(running), blocks) == 20
    sampling = {"max_tokens": 4, "min_tokens": 4, "ignore_eos": True}
    got = _stream(running.grpc_url, [("p", "w " * 8, sampling)])
    assert [text for text, _ in got["p"]] == [f" tok{i}" for i in range(4)]
    target.load_config(config)
    assert _metric(_scrape(running), blocks) == 1013
    assert json.loads((tmp_path / MODEL / "1" / "model.json").read_text()) == (
        tinyllm.ENGINE_SETTINGS
    )


def test_a_client_that_leaves_mid_stream_frees_the_engine(llm: ServerThread) -> None:
    import http.client

    host, port = llm.http_url.rsplit(":", 1)
    connection = http.client.HTTPConnection(host, int(port), timeout=30)
    body = {"model": MODEL, "prompt": "go", "max_tokens": 3000, "ignore_eos": True, "stream": True}
    connection.request("POST", "/v1/completions", json.dumps(body))
    reply = connection.getresponse()
    assert reply.status == 200
    assert reply.readline().startswith(b"data: ")  # streaming has begun
    wait_until(lambda: _metric(_scrape(llm), "vllm:num_requests_running") == 1, 10, "running")
    connection.close()
    # 3000 tokens would take 30 s; the engine drops the request as soon as the client is gone.
    wait_until(lambda: _metric(_scrape(llm), "vllm:num_requests_running") == 0, 10, "dropped")
    assert _metric(_scrape(llm), "vllm:kv_cache_usage_perc") == 0


def test_generate_refuses_a_stream_of_responses_with_tritons_message(llm: ServerThread) -> None:
    body = {"text_input": "a", "parameters": {"stream": True, "max_tokens": 3}}
    status, _, raw = raw_request(
        llm.http_url, "POST", f"/v2/models/{MODEL}/generate", json.dumps(body).encode()
    )
    assert status == 400
    assert json.loads(raw)["error"].startswith("generate expects model to produce exactly 1")


def test_unloading_lets_the_streams_under_way_finish(tmp_path: Path, start_server: Any) -> None:
    tinyllm.make_repository(tmp_path)
    running = start_server(tmp_path, (MODEL,), device="sim")
    results: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client = grpcclient.InferenceServerClient(running.grpc_url)
    try:
        client.start_stream(callback=lambda result, error: results.put((result, error)))
        client.async_stream_infer(MODEL, _inputs("a b", {"max_tokens": 30, "ignore_eos": True}))
        first, error = results.get(timeout=30)
        assert error is None
        httpclient.InferenceServerClient(running.http_url).unload_model(MODEL)
        texts = [first.as_numpy("text_output")[0].decode()]
        while True:
            result, error = results.get(timeout=30)
            assert error is None, error
            texts.append(result.as_numpy("text_output")[0].decode())
            if result.get_response().parameters["triton_final_response"].bool_param:
                break
        assert texts == [f" tok{i}" for i in range(30)]
    finally:
        client.stop_stream()
        client.close()
