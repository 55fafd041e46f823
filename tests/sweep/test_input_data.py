"""`perfsweep run` with the traffic described by `[input]`: a perf_analyzer data file, shapes.

A reference server the test starts (``--url``) serves identity models with the response cache
on. The cache is the witness of what the sweep sent: it holds a response per distinct input
bytes, keyed by model, version and bytes (not shape), and it outlives the sweep's reloads. So
after the sweep each of the file's entries, sent again, is a hit, and a value the file does
not hold is a miss.
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from analyzer.config.sections import data_digest
from analyzer.rundir.results import load_summary, load_trial_record
from tests.support.servers import cached_reference_server, write_model

pytestmark = pytest.mark.slow

CLI = [sys.executable, "-c", "from analyzer.cli import main; main()"]

MODEL = """
name: "{name}"
backend: "identity"
max_batch_size: 8
input {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ {dims} ] }}
output {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ {dims} ] }}
response_cache {{ enable: true }}
"""

SCENARIO = """
objective = "throughput"
[model]
name = "{model}"
url = "http://{url}"
[input]
{input}
[traffic]
min_rate_rps = 5.0
start_rps = 20.0
max_rate_rps = 40.0
[goals]
p99_ms = 1000.0
[space]
max_batch_size = [1, 8]
max_queue_delay_us = [0, 1000]
delay_steps = 2
instance_count = [1, 1]
[budget]
trials = 1
patience = 2
warmup_s = 0.3
window_s = 0.5
min_requests = 30
capacity_resolution = 0.5
validate_top = 0
[search]
strategy = "tpe"
"""

#: The file's entries as perf_analyzer's docs write them: a flat list reshaped to the model's
#: dims [3, 4], content with its shape, nested lists, and raw little-endian bytes in b64.
ENTRIES = [
    {"INPUT0": [float(i) for i in range(12)]},
    {"INPUT0": {"content": [0.5] * 12, "shape": [3, 4]}},
    {"INPUT0": [[1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 7.0, 8.0], [9.0, 10.0, 11.0, 12.0]]},
    {"INPUT0": {"b64": base64.b64encode(np.full(12, 7.0, dtype="<f4").tobytes()).decode()}},
]
#: The same entries as the server must have received them.
SENT = [
    np.arange(12, dtype=np.float32),
    np.full(12, 0.5, dtype=np.float32),
    np.arange(1, 13, dtype=np.float32),
    np.full(12, 7.0, dtype=np.float32),
]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, spawns: None) -> Iterator[str]:
    root = tmp_path_factory.mktemp("input-data")
    write_model(root / "repo", "echo", MODEL.format(name="echo", dims="3, 4"))
    write_model(root / "repo", "ragged", MODEL.format(name="ragged", dims="-1"))
    with cached_reference_server(root / "repo", 64 * 2**20) as url:
        yield url


def _cache(url: str, model: str) -> tuple[int, int]:
    with urllib.request.urlopen(f"http://{url}/v2/models/{model}/stats", timeout=30) as resp:
        stats = json.loads(resp.read())["model_stats"][0]["inference_stats"]
    return int(stats["cache_hit"]["count"]), int(stats["cache_miss"]["count"])


def _infer(url: str, model: str, values: np.ndarray) -> None:
    body = {
        "inputs": [
            {"name": "INPUT0", "shape": [1, 3, 4], "datatype": "FP32", "data": values.tolist()}
        ]
    }
    request = urllib.request.Request(
        f"http://{url}/v2/models/{model}/infer",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=30) as resp:
        assert resp.status == 200


def _run(*args: str, timeout_s: float = 280) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, "run", *args], capture_output=True, text=True, timeout=timeout_s)


def test_a_sweep_sends_the_data_file_and_records_it(server: str, tmp_path: Path) -> None:
    data = tmp_path / "scenario" / "data.json"
    data.parent.mkdir()
    data.write_text(json.dumps({"data": ENTRIES}))
    scenario = tmp_path / "scenario" / "echo.toml"
    # Relative to the scenario file, not to the working directory.
    scenario.write_text(SCENARIO.format(model="echo", url=server, input='data_file = "data.json"'))
    run_dir = tmp_path / "run"
    done = _run("--scenario", str(scenario), "--run-dir", str(run_dir))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    summary = load_summary(run_dir)
    trial = load_trial_record(run_dir / "trials" / "000" / "measurement.json")
    assert trial["state"] == "complete" and trial["measurement"]["points"]
    assert trial["error_rate"] == 0.0, "every request had the model's shape"
    recorded = summary["scenario"]["input"]
    assert recorded["data_file"] == str(data.resolve())
    assert recorded["data_sha256"] == data_digest(data)

    hits, misses = _cache(server, "echo")
    for values in SENT:
        _infer(server, "echo", values)
    assert _cache(server, "echo") == (hits + len(SENT), misses), "the sweep sent every entry"
    _infer(server, "echo", np.full(12, -3.0, dtype=np.float32))
    assert _cache(server, "echo") == (hits + len(SENT), misses + 1), "and only the file's"

    # A resumed run whose data file changed is refused, not continued with other data.
    data.write_text(json.dumps({"data": ENTRIES[:2]}))
    resumed = _run("--resume", str(run_dir))
    assert resumed.returncode == 2, resumed.stdout[-2000:] + resumed.stderr[-2000:]
    assert "changed since this scenario was recorded" in resumed.stderr


def test_a_variable_dim_without_shapes_names_the_flags_run_has(server: str, tmp_path: Path) -> None:
    scenario = tmp_path / "ragged.toml"
    scenario.write_text(SCENARIO.format(model="ragged", url=server, input=""))
    done = _run("--scenario", str(scenario), "--run-dir", str(tmp_path / "run"), timeout_s=120)
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-2000:]
    assert "--shape INPUT0:D" in done.stderr and "--input-data FILE" in done.stderr
    run_help = _run("--help").stdout
    assert "--shape" in run_help and "--input-data" in run_help
