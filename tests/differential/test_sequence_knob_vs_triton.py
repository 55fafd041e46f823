"""The knobs of a stateful model (``apply_knobs`` into ``sequence_batching.oldest``) on the real
Triton 2.51.

The accumulator (:mod:`reference_server.zoo.accumulator`; on Triton the Python-backend model of
``test_sequence_vs_triton``) is loaded once, then given every config a sweep of the oldest
strategy writes, the way the sweep pushes them (``POST .../load`` with the config as JSON). Each
must load, report a config that reads back as the same knobs (``knobs_of``), with the sequence
batcher still in place, and still keep every sequence's state: a stream of two interleaved
sequences sums as it should. The reference server must report the same.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.grpc import model_config_pb2 as mc

from analyzer.config.knobs import Knobs
from analyzer.config.model_config import apply_knobs, knobs_of
from reference_server.core.config import config_from_json
from reference_server.zoo.accumulator import accumulator_config
from tests.differential.test_sequence_vs_triton import ACCUMULATOR_SOURCE
from tests.support.real_triton import RealTriton, TritonInstall
from tests.support.servers import ReferenceServer, ServerHandle, model_config_json, write_model

pytestmark = [pytest.mark.triton, pytest.mark.slow]

MODEL = "seq_knobs"

#: What a sweep of the oldest strategy writes: delays, preferred sizes, instances, candidates.
CHOICES = (
    Knobs(8, 0),
    Knobs(8, 2000, (8, 4), 1, max_candidate_sequences=4),
    Knobs(4, 500, (4, 2), 2, max_candidate_sequences=16),
    Knobs(16, 100, (), 3, max_candidate_sequences=1),
)

#: (sequence, value, start, end): two sequences interleaved, one request in flight at a time.
STREAM = (
    (1, 1, True, False),
    (2, 10, True, False),
    (1, 2, False, False),
    (2, 20, False, True),
    (1, 3, False, True),
)
#: The running sum each request of :data:`STREAM` gets back.
SUMS = [1, 10, 3, 30, 6]


def _base(backend: str) -> mc.ModelConfig:
    config = accumulator_config(MODEL, max_batch_size=8, backend=backend)
    config.parameters["execute_delay_ms"].string_value = "0"
    return config


def _load(server: ServerHandle, config: mc.ModelConfig) -> None:
    """Load ``config`` as the sweep does: the JSON as written (``ServerHandle.load_model``
    would give the reference server its identity backend instead)."""
    body = {"parameters": {"config": model_config_json(config)}}
    status, reply = server.http_status(
        "POST", f"/v2/repository/models/{MODEL}/load", body, timeout_s=120
    )
    assert status == 200, reply


def _reported(server: ServerHandle) -> mc.ModelConfig:
    status, body = server.http_status("GET", f"/v2/models/{MODEL}/config")
    assert status == 200, body
    return config_from_json(json.dumps(json.loads(body)))


def _sums(server: ServerHandle, offset: int) -> list[int]:
    client = httpclient.InferenceServerClient(server.http_url, network_timeout=60.0)
    out = []
    try:
        for sequence, value, start, end in STREAM:
            tensor = httpclient.InferInput("INPUT", [1, 1], "INT32")
            tensor.set_data_from_numpy(np.full((1, 1), value, dtype=np.int32))
            reply = client.infer(
                MODEL,
                [tensor],
                sequence_id=offset + sequence,
                sequence_start=start,
                sequence_end=end,
            )
            out.append(int(reply.as_numpy("OUTPUT")[0, 0]))
    finally:
        client.close()
    return out


def _run(server: ServerHandle, base: mc.ModelConfig) -> list[dict[str, object]]:
    seen: list[dict[str, object]] = []
    for index, knobs in enumerate(CHOICES):
        written = apply_knobs(base, knobs)
        assert not written.HasField("dynamic_batching")
        _load(server, written)
        reported = _reported(server)
        seen.append(
            {
                "knobs": knobs_of(reported),
                "scheduling": reported.WhichOneof("scheduling_choice"),
                "oldest": reported.sequence_batching.HasField("oldest"),
                "sums": _sums(server, 100 * (index + 1)),
            }
        )
    return seen


@pytest.fixture(scope="module")
def runs(
    triton_install: TritonInstall, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, list[dict[str, object]]]:
    workdir: Path = tmp_path_factory.mktemp("sequence_knobs")
    out: dict[str, list[dict[str, object]]] = {}
    triton_base = _base("python")
    with RealTriton(triton_install, workdir / "triton") as triton:
        triton.add_model(triton_base, ACCUMULATOR_SOURCE)
        triton.load_model(MODEL)
        out["triton"] = _run(triton, triton_base)
    reference_base = _base("accumulator")
    reference = ReferenceServer(workdir / "reference")
    with reference:
        write_model(reference.repository, MODEL, reference_base)
        reference.load_model(MODEL)
        out["reference"] = _run(reference, reference_base)
    return out


def test_triton_loads_every_oldest_config_and_reports_the_same_knobs(
    runs: dict[str, list[dict[str, object]]],
) -> None:
    for knobs, seen in zip(CHOICES, runs["triton"], strict=True):
        assert seen["knobs"] == knobs
        assert seen["scheduling"] == "sequence_batching" and seen["oldest"]


def test_every_config_keeps_each_sequence_state(
    runs: dict[str, list[dict[str, object]]],
) -> None:
    for seen in runs["triton"]:
        assert seen["sums"] == SUMS


def test_the_reference_server_reports_the_same(runs: dict[str, list[dict[str, object]]]) -> None:
    assert runs["reference"] == runs["triton"]
