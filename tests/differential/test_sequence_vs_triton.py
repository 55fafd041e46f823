"""The sequence batcher against the real Triton 2.51: same request stream, same batches.

Both servers serve the accumulator (:mod:`reference_server.zoo.accumulator`): Triton as a
Python-backend model (:data:`ACCUMULATOR_SOURCE`, the same contract), the reference server with
its own backend on a simulated device. Every reply carries the running sum of its sequence, the
size of the execution it ran in and the instance's execution counter, so the client sees which
requests ran together and whether any sequence's state was corrupted.

The oldest-strategy stream is deterministic by construction: preferred size 3 with a 1 s queue
delay, and executions of 1.5 s. The first batch forms when the third START arrives; the rest
of the stream is queued (each request is seen pending before the next is sent) while it runs.
From then on each batch forms the moment the third candidate's next request is issued (or, for
the last lone request, when the delay expires), which depends only on the strategy's rules.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.grpc import model_config_pb2 as mc
from tritonclient.utils import InferenceServerException

from reference_server.zoo.accumulator import accumulator_config
from tests.support.real_triton import RealTriton, TritonInstall
from tests.support.servers import ReferenceServer, ServerHandle, wait_until, write_model

pytestmark = [pytest.mark.triton, pytest.mark.slow]

EXEC_MS = 1500
DELAY_US = 1_000_000
IDLE_US = 200_000

#: The accumulator as a Triton Python-backend model (numpy 2 caveat: DLPack both ways).
ACCUMULATOR_SOURCE = '''\
"""Running sum per correlation id (written by tests/differential/test_sequence_vs_triton.py)."""

import json
import time

import numpy as np
import triton_python_backend_utils as pb_utils


def _value(request, name):
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return None if tensor is None else np.from_dlpack(tensor).copy()


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        delay = config.get("parameters", {}).get("execute_delay_ms", {}).get("string_value", "")
        self.delay_s = float(delay or 0) / 1000.0
        self.sums = {}
        self.executions = 0

    def execute(self, requests):
        self.executions += 1
        if self.delay_s:
            time.sleep(self.delay_s)
        responses = []
        for request in requests:
            value = _value(request, "INPUT")
            if int(_value(request, "READY").reshape(-1)[0]) == 1:
                key = int(_value(request, "CORRID").reshape(-1)[0])
                if int(_value(request, "START").reshape(-1)[0]) == 1 or key not in self.sums:
                    self.sums[key] = np.zeros_like(value)
                self.sums[key] = self.sums[key] + value
                total = self.sums[key]
                if int(_value(request, "END").reshape(-1)[0]) == 1:
                    del self.sums[key]
            else:
                total = np.zeros_like(value)
            outputs = [
                ("OUTPUT", total.astype(value.dtype)),
                ("BATCH_SIZE", np.full(value.shape, len(requests), dtype=np.int32)),
                ("EXECUTION", np.full(value.shape, self.executions, dtype=np.int64)),
            ]
            responses.append(
                pb_utils.InferenceResponse(
                    output_tensors=[
                        pb_utils.Tensor.from_dlpack(n, np.ascontiguousarray(a)) for n, a in outputs
                    ]
                )
            )
        return responses
'''

#: The reference server's device for the oldest stream: every execution takes EXEC_MS.
SLOW_PROFILE = f"""
name = "slow_step"
provenance = "SYNTHETIC: a fixed {EXEC_MS} ms per execution, for a deterministic test stream."
[device]
a_ms = {EXEC_MS}
"""


def _models(backend: str) -> list[mc.ModelConfig]:
    oldest = accumulator_config(
        "seq_oldest",
        max_batch_size=4,
        max_candidate_sequences=3,
        preferred=(3,),
        max_queue_delay_us=DELAY_US,
        backend=backend,
    )
    idle = accumulator_config("seq_idle", max_batch_size=4, max_idle_us=IDLE_US, backend=backend)
    string_ids = accumulator_config("seq_plain", max_batch_size=4, backend=backend)
    direct = accumulator_config("seq_direct", max_batch_size=4, oldest=False, backend=backend)
    for config in (oldest, idle, string_ids, direct):
        config.parameters["execute_delay_ms"].string_value = (
            str(EXEC_MS) if config is oldest else "0"
        )
    if backend != "python":
        oldest.parameters["profile"].string_value = "slow_step.toml"
    return [oldest, idle, string_ids, direct]


@contextmanager
def _server(kind: str, workdir: Path, install: TritonInstall) -> Iterator[ServerHandle]:
    """A server of ``kind`` with the three accumulator models loaded."""
    handle: ServerHandle
    if kind == "triton":
        triton = RealTriton(install, workdir)
        with triton:
            for config in _models("python"):
                triton.add_model(config, ACCUMULATOR_SOURCE)
                triton.load_model(config.name)
            yield triton
        return
    reference = ReferenceServer(workdir)
    with reference:
        for config in _models("accumulator"):
            files = {"slow_step.toml": SLOW_PROFILE} if config.name == "seq_oldest" else None
            write_model(reference.repository, config.name, config, files=files)
            reference.load_model(config.name)
        handle = reference
        yield handle


# ------------------------------------------------------------------------------ the stream


@dataclass(frozen=True)
class Send:
    """One request: ``value`` for sequence ``sequence`` with its START/END flags."""

    sequence: int
    value: int
    start: bool = False
    end: bool = False


#: Three candidate slots, four sequences: D waits in the backlog until B ends.
OLDEST_STREAM = (
    Send(1, 1, start=True),  # A
    Send(2, 10, start=True),  # B
    Send(3, 100, start=True),  # C: preferred size 3 -> the first batch runs
    Send(4, 1000, start=True),  # D: no free slot -> backlog
    Send(1, 2),
    Send(2, 20, end=True),
    Send(4, 2000, end=True),
    Send(3, 200),
    Send(1, 3, end=True),
    Send(3, 300, end=True),
)


@dataclass(frozen=True)
class Reply:
    """What one request got back: the running sum, its execution's size and number."""

    total: int
    batch_size: int
    execution: int


