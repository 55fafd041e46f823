"""A sweep under two arrival shapes on the simulated device, in virtual time: each config's
capacity is searched under both, the config stands for the worse one, and the report sets each
shape's pick beside the worst-case pick.

Two configs of a simulated model (5 ms host, 10 ms + 1 ms an item on the device, 5 ms host;
``max_batch_size`` 8 on one or two instances) under Poisson arrivals and gamma arrivals of CV 2
(bursty). That bursts can reorder configs is shown by the simulator given the same arrivals
(``tests/predict/test_bursts_change_the_pick.py``).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from analyzer.rundir import records
from analyzer.rundir.measurements import ShapesMeasurement
from tests.support.servers import write_sim_model
from tests.support.sweeps import virtual_sweep

pytestmark = [pytest.mark.usefixtures("takes_seconds")]

BURSTS = "gamma:cv=2"

SCENARIO = f"""
objective = "throughput"
[model]
name = "shaped"
[traffic]
arrival = ["poisson", "{BURSTS}"]
min_rate_rps = 10.0
start_rps = 100.0
max_rate_rps = 800.0
[goals]
p99_ms = 60.0
max_error_rate = 0.01
[space]
max_batch_size = [8, 8]
max_queue_delay_us = [0, 0]
delay_steps = 1
preferred_batch_size = "none"
instance_count = [1, 2]
[budget]
trials = 2
patience = 20
warmup_s = 0.5
window_s = 0.5
min_requests = 100
capacity_resolution = 0.3
validate_top = 0
[search]
strategy = "grid"
"""


def test_each_config_stands_for_its_worst_shape(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    write_sim_model(
        tmp_path / "repo",
        "shaped",
        10.0,
        per_item_ms=1.0,
        host_ms=5.0,
        max_batch_size=8,
        dynamic_batching="dynamic_batching { }",
    )
    scenario = tmp_path / "shaped.toml"
    scenario.write_text(SCENARIO)
    run_dir = tmp_path / "run"
    done = virtual_sweep(
        monkeypatch,
        capsys,
        *("--scenario", str(scenario), "--model-repository", str(tmp_path / "repo")),
        *("--model", "shaped", "--report", "--device", "sim", "--run-dir", str(run_dir)),
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    words = " ".join(done.stdout.split())  # the console wraps its lines
    assert "each config's worst capacity under: poisson; gamma (cv 2)" in words
    trials = [
        records.load_trial(p) for p in sorted((run_dir / "trials").glob("*/measurement.json"))
    ]
    assert len(trials) == 2 and all(t.complete for t in trials)
    caps = {}
    for t in trials:
        assert isinstance(t.measurement, ShapesMeasurement)
        caps[t.number] = t.measurement.capacities()
        assert set(caps[t.number]) == {"poisson", BURSTS}
        # The trial stands for its worst shape: its figures are that search's.
        assert t.throughput_rps == min(caps[t.number].values()) > 0
        assert t.measurement.capacity.best is not None
        assert t.measurement.capacity.best.arrival == t.measurement.worst_shape
    print("capacities:", caps)
    summary = json.loads((run_dir / "summary.json").read_text())
    worst_case = max(caps, key=lambda n: min(caps[n].values()))
    assert summary["best"]["trial_number"] == worst_case
    # The report sets each shape's pick beside the worst-case pick, with every capacity.
    page = (run_dir / "report.html").read_text()
    assert "Capacity by arrival shape" in page
    found = re.search(r'id="perfsweep-data">(.*?)</script>', page, re.S)
    assert found is not None
    shapes = json.loads(found.group(1))["shapes"]
    assert shapes["shapes"] == ["poisson", BURSTS]
    picks = {p["chosen_for"]: p for p in shapes["picks"]}
    for shape in ("poisson", BURSTS):
        pick = max(caps, key=lambda n, s=shape: caps[n][s])
        assert picks[shape]["trial_number"] == pick
        assert picks[shape]["capacities"] == [caps[pick]["poisson"], caps[pick][BURSTS]]
    assert picks["worst case"]["trial_number"] == worst_case
