"""Request tensors from model metadata, and recorder ticks merged across processes (pure, unpatched)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from analyzer.errors import InputError
from analyzer.load.inputs import DataMode, build_inputs, tensor_specs
from analyzer.load.recorder import Recorder, Tick
from analyzer.measure.histograms import LatencySummary

META = {
    "name": "m",
    "inputs": [
        {"name": "INPUT0", "datatype": "FP32", "shape": [-1, 16]},
        {"name": "IDS", "datatype": "INT64", "shape": [-1, 4]},
        {"name": "TEXT", "datatype": "BYTES", "shape": [-1, 1]},
    ],
    "outputs": [{"name": "OUTPUT0", "datatype": "FP32", "shape": [-1, 16]}],
}


@pytest.mark.usefixtures("spawns")
def test_importing_the_pure_modules_does_not_patch_the_process() -> None:
    # In a fresh interpreter: this pytest process may have imported the engine elsewhere.
    code = (
        "import sys, analyzer.load, analyzer.load.inputs, analyzer.load.recorder, "
        "analyzer.measure.measurement, analyzer.target.server_stats; "
        "assert 'locust' not in sys.modules and 'gevent' not in sys.modules, 'patched'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).parents[2])


@pytest.mark.usefixtures("takes_seconds")
def test_batched_shapes_replace_the_batch_dimension() -> None:
    inputs = build_inputs(META, {"max_batch_size": 8}, batch_size=4, seed=1)
    assert [s.shape for s in inputs.specs] == [(4, 16), (4, 4), (4, 1)]
    payload = inputs.payloads[0]
    assert payload["INPUT0"].dtype == np.float32 and payload["IDS"].dtype == np.int64
    assert payload["TEXT"].dtype == object and isinstance(payload["TEXT"][0, 0], bytes)
    assert inputs.outputs == ("OUTPUT0",)
    assert len(inputs.payloads) > 1  # random data rotates through several payloads
    again = build_inputs(META, {"max_batch_size": 8}, batch_size=4, seed=1)
    assert np.array_equal(again.payloads[0]["INPUT0"], payload["INPUT0"])  # seeded


def test_non_batching_model_and_zeros() -> None:
    meta = {"name": "m", "inputs": [{"name": "X", "datatype": "FP16", "shape": [3, 2]}]}
    inputs = build_inputs(meta, {"max_batch_size": 0}, mode=DataMode.ZEROS)
    assert inputs.specs[0].shape == (3, 2)
    assert not inputs.payloads[0]["X"].any() and len(inputs.payloads) == 1
    with pytest.raises(InputError, match="does not batch"):
        tensor_specs(meta, 0, batch_size=2)


def test_variable_dims_need_a_shape() -> None:
    meta = {"name": "m", "inputs": [{"name": "X", "datatype": "FP32", "shape": [-1, -1]}]}
    with pytest.raises(InputError, match="--shape"):
        tensor_specs(meta, 8)
    assert tensor_specs(meta, 8, 2, shapes={"X": [5]})[0].shape == (2, 5)
    with pytest.raises(InputError, match="outside"):
        tensor_specs(meta, 8, batch_size=9)


def test_npz_and_json_data_files(tmp_path: Path) -> None:
    meta = {"name": "m", "inputs": [{"name": "X", "datatype": "FP32", "shape": [-1, -1]}]}
    npz = tmp_path / "d.npz"
    np.savez(npz, X=np.arange(6, dtype=np.float32))  # no batch dim: repeated to batch size
    inputs = build_inputs(meta, {"max_batch_size": 4}, DataMode.FILE, batch_size=2, data_file=npz)
    assert inputs.payloads[0]["X"].shape == (2, 6)
    assert inputs.payloads[0]["X"][1, 5] == 5.0
    js = tmp_path / "d.json"
    js.write_text(
        json.dumps({"data": [{"X": {"content": [1, 2, 3, 4], "shape": [4]}}, {"X": [5, 6, 7, 8]}]})
    )
    inputs = build_inputs(meta, {"max_batch_size": 4}, DataMode.FILE, data_file=js)
    assert [p["X"].tolist() for p in inputs.payloads] == [[[1, 2, 3, 4]], [[5, 6, 7, 8]]]
    js.write_text("{}")
    with pytest.raises(InputError, match="data"):
        build_inputs(meta, {"max_batch_size": 4}, DataMode.FILE, data_file=js)


def test_ticks_from_processes_merge_exactly() -> None:
    recorders = [Recorder() for _ in range(3)]
    all_latencies = []
    for i in range(3000):
        r = recorders[i % 3]
        r.dispatched_one(0.0005)
        latency = 0.001 + (i % 97) * 0.0003
        all_latencies.append(latency)
        r.done(latency, latency / 2, "HTTP 503: busy" if i % 100 == 0 else None)
    merged = Tick.merge(r.take_tick() for r in recorders)
    assert merged.completed == merged.dispatched == 3000
    assert merged.errors == 30 and merged.error_kinds == {"HTTP 503: busy": 30}
    assert merged.in_flight == 0
    exact = sorted(all_latencies)
    summary = LatencySummary.from_histogram(merged.latency)
    assert summary.p99_ms == pytest.approx(exact[int(0.99 * 3000) - 1] * 1000, rel=0.002)
    # a tick is a delta: the next one starts empty
    assert Tick.merge(r.take_tick() for r in recorders).completed == 0


def test_ticks_add_over_time_and_track_in_flight() -> None:
    r = Recorder()
    r.dispatched_one(0.0)
    r.dispatched_one(0.0)
    first = Tick.merge([r.take_tick()])
    assert first.in_flight == 2 and first.max_in_flight == 2
    r.done(0.01, 0.01, None)
    second = Tick.merge([r.take_tick()])
    first.add(second)
    assert first.completed == 1 and first.in_flight == 1 and first.max_in_flight == 2
