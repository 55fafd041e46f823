"""The report's GPU story as data: utilisation, memory and power of baseline and best side by
side, throughput per GPU-percent, ``--min-gpu-utilization`` flags; one line without GPU figures.

A planted run (the real sweep library, the planted fake with a planted GPU in every server view)
gives known figures; a CPU run record (no ``nv_gpu_*`` series) gives none.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from analyzer.report import build_record, load_run, write_report
from analyzer.report.gpu import NO_GPU_METRIC
from tests.gpu.planted_gpu import GpuLoadGenerator
from tests.report.conftest import ServerViewLoadGenerator, sweep_run_dir
from tests.report.test_html import embedded, parse
from tests.support.cli import perfsweep_in_process


@dataclass
class GpuServerView(GpuLoadGenerator, ServerViewLoadGenerator):
    """Windows and statistics as the Locust engine records them, plus the planted GPU."""


@pytest.fixture(scope="module")
def gpu_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("gpu") / "gpu-run"
    sweep_run_dir(root, trials=6, load_class=GpuServerView)
    return root


@pytest.fixture(scope="module")
def cpu_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("gpu") / "cpu-run"
    sweep_run_dir(root, trials=4, device="cpu")
    return root


def page_data(run: Path, tmp_path: Path, threshold: float | None = None) -> tuple[str, dict]:
    out = write_report(run, tmp_path / "report.html", min_gpu_utilization_pct=threshold)
    text, parser = parse(out)
    return text, embedded(parser)


def test_baseline_and_best_side_by_side(gpu_run: Path, tmp_path: Path) -> None:
    summary = json.loads((gpu_run / "summary.json").read_text())
    text, data = page_data(gpu_run, tmp_path)
    assert "gpu" not in data["missing"]
    sides = {s["role"]: s for s in data["gpu"]["sides"]}
    assert set(sides) == {"baseline", "best"}
    for role, side in sides.items():
        (gpu,) = summary[role]["gpus"]
        assert side["trial_number"] == summary[role]["trial_number"]
        assert side["utilization_pct_mean"] == pytest.approx(gpu["utilization_pct_mean"])
        assert side["memory_used_peak_mb"] == gpu["memory_used_peak_mb"]
        assert side["power_mean_w"] == pytest.approx(gpu["power_mean_w"])
        assert side["throughput_per_gpu_pct"] == pytest.approx(
            summary[role]["throughput_rps"] / gpu["utilization_pct_mean"], rel=1e-3
        )
        assert side["throughput_per_watt"] == pytest.approx(
            summary[role]["throughput_rps"] / gpu["power_mean_w"], rel=1e-3
        )
    base, best = sides["baseline"], sides["best"]
    # Batching does the same work in fewer, larger executions: more req/s per GPU-percent.
    assert best["throughput_per_gpu_pct"] > base["throughput_per_gpu_pct"]
    ratio = best["throughput_per_gpu_pct"] / base["throughput_per_gpu_pct"]
    assert any(f"({ratio:.2f}x)" in line for line in data["gpu"]["sentences"])
    assert 'id="gpu-table"' in text and 'id="gpu-missing"' not in text
    rows = re.search(r'id="gpu-table">.*?<tbody>(.*?)</tbody>', text, re.S)
    assert rows is not None and rows.group(1).count("<tr>") == 2


def test_min_gpu_utilization_flags_trials_and_verdict(gpu_run: Path, tmp_path: Path) -> None:
    record = build_record(load_run(gpu_run))
    utils = sorted(t.gpu_utilization_pct for t in record.trials if t.gpu_utilization_pct)
    assert len(set(utils)) > 2, "the planted run must spread its utilisations"
    threshold = round(utils[len(utils) // 2], 1)  # about half the configs below it
    text, data = page_data(gpu_run, tmp_path, threshold)
    below = [
        t["number"]
        for t in data["trials"]
        if t["gpu_utilization_pct"] is not None and t["gpu_utilization_pct"] < threshold
    ]
    assert below
    assert [t["number"] for t in data["trials"] if t["below_min_gpu_utilization"]] == below
    assert all(
        t["below_min_gpu_utilization"] is False
        for t in data["trials"]
        if t["gpu_utilization_pct"] is not None and t["number"] not in below
    )
    assert data["verdict"]["min_gpu_utilization_pct"] == threshold
    warning = next(w for w in data["verdict"]["warnings"] if "config(s) ran the GPU below" in w)
    assert f"{len(below)} config(s)" in warning
    assert text.count('class="lowgpu"') == len(below)
    # Without the flag nothing is flagged.
    plain = build_record(load_run(gpu_run))
    assert all(t.below_min_gpu_utilization is None for t in plain.trials)
    assert not any("min-gpu-utilization" in w for w in plain.verdict.warnings)


def test_cpu_run_says_so_in_one_line(cpu_run: Path, tmp_path: Path) -> None:
    text, data = page_data(cpu_run, tmp_path, threshold=60.0)
    summary = json.loads((cpu_run / "summary.json").read_text())
    assert summary["baseline"]["gpus"] is None and summary["server_gpus"] == []
    assert data["gpu"] is None and data["missing"]["gpu"] == NO_GPU_METRIC
    assert text.count('data-missing="gpu"') == 1 and 'id="gpu-table"' not in text
    assert all(t["gpu_utilization_pct"] is None for t in data["trials"])
    assert all(t["below_min_gpu_utilization"] is None for t in data["trials"])
    assert [w for w in data["verdict"]["warnings"] if "min-gpu-utilization" in w] == [
        "--min-gpu-utilization 60 % is not checked: no GPU utilisation was recorded."
    ]
    # No GPU figure, no GPU chart: the figures are the same set as on any run.
    assert not any("gpu" in f for f in re.findall(r'data-figure="([^"]+)"', text))


def test_cli_flag(
    gpu_run: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    out = tmp_path / "cli.html"
    args = ["report", str(gpu_run), "-o", str(out), "--min-gpu-utilization"]
    done = perfsweep_in_process(monkeypatch, capsys, *args, "100")
    assert done.returncode == 0, done.stderr
    data = embedded(parse(out)[1])
    assert data["verdict"]["min_gpu_utilization_pct"] == 100.0
    complete = [t for t in data["trials"] if t["state"] == "complete"]
    assert complete and all(t["below_min_gpu_utilization"] for t in complete)
    done = perfsweep_in_process(monkeypatch, capsys, *args, "120")
    assert done.returncode == 2
