"""Correlated sequence streams against a real reference server serving the bundled accumulator.

The child (``python -m tests.load.test_sequence_load PROTOCOL``; the load engine is gevent code)
starts a reference server with the accumulator (:mod:`reference_server.zoo.accumulator`: the
reply's ``OUTPUT`` is the running sum of its sequence's inputs, reset by START; a request of a
sequence the server does not know, without START, is refused) and measures it closed loop
(6 users) and open loop (80 req/s over 3 live sequences) through ``engine_options``. It watches
the wire under the engine: every request the hot-path client sends (its sequence parameters and
its INPUT, read back from the HTTP bytes or tritonclient's gRPC call) and the OUTPUT of its
reply. The tests then check, per correlation id, what only a correct stream gives: the first
request says START and no other does, each OUTPUT is the running sum of the inputs sent on that
id so far (in order: a reordered or a misrouted request breaks the sum), END only on the last,
one request of a sequence in flight at a time, and every request succeeded.
"""

from __future__ import annotations

import itertools
import json
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from tests.load.child import run_module

USERS = 6
RATE_RPS = 80.0
SEQUENCES = 3
LENGTH = 5


@pytest.fixture(scope="module", params=["http", "grpc"])
def answer(request: pytest.FixtureRequest, spawns: None) -> dict[str, Any]:
    return run_module("tests.load.test_sequence_load", request.param, timeout_s=300.0)


def _streams(sent: list[dict[str, Any]]) -> dict[int, list[dict[str, Any]]]:
    by_id: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for request in sorted(sent, key=lambda r: r["sent_at"]):
        by_id[request["sequence_id"]].append(request)
    return by_id


@pytest.mark.parametrize("level", ["closed", "open"])
def test_every_sequence_starts_with_start_and_sums_in_order(
    answer: dict[str, Any], level: str
) -> None:
    result, sent = answer[level]["result"], answer[level]["sent"]
    assert result["error_count"] == 0, result["errors"]
    assert result["request_count"] > 50
    streams = _streams(sent)
    assert len(streams) >= (USERS if level == "closed" else SEQUENCES)
    ended = 0
    for correlation_id, requests in streams.items():
        assert correlation_id > 0
        assert [r["start"] for r in requests] == [True] + [False] * (len(requests) - 1)
        total = 0
        for r in requests:
            assert r["ok"], r
            total += r["input"]
            assert r["output"] == total, (correlation_id, requests)
        assert not any(r["end"] for r in requests[:-1]), requests
        # perf_analyzer's lengths: 5 +- 20 % is 4 to 6 requests.
        assert len(requests) <= LENGTH + 1, requests
        # A sequence cut by the level's end is ended early (one more request, END set).
        if requests[-1]["end"] and len(requests) >= LENGTH - 1:
            ended += 1
        # One request of a sequence in flight at a time.
        for before, after in itertools.pairwise(requests):
            assert before["done_at"] <= after["sent_at"], (before, after)
    assert ended >= len(streams) // 2


def test_open_loop_keeps_its_live_sequences(answer: dict[str, Any]) -> None:
    # At most ``sequences`` requests in flight, one per live sequence.
    events = []
    for r in answer["open"]["sent"]:
        events += [(r["sent_at"], 1), (r["done_at"], -1)]
    in_flight = peak = 0
    for _, change in sorted(events, key=lambda e: (e[0], e[1])):
        in_flight += change
        peak = max(peak, in_flight)
    assert 1 <= peak <= SEQUENCES


def test_a_sequence_model_refuses_a_larger_batch(answer: dict[str, Any]) -> None:
    assert "batch size must be 1" in answer["batch_error"]


# ---- child side ---------------------------------------------------------------------------------


