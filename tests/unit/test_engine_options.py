"""The one factory of load-engine options from a scenario (sweep and gate), without gevent."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from analyzer.config.scenario import load_scenario
from analyzer.load.engine import EngineOptions, engine_options
from analyzer.load.inputs import DataMode, InputOptions

TOML = """\
[model]
name = "m"
[input]
data = "zeros"
batch_size = 4
[traffic]
workers = 3
expect_workers = 2
master_bind_host = "0.0.0.0"
master_port = 6000
"""


def test_gate_options_take_the_inputs_and_one_generator_process(tmp_path: Path) -> None:
    path = tmp_path / "s.toml"
    path.write_text(TOML)
    s = load_scenario(path, env={})
    options = engine_options(s, "http://127.0.0.1:8000", "m", metrics_url="http://h:8002/metrics")
    assert options == EngineOptions(
        url="127.0.0.1:8000",
        model="m",
        protocol="http",
        inputs=InputOptions(mode=DataMode.ZEROS, batch_size=4),
        metrics_url="http://h:8002/metrics",
    )


@pytest.mark.usefixtures("spawns")
def test_building_options_does_not_patch_the_process() -> None:
    code = (
        "import sys; import analyzer.load.engine, analyzer.gate.run; "
        "assert 'gevent' not in sys.modules and 'locust' not in sys.modules"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def test_distributed_options_take_the_traffic_section_and_overrides(tmp_path: Path) -> None:
    path = tmp_path / "s.toml"
    path.write_text(TOML)
    s = load_scenario(path, env={})
    options = engine_options(s, "127.0.0.1:8000", "m", distributed=True, max_send_lag_ms=25.0)
    assert (options.workers, options.expect_remote_workers) == (3, 2)
    assert (options.master_bind_host, options.master_port) == ("0.0.0.0", 6000)
    assert options.max_send_lag_ms == 25.0
    local = load_scenario(None, {"traffic.workers": 2}, env={})
    # Local workers only: the master takes a free port (remote workers would need to know it).
    assert engine_options(local, "h:1", "m", distributed=True).master_port == 0
