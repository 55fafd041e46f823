"""The sequence batcher through the real tritonclient (HTTP and gRPC) on a running server.

Every model is the bundled accumulator (:mod:`reference_server.zoo.accumulator`): a reply's
``OUTPUT`` is the running sum of its sequence, so a request routed to the wrong sequence or a
lost START shows; ``BATCH_SIZE`` says how many requests its execution held.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.grpc import model_config_pb2 as mc
from tritonclient.utils import InferenceServerException

from reference_server import ServerThread
from reference_server.zoo.accumulator import accumulator_config, make_repository
from tests.support.servers import wait_until

IDLE_US = 100_000


def _models() -> list[mc.ModelConfig]:
    strings = accumulator_config("acc_strings", control_type="bool")
    strings.sequence_batching.control_input[3].control[0].data_type = mc.TYPE_STRING
    return [
        accumulator_config("acc", max_queue_delay_us=500),
        accumulator_config("acc_fp32", control_type="fp32", data_type=mc.TYPE_FP32),
        strings,
        accumulator_config("acc_direct", oldest=False, max_batch_size=4),
        accumulator_config("acc_idle", max_idle_us=IDLE_US),
        accumulator_config("acc_one", max_candidate_sequences=1),
        accumulator_config("acc_unload", max_candidate_sequences=1),
        # One slot, batches wait 3 s for a second request that never comes: an issued request
        # sits in the instance's batcher long enough for its client to go away.
        accumulator_config(
            "acc_cancel", max_candidate_sequences=1, max_queue_delay_us=3_000_000, preferred=(2,)
        ),
        _two_instances(accumulator_config("acc_two", max_candidate_sequences=3)),
        _two_instances(accumulator_config("acc_two_direct", oldest=False, max_batch_size=4)),
    ]


def _two_instances(config: mc.ModelConfig) -> mc.ModelConfig:
    if config.sequence_batching.HasField("oldest"):
        config.sequence_batching.oldest.max_queue_delay_microseconds = 200
    config.instance_group[0].count = 2
    return config


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, serves: None) -> Any:
    from reference_server import ServerOptions

    root = tmp_path_factory.mktemp("sequence_repo")
    models = _models()
    for config in models:
        make_repository(root, config)
    options = ServerOptions(model_repositories=(root,), models=tuple(m.name for m in models))
    stateful = accumulator_config("acc_state")
    state = stateful.sequence_batching.state.add(input_name="IN_STATE", output_name="OUT_STATE")
    state.data_type = mc.TYPE_INT32
    state.dims.append(1)
    make_repository(root, stateful)  # written, not loaded: implicit state is refused
    with ServerThread(options) as running:
        yield running


def _http(server: ServerThread) -> httpclient.InferenceServerClient:
    return httpclient.InferenceServerClient(server.http_url, network_timeout=30.0)


def _grpc(server: ServerThread) -> grpcclient.InferenceServerClient:
    return grpcclient.InferenceServerClient(server.grpc_url)


def _infer(
    client: Any,
    model: str,
    value: float,
    sequence_id: int | str,
    *,
    start: bool = False,
    end: bool = False,
    dtype: Any = np.int32,
    batch: int = 1,
) -> tuple[float, int]:
    """Send one request; return (running sum, batch size of its execution)."""
    module = grpcclient if isinstance(client, grpcclient.InferenceServerClient) else httpclient
    datatype = "FP32" if dtype == np.float32 else "INT32"
    tensor = module.InferInput("INPUT", [batch, 1], datatype)
    tensor.set_data_from_numpy(np.full((batch, 1), value, dtype=dtype))
    reply = client.infer(
        model,
        [tensor],
        sequence_id=sequence_id,
        sequence_start=start,
        sequence_end=end,
    )
    return float(reply.as_numpy("OUTPUT")[0, 0]), int(reply.as_numpy("BATCH_SIZE")[0, 0])


def _pending(server: ServerThread, model: str) -> int:
    import urllib.request

    with urllib.request.urlopen(server.metrics_url, timeout=10) as reply:
        text = reply.read().decode()
    for line in text.splitlines():
        if line.startswith("nv_inference_pending_request_count{") and f'model="{model}"' in line:
            return int(float(line.rsplit(" ", 1)[1]))
    return 0


def _error(call: Callable[[], object]) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as caught:
        call()
    return caught.value


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_interleaved_sequences_keep_their_own_sums(server: ServerThread, protocol: str) -> None:
    client = _http(server) if protocol == "http" else _grpc(server)
    base = 1000 if protocol == "http" else 2000
    ids = (base + 1, base + 2, base + 3)
    sums = dict.fromkeys(ids, 0.0)
    for step in range(4):
        for k, cid in enumerate(ids):
            value = 10.0**k * (step + 1)
            sums[cid] += value
            total, _ = _infer(client, "acc", value, cid, start=step == 0, end=step == 3)
            assert total == sums[cid], (cid, step)
    client.close()


def test_start_resets_the_state_of_a_reused_id(server: ServerThread) -> None:
    client = _http(server)
    assert _infer(client, "acc", 5, 3001, start=True)[0] == 5
    assert _infer(client, "acc", 6, 3001, start=True)[0] == 6  # a new sequence, same id
    assert _infer(client, "acc", 1, 3001, end=True)[0] == 7
    client.close()


def test_fp32_and_bool_controls(server: ServerThread) -> None:
    client = _grpc(server)
    assert _infer(client, "acc_fp32", 1.5, 4001, start=True, dtype=np.float32)[0] == 1.5
    assert _infer(client, "acc_fp32", 2.0, 4001, end=True, dtype=np.float32)[0] == 3.5
    client.close()


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_string_correlation_ids(server: ServerThread, protocol: str) -> None:
    client = _http(server) if protocol == "http" else _grpc(server)
    a, b = f"user-a-{protocol}", f"user-b-{protocol}"
    assert _infer(client, "acc_strings", 1, a, start=True)[0] == 1
    assert _infer(client, "acc_strings", 10, b, start=True)[0] == 10
    assert _infer(client, "acc_strings", 2, a, end=True)[0] == 3
    assert _infer(client, "acc_strings", 20, b, end=True)[0] == 30
    client.close()


def test_direct_pads_empty_lower_slots_with_null_requests(server: ServerThread) -> None:
    client = _http(server)
    # A holds slot 0, B slot 1. A request of B alone runs as [null, B]; A's alone as [A].
    assert _infer(client, "acc_direct", 1, 5001, start=True) == (1, 1)
    assert _infer(client, "acc_direct", 10, 5002, start=True) == (10, 2)
    assert _infer(client, "acc_direct", 2, 5001, end=True) == (3, 1)
    # A ended: slot 0 is free but below B, so B still runs beside a null request.
    assert _infer(client, "acc_direct", 20, 5002) == (30, 2)
    assert _infer(client, "acc_direct", 30, 5002, end=True) == (60, 2)
    client.close()


def test_backlogged_sequence_runs_once_a_slot_frees(server: ServerThread) -> None:
    client = _http(server)
    assert _infer(client, "acc_one", 1, 6001, start=True)[0] == 1
    result: dict[str, float] = {}

    def second() -> None:
        other = _http(server)
        result["b"] = _infer(other, "acc_one", 100, 6002, start=True, end=True)[0]
        other.close()

    thread = threading.Thread(target=second, daemon=True)
    thread.start()
    wait_until(lambda: _pending(server, "acc_one") == 1, 10, "B in the backlog")
    assert "b" not in result  # the one slot is A's
    assert _infer(client, "acc_one", 2, 6001, end=True)[0] == 3
    thread.join(10)
    assert result == {"b": 100}
    client.close()


def test_a_cancelled_issued_request_frees_its_slot_for_the_sequence(server: ServerThread) -> None:
    import json
    import socket

    body = json.dumps(
        {
            "inputs": [{"name": "INPUT", "shape": [1, 1], "datatype": "INT32", "data": [5]}],
            "parameters": {"sequence_id": 9101, "sequence_start": True},
        }
    ).encode()
    host, port = server.http_url.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=10)
    sock.sendall(
        b"POST /v2/models/acc_cancel/infer HTTP/1.1\r\nHost: x\r\n"
        b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
    )
    wait_until(lambda: _pending(server, "acc_cancel") == 1, 10, "the START waiting in the batcher")
    sock.close()  # the client goes away: the server cancels the queued request
    wait_until(lambda: _pending(server, "acc_cancel") == 0, 10, "the cancelled request dropped")
    # Its slot was told: the sequence's next request is issued (before, the slot stayed busy
    # for good and this request waited in it until the client gave up).
    client = _http(server)
    total, _ = _infer(client, "acc_cancel", 2, 9101, end=True)
    assert total == 2  # the cancelled START never ran
    client.close()


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_idle_sequence_loses_its_slot(server: ServerThread, protocol: str) -> None:
    client = _http(server) if protocol == "http" else _grpc(server)
    cid = 7001 if protocol == "http" else 7002
    assert _infer(client, "acc_idle", 4, cid, start=True)[0] == 4
    # The feature under test is a timeout: time has to pass (the reaper looks once per
    # idle period, so after three the slot is certainly free).
    time.sleep(3 * IDLE_US / 1e6)
    error = _error(lambda: _infer(client, "acc_idle", 1, cid))
    assert error.message() == (
        f"inference request for sequence {cid} to model 'acc_idle' must specify the START flag "
        "on the first request of the sequence"
    )
    assert _infer(client, "acc_idle", 2, cid, start=True, end=True)[0] == 2
    client.close()


def test_errors_of_the_sequence_batcher(server: ServerThread) -> None:
    http, grpc = _http(server), _grpc(server)
    no_start = _error(lambda: _infer(http, "acc", 1, 8001))
    assert no_start.status() == "400"
    assert "sequence 8001 to model 'acc' must specify the START flag" in str(no_start.message())
    assert _error(lambda: _infer(grpc, "acc", 1, 8002)).status() == "StatusCode.INVALID_ARGUMENT"
    two = _error(lambda: _infer(http, "acc", 1, 8003, start=True, batch=2))
    assert two.message() == (
        "inference request to model 'acc' must specify batch-size 1 due to requirements of "
        "sequence batcher"
    )
    # A request without any sequence id is sequence 0 to Triton, which was never started.
    assert "sequence 0 to model 'acc'" in str(_error(lambda: _infer(http, "acc", 1, 0)).message())
    http.close()
    grpc.close()


def test_sequence_parameters_of_the_wrong_type_are_refused(server: ServerThread) -> None:
    import json
    import urllib.error
    import urllib.request

    body = {
        "inputs": [{"name": "INPUT", "shape": [1, 1], "datatype": "INT32", "data": [1]}],
        "parameters": {"sequence_id": 1.5, "sequence_start": True},
    }
    request = urllib.request.Request(
        f"http://{server.http_url}/v2/models/acc/infer",
        data=json.dumps(body).encode(),
        method="POST",
    )
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(request, timeout=10)
    assert "Unable to parse 'sequence_id'" in caught.value.read().decode()


def test_statistics_count_sequence_executions(server: ServerThread) -> None:
    client = _http(server)
    for step in range(3):
        _infer(client, "acc_fp32", 1.0, 9001, start=step == 0, end=step == 2, dtype=np.float32)
    stats = client.get_inference_statistics("acc_fp32")["model_stats"][0]
    assert int(stats["inference_stats"]["success"]["count"]) >= 3
    assert any(int(b["batch_size"]) == 1 for b in stats["batch_stats"])
    client.close()


def test_make_repository_writes_a_loadable_layout(tmp_path: Path) -> None:
    make_repository(tmp_path)
    assert (tmp_path / "accumulator" / "config.pbtxt").is_file()
    assert (tmp_path / "accumulator" / "1").is_dir()


def test_unload_answers_backlogged_requests(server: ServerThread) -> None:
    client = _http(server)
    assert _infer(client, "acc_unload", 1, 9101, start=True)[0] == 1
    errors: dict[str, InferenceServerException] = {}

    def waiting() -> None:
        other = _http(server)
        errors["b"] = _error(lambda: _infer(other, "acc_unload", 5, 9102, start=True))
        other.close()

    thread = threading.Thread(target=waiting, daemon=True)
    thread.start()
    wait_until(lambda: _pending(server, "acc_unload") == 1, 10, "B in the backlog")
    client.unload_model("acc_unload")
    thread.join(10)
    # B's sequence could never get the slot A holds: it is answered, not left hanging.
    assert errors["b"].status() == "503"
    assert "stopped accepting new inference requests" in str(errors["b"].message())
    client.close()


def test_implicit_state_is_refused_at_load(server: ServerThread) -> None:
    client = _http(server)
    error = _error(lambda: client.load_model("acc_state"))
    assert "implicit state (sequence_batching.state) is not implemented" in str(error.message())
    client.close()


@pytest.mark.parametrize("model", ["acc_two", "acc_two_direct"])
def test_concurrent_sequences_on_two_instances_keep_their_sums(
    server: ServerThread, model: str
) -> None:
    # 10 sequences on 2 x 3 (oldest) or 2 x 4 (direct) slots: some wait in the backlog, slots
    # of both instances are reused; whatever the interleaving, every sum must be right.
    wrong: list[tuple[int, int, float, float]] = []

    def run(cid: int) -> None:
        client = _http(server)
        total = 0.0
        for step in range(8):
            value = cid * 100 + step
            total += value
            got, _ = _infer(client, model, value, cid, start=step == 0, end=step == 7)
            if got != total:
                wrong.append((cid, step, got, total))
        client.close()

    base = 10_000 if model == "acc_two" else 20_000
    threads = [threading.Thread(target=run, args=(base + k,)) for k in range(10)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not any(t.is_alive() for t in threads)
    assert wrong == []