def _watch(protocol: str, sent: list[dict[str, Any]]) -> None:
    """Record every inference the hot-path client makes (parameters, INPUT, OUTPUT)."""
    import numpy as np

    if protocol == "http":
        import tritonclient.http as httpclient

        from analyzer.load.http_clients import RawHttpInferClient

        exchange = RawHttpInferClient.exchange

        def watched(self: Any, request: bytes) -> Any:
            sent_at = time.perf_counter()
            status, headers, data = exchange(self, request)
            head, _, body = request.partition(b"\r\n\r\n")
            fields = dict(line.split(": ", 1) for line in head.decode("latin-1").split("\r\n")[1:])
            size = int(fields["Inference-Header-Content-Length"])
            assert int(fields["Content-Length"]) == len(body)
            params = json.loads(body[:size])["parameters"]
            record = {
                "sequence_id": params["sequence_id"],
                "start": params["sequence_start"],
                "end": params["sequence_end"],
                "input": int(np.frombuffer(body[size:], dtype=np.int32)[0]),
                "ok": status == 200,
                "output": None,
                "sent_at": sent_at,
                "done_at": time.perf_counter(),
            }
            if status == 200:
                length = headers.get("inference-header-content-length")
                result = httpclient.InferenceServerClient.parse_response_body(
                    data, header_length=int(length) if length else None
                )
                record["output"] = int(result.as_numpy("OUTPUT").reshape(-1)[0])
            sent.append(record)
            return status, headers, data

        RawHttpInferClient.exchange = watched  # type: ignore[method-assign]
    else:
        import tritonclient.grpc as grpcclient

        infer = grpcclient.InferenceServerClient.infer

        def watched_grpc(self: Any, model: str, inputs: list[Any], **kwargs: Any) -> Any:
            sent_at = time.perf_counter()
            record = {
                "sequence_id": kwargs["sequence_id"],
                "start": kwargs["sequence_start"],
                "end": kwargs["sequence_end"],
                "input": int(np.frombuffer(inputs[0]._raw_content, dtype=np.int32)[0]),
                "ok": False,
                "output": None,
                "sent_at": sent_at,
            }
            try:
                result = infer(self, model, inputs, **kwargs)
            except Exception:  # a failed request; one cut off by the level's end is not kept
                record["done_at"] = time.perf_counter()
                sent.append(record)
                raise
            record["done_at"] = time.perf_counter()
            sent.append(record)
            record["ok"] = True
            record["output"] = int(result.as_numpy("OUTPUT").reshape(-1)[0])
            return result

        grpcclient.InferenceServerClient.infer = watched_grpc  # type: ignore[method-assign]


def main(protocol: str) -> None:
    """Child side: serve the accumulator, load it closed and open loop, print what was sent."""
    from analyzer.config.scenario import load_scenario
    from analyzer.errors import InputError, TargetError
    from analyzer.load import LocustLoadGenerator
    from analyzer.load.engine import engine_options
    from analyzer.measure.arrivals import POISSON
    from analyzer.measure.specs import LoadMode, LoadSpec
    from reference_server.zoo.accumulator import accumulator_config, make_repository
    from tests.load.refserver import RefServer

    repo = Path(tempfile.mkdtemp(prefix="perfsweep-sequence-"))
    make_repository(repo, accumulator_config("acc", max_queue_delay_us=200))
    scenario = load_scenario(
        None,
        {
            "model.protocol": protocol,
            "traffic.sequence_length": LENGTH,
            "traffic.sequences": SEQUENCES,
        },
        env={},
    )
    window = {"warmup_s": 0.3, "window_s": 0.7, "max_windows": 2, "stable_windows": 2, "seed": 5}
    specs = {
        "closed": LoadSpec(LoadMode.CONCURRENCY, USERS, **window),
        "open": LoadSpec(LoadMode.REQUEST_RATE, RATE_RPS, POISSON, **window),
    }
    sent: list[dict[str, Any]] = []
    _watch(protocol, sent)
    answer: dict[str, Any] = {}
    with RefServer(repo, ("acc",)) as srv:
        options = engine_options(
            scenario,
            f"http://{srv.http_url}",
            "acc",
            metrics_url=srv.metrics_url,
            grpc_url=srv.grpc_url,
        )
        with LocustLoadGenerator(options) as generator:
            earlier: set[int] = set()
            for name, spec in specs.items():
                earlier |= {r["sequence_id"] for r in sent}
                sent.clear()
                m = generator.measure(spec)
                # The END requests that close the previous level's sequences may still be
                # under way: they belong to that level's ids.
                mine = [r for r in sent if r["sequence_id"] not in earlier]
                answer[name] = {"result": m.to_dict(), "sent": mine}
                generator.drain(10.0)
        batched = load_scenario(None, {"model.protocol": protocol, "input.batch_size": 2}, env={})
        options = engine_options(batched, f"http://{srv.http_url}", "acc", grpc_url=srv.grpc_url)
        try:
            with LocustLoadGenerator(options) as generator:
                generator.measure(LoadSpec(LoadMode.CONCURRENCY, 1, **window))
            answer["batch_error"] = ""
        except (InputError, TargetError) as exc:
            answer["batch_error"] = str(exc)
    print(json.dumps(answer, default=str), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