def _pending(server: ServerHandle, model: str) -> int:
    for line in server.metrics_text().splitlines():
        if line.startswith("nv_inference_pending_request_count{") and f'model="{model}"' in line:
            return int(float(line.rsplit(" ", 1)[1]))
    return 0


def _infer_http(
    url: str, model: str, send: Send, *, batch: int = 1, sequence_id: int | str | None = None
) -> Reply:
    client = httpclient.InferenceServerClient(url, network_timeout=120.0)
    try:
        tensor = httpclient.InferInput("INPUT", [batch, 1], "INT32")
        tensor.set_data_from_numpy(np.full((batch, 1), send.value, dtype=np.int32))
        reply = client.infer(
            model,
            [tensor],
            sequence_id=send.sequence if sequence_id is None else sequence_id,
            sequence_start=send.start,
            sequence_end=send.end,
        )
        return Reply(
            int(reply.as_numpy("OUTPUT")[0, 0]),
            int(reply.as_numpy("BATCH_SIZE")[0, 0]),
            int(reply.as_numpy("EXECUTION")[0, 0]),
        )
    finally:
        client.close()


def run_oldest(server: ServerHandle) -> tuple[tuple[tuple[int, ...], ...], dict[int, int]]:
    """Send :data:`OLDEST_STREAM`; return the executions (request indices, in order) and sums."""
    replies: dict[int, Reply | str] = {}

    def send(index: int, item: Send) -> None:
        try:
            replies[index] = _infer_http(server.http_url, "seq_oldest", item)
        except InferenceServerException as exc:
            replies[index] = str(exc.message())

    threads = []
    for index, item in enumerate(OLDEST_STREAM):
        thread = threading.Thread(target=send, args=(index, item), daemon=True)
        thread.start()
        threads.append(thread)
        if index < 2:
            expect = index + 1  # queued in the dynamic batcher, short of the preferred size
        elif index == 2:
            expect = 0  # the third START completed the first batch: all three run
        else:
            expect = index - 2  # everything else waits while the first batch runs
        wait_until(
            lambda e=expect: _pending(server, "seq_oldest") == e,
            30,
            f"{expect} requests pending after request {index}",
        )
    for thread in threads:
        thread.join(120)
    assert len(replies) == len(OLDEST_STREAM), replies
    failed = {i: r for i, r in replies.items() if isinstance(r, str)}
    assert not failed, failed
    ok = {i: r for i, r in replies.items() if isinstance(r, Reply)}
    executions: dict[int, list[int]] = {}
    for index, reply in sorted(ok.items()):
        executions.setdefault(reply.execution, []).append(index)
    for members in executions.values():
        assert len({ok[i].batch_size for i in members}) == 1
        assert ok[members[0]].batch_size == len(members), "an execution held unseen requests"
    groups = tuple(tuple(executions[e]) for e in sorted(executions))
    return groups, {i: r.total for i, r in ok.items()}


def _error_http(server: ServerHandle, model: str, send: Send, **kw: Any) -> str:
    try:
        reply = _infer_http(server.http_url, model, send, **kw)
    except InferenceServerException as exc:
        return f"{exc.status()}: {exc.message()}"
    return f"answered {reply}"


