"""`perfsweep run` with the traffic described by `[input]`: a perf_analyzer data file, shapes.

The data file's sweep runs in virtual time (``--server virtual``, in the test process): what it
pins is the run's record of the file (found beside the scenario, its bytes pinned by sha256)
and a resumed run's refusal once the file changed. What the load sends from the file is pinned
where the bytes are seen: ``tests/load/test_cli.py`` (a data file through Locust, every request
checked by a reference server), ``tests/load/test_inputs_forms.py`` (each of perf_analyzer's
forms to the tensors sent) and ``tests/unit/test_scenario_input.py`` (the scenario's data file
in the load engine's options, which the sweep's generator is built from).

A model with a variable dim and neither shapes nor a data file is refused when the load
generator reads the model's metadata from a server: that run starts one (``--url``).
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from analyzer.config.sections import data_digest
from analyzer.rundir.results import load_summary, load_trial_record
from tests.support.cli import perfsweep_in_process
from tests.support.servers import ReferenceProcess, write_model, write_sim_model
from tests.support.sweeps import virtual_sweep

CLI = [sys.executable, "-c", "from analyzer.cli import main; main()"]

#: An identity model whose one input has a variable dim.
RAGGED = """
name: "ragged"
backend: "identity"
max_batch_size: 8
input { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] }
output { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] }
"""

SCENARIO = """
objective = "throughput"
[model]
name = "{model}"
{where}
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


def _run(*args: str, timeout_s: float = 280) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, "run", *args], capture_output=True, text=True, timeout=timeout_s)


@pytest.mark.usefixtures("takes_seconds")
def test_a_sweep_records_the_data_file_and_a_changed_one_is_not_resumed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    repo = tmp_path / "repo"
    write_sim_model(repo, "echo", 1.0, 0.1, max_batch_size=8)
    # The model's input as the file's entries are shaped: [3, 4] floats.
    config = repo / "echo" / "config.pbtxt"
    config.write_text(config.read_text().replace("dims: [ 16 ]", "dims: [ 3, 4 ]"))
    data = tmp_path / "scenario" / "data.json"
    data.parent.mkdir()
    data.write_text(json.dumps({"data": ENTRIES}))
    scenario = tmp_path / "scenario" / "echo.toml"
    # Relative to the scenario file, not to the working directory.
    scenario.write_text(SCENARIO.format(model="echo", where="", input='data_file = "data.json"'))
    run_dir = tmp_path / "run"
    done = virtual_sweep(
        monkeypatch,
        capsys,
        *("--scenario", str(scenario), "--run-dir", str(run_dir)),
        *("--model-repository", str(repo), "--device", "sim"),
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    summary = load_summary(run_dir)
    trial = load_trial_record(run_dir / "trials" / "000" / "measurement.json")
    assert trial["state"] == "complete" and trial["measurement"]["points"]
    recorded = summary["scenario"]["input"]
    assert recorded["data_file"] == str(data.resolve())
    assert recorded["data_sha256"] == data_digest(data)

    # A resumed run whose data file changed is refused, not continued with other data.
    data.write_text(json.dumps({"data": ENTRIES[:2]}))
    resumed = virtual_sweep(monkeypatch, capsys, "--resume", str(run_dir))
    assert resumed.returncode == 2, resumed.stdout[-2000:] + resumed.stderr[-2000:]
    assert "changed since this scenario was recorded" in " ".join(resumed.stderr.split())


@pytest.mark.usefixtures("spawns")
@pytest.mark.slow
def test_a_variable_dim_without_shapes_names_the_flags_run_has(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    write_model(tmp_path / "repo", "ragged", RAGGED)
    scenario = tmp_path / "ragged.toml"
    with ReferenceProcess(tmp_path, repository=tmp_path / "repo") as server:
        where = f'url = "http://{server.http_url}"'
        scenario.write_text(SCENARIO.format(model="ragged", where=where, input=""))
        done = _run("--scenario", str(scenario), "--run-dir", str(tmp_path / "run"), timeout_s=120)
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-2000:]
    assert "--shape INPUT0:D" in done.stderr and "--input-data FILE" in done.stderr
    run_help = perfsweep_in_process(monkeypatch, capsys, "run", "--help").stdout
    assert "--shape" in run_help and "--input-data" in run_help