def _error_grpc(server: ServerHandle, model: str, send: Send) -> str:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        tensor = grpcclient.InferInput("INPUT", [1, 1], "INT32")
        tensor.set_data_from_numpy(np.full((1, 1), send.value, dtype=np.int32))
        client.infer(
            model,
            [tensor],
            sequence_id=send.sequence,
            sequence_start=send.start,
            sequence_end=send.end,
        )
    except InferenceServerException as exc:
        return f"{exc.status()}: {exc.message()}"
    finally:
        client.close()
    return "answered"


#: Direct strategy, one request at a time: A holds slot 0, B slot 1, C (after A ends) slot 0.
DIRECT_STREAM = (
    Send(11, 1, start=True),
    Send(12, 10, start=True),
    Send(11, 2, end=True),
    Send(12, 20),
    Send(13, 100, start=True),
    Send(12, 30, end=True),
    Send(13, 200, end=True),
)


def run_direct(server: ServerHandle) -> list[tuple[int, int]]:
    """(running sum, execution size) of each request of :data:`DIRECT_STREAM`, sent in turn."""
    replies = [_infer_http(server.http_url, "seq_direct", send) for send in DIRECT_STREAM]
    return [(reply.total, reply.batch_size) for reply in replies]


def direct_statistics(server: ServerHandle) -> tuple[int, dict[int, int]]:
    """``seq_direct``'s success count and ``{batch size: executions}`` after the stream.

    Triton's Python backend reports statistics just after the responses: wait for all seven
    executions to be counted.
    """
    seen: dict[str, Any] = {}

    def counted() -> bool:
        status, body = server.http_status("GET", "/v2/models/seq_direct/stats")
        assert status == 200, body
        stats = json.loads(body)["model_stats"][0]
        seen["success"] = int(stats["inference_stats"]["success"]["count"])
        seen["batches"] = {
            int(b["batch_size"]): int(b["compute_infer"]["count"]) for b in stats["batch_stats"]
        }
        return sum(seen["batches"].values()) >= len(DIRECT_STREAM)

    wait_until(counted, 10, "statistics of seq_direct")
    return seen["success"], seen["batches"]


def observe_errors(server: ServerHandle) -> dict[str, Any]:
    """The replies to requests a sequence batcher must refuse, and to an idle sequence."""
    seen: dict[str, Any] = {
        "no_start_http": _error_http(server, "seq_plain", Send(77, 1)),
        "no_start_grpc": _error_grpc(server, "seq_plain", Send(78, 1)),
        "batch_of_two": _error_http(server, "seq_plain", Send(79, 1, start=True), batch=2),
        "string_id": _error_http(server, "seq_plain", Send(0, 1, start=True), sequence_id="s1"),
    }
    started = _infer_http(server.http_url, "seq_idle", Send(5, 7, start=True))
    seen["idle_start"] = started.total
    # The feature under test is a timeout: time has to pass (five idle periods, so that the
    # reaper, which looks once per period, has freed the slot).
    time.sleep(5 * IDLE_US / 1e6)
    seen["idle_continue"] = _error_http(server, "seq_idle", Send(5, 1))
    seen["idle_restart"] = _infer_http(server.http_url, "seq_idle", Send(5, 2, start=True)).total
    seen["ended_continue"] = _error_http(server, "seq_plain", Send(80, 1, start=True, end=True))
    seen["after_end"] = _error_http(server, "seq_plain", Send(80, 1))
    return seen


def _invalid(name: str, edit: str) -> mc.ModelConfig:
    """A ``seq_plain``-like config with one thing wrong (``edit`` names what)."""
    config = accumulator_config(name, max_batch_size=4, backend="python")
    sb = config.sequence_batching
    kinds = mc.ModelSequenceBatching.Control
    if edit == "unnamed":
        sb.control_input.add().control.add(kind=kinds.CONTROL_SEQUENCE_END, int32_false_true=[0, 1])
    elif edit == "tensor_twice":
        sb.control_input.add(name="START").control.add(
            kind=kinds.CONTROL_SEQUENCE_END, int32_false_true=[0, 1]
        )
    elif edit == "start_twice":
        sb.control_input.add(name="START2").control.add(
            kind=kinds.CONTROL_SEQUENCE_START, int32_false_true=[0, 1]
        )
    elif edit == "no_values":
        del sb.control_input[0].control[0].int32_false_true[:]
    elif edit == "two_value_kinds":
        sb.control_input[0].control[0].fp32_false_true.extend([0.0, 1.0])
    elif edit == "three_values":
        sb.control_input[0].control[0].int32_false_true.append(2)
    elif edit == "corrid_values":
        sb.control_input[3].control[0].int32_false_true.extend([0, 1])
    elif edit == "corrid_fp32":
        sb.control_input[3].control[0].data_type = mc.TYPE_FP32
    elif edit == "preferred_zero":
        sb.oldest.preferred_batch_size.append(0)
    elif edit == "preferred_too_big":
        sb.oldest.preferred_batch_size.append(5)
    elif edit == "utilization":
        sb.ClearField("oldest")
        sb.direct.minimum_slot_utilization = 1.5
    elif edit == "cache":
        config.response_cache.enable = True
    else:
        raise AssertionError(edit)
    return config


INVALID = (
    "unnamed",
    "tensor_twice",
    "start_twice",
    "no_values",
    "two_value_kinds",
    "three_values",
    "corrid_values",
    "corrid_fp32",
    "preferred_zero",
    "preferred_too_big",
    "utilization",
    "cache",
)


def _config_reasons(kind: str, server: ServerHandle) -> dict[str, str]:
    """Why each invalid config fails to load: the reference's reply, Triton's log line."""
    reasons = {}
    for edit in INVALID:
        config = _invalid(f"bad_{edit}", edit)
        if kind == "triton":
            assert isinstance(server, RealTriton)
            server.add_model(config, ACCUMULATOR_SOURCE)
        else:
            config.backend = "accumulator"
            write_model(server.repository, config.name, config)
        status, body = server.http_status(
            "POST", f"/v2/repository/models/{config.name}/load", {}, timeout_s=120
        )
        assert status != 200, f"{edit} loaded"
        if kind == "triton":
            lines = [line for line in server.log_tail(200_000).splitlines() if config.name in line]
            reasons[edit] = "\n".join(lines)
        else:
            reasons[edit] = json.loads(body)["error"].split(
                "failed to poll from model repository: "
            )[-1]
    return reasons


@pytest.fixture(scope="module")
def observations(
    triton_install: TritonInstall, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, dict[str, Any]]:
    """Every observation on both servers: {kind: {name: value}}."""
    out: dict[str, dict[str, Any]] = {}
    for kind in ("triton", "reference"):
        with _server(kind, tmp_path_factory.mktemp(f"seq_{kind}"), triton_install) as server:
            groups, totals = run_oldest(server)
            out[kind] = {"oldest_batches": groups, "oldest_totals": totals}
            out[kind]["direct"] = run_direct(server)
            out[kind]["direct_statistics"] = direct_statistics(server)
            out[kind].update(observe_errors(server))
            out[kind]["config_reasons"] = _config_reasons(kind, server)
    return out


def test_triton_forms_the_expected_oldest_batches(observations: dict[str, dict[str, Any]]) -> None:
    triton = observations["triton"]
    # A, B, C start together; B's END frees its slot for D (backlog) while C and A go on;
    # D's END runs alone once the queue delay expires.
    assert triton["oldest_batches"] == ((0, 1, 2), (4, 5, 7), (3, 8, 9), (6,))
    sums = {1: 0, 2: 0, 3: 0, 4: 0}
    expected = {}
    for index, send in enumerate(OLDEST_STREAM):
        sums[send.sequence] += send.value
        expected[index] = sums[send.sequence]
    assert triton["oldest_totals"] == expected
    assert "must specify the START flag" in triton["no_start_http"]
    assert "must specify the START flag" in triton["idle_continue"]
    assert triton["idle_restart"] == 2
    # Direct: a request in slot 1 runs beside a null request for the empty slot 0.
    assert triton["direct"] == [(1, 1), (10, 2), (3, 1), (30, 2), (100, 1), (60, 2), (300, 1)]
    # Null requests count in the executions' batch sizes, not as successful inferences.
    assert triton["direct_statistics"] == (7, {1: 4, 2: 3})


@pytest.mark.parametrize(
    "name",
    [
        "oldest_batches",
        "oldest_totals",
        "direct",
        "direct_statistics",
        "no_start_http",
        "no_start_grpc",
        "batch_of_two",
        "string_id",
        "idle_start",
        "idle_continue",
        "idle_restart",
        "ended_continue",
        "after_end",
    ],
)
def test_reference_sequences_like_triton(
    name: str, observations: dict[str, dict[str, Any]]
) -> None:
    reference, triton = observations["reference"][name], observations["triton"][name]
    assert reference == triton, f"{name}:\n  reference: {reference}\n  triton:    {triton}"


@pytest.mark.parametrize("edit", INVALID)
def test_invalid_sequence_config_refused_with_tritons_reason(
    edit: str, observations: dict[str, dict[str, Any]]
) -> None:
    reference = observations["reference"]["config_reasons"][edit]
    triton_log = observations["triton"]["config_reasons"][edit]
    assert reference and reference in triton_log, (
        f"{edit}:\n  reference: {reference}\n  triton log: {triton_log}"
    )
