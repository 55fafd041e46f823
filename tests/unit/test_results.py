"""Run directory: atomic versioned JSON, loaders that refuse unknown versions, trials.csv, report."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pandas as pd
import pytest
from tritonclient.grpc import model_config_pb2 as mc

from analyzer.documents import FORMATS, TRIAL_KIND
from analyzer.errors import ResultFormatError
from analyzer.rundir.results import (
    TRIAL_COLUMNS,
    RunDirectory,
    environment,
    load_summary,
    load_trial_record,
    minimal_report,
    new_run_id,
    parse_config_text,
    write_json,
)
from analyzer.rundir.summary import RunSummary


def record(number: int, **extra: object) -> dict:
    base = {
        "number": number,
        "source": "search",
        "state": "complete",
        "config": {
            "max_batch_size": 8,
            "max_queue_delay_us": 100,
            "preferred_batch_size": [8, 4],
            "instance_count": 2,
        },
        "throughput_rps": 100.0 + number,
        "offered_rps": 100.0,
        "p50_ms": 1.0,
        "p90_ms": 2.0,
        "p99_ms": 3.0,
        "error_rate": 0.0,
        "meets_goals": True,
        "constraints": {"p99_slack": -0.5},
        "failure": None,
        "duration_s": 1.5,
    }
    base.update(extra)
    return base


def test_trial_records_and_csv_are_written_per_trial(tmp_path: Path) -> None:
    run = RunDirectory(tmp_path)
    run.write_trial(record(3))
    run.write_trial(
        record(
            -1,
            source="baseline",
            config={
                "max_batch_size": 8,
                "max_queue_delay_us": 0,
                "preferred_batch_size": [],
                "instance_count": 1,
                "dynamic_batching": False,
            },
        )
    )
    run.write_trial(record(1, state="failed", failure="load refused"))
    assert (tmp_path / "trials" / "003" / "measurement.json").exists()
    assert (tmp_path / "baseline" / "measurement.json").exists()
    frame = pd.read_csv(run.trials_csv)
    assert list(frame.columns) == list(TRIAL_COLUMNS)
    assert list(frame["number"]) == [-1, 1, 3]
    assert frame.loc[frame.number == 3, "preferred_batch_size"].item() == "8 4"
    assert frame.loc[frame.number == 1, "failure"].item() == "load refused"
    loaded = load_trial_record(tmp_path / "trials" / "003" / "measurement.json")
    assert (
        loaded["format_version"] == FORMATS[TRIAL_KIND].current
        and loaded["throughput_rps"] == 103.0
    )
    # A fresh RunDirectory (resume) rebuilds its rows from disk.
    again = RunDirectory(tmp_path)
    assert [r.number for r in again.load_existing_trials()] == [-1, 1, 3]
    assert not list(tmp_path.rglob(".*.json.*"))  # no temp files left behind
    umask = os.umask(0)
    os.umask(umask)
    assert (tmp_path / "trials.csv").stat().st_mode & 0o777 == 0o666 & ~umask  # not mkstemp's 0600


def test_loaders_refuse_unknown_versions_and_kinds(tmp_path: Path) -> None:
    path = tmp_path / "summary.json"
    write_json(path, {"format_version": 99, "kind": "perfsweep.summary"})
    with pytest.raises(ResultFormatError, match=r"format_version 99.*reads version 1"):
        load_summary(tmp_path)
    write_json(path, {"format_version": 1, "kind": "perfsweep.load"})
    with pytest.raises(ResultFormatError, match=r"not a perfsweep\.summary"):
        load_summary(path)
    path.write_text("{broken")
    with pytest.raises(ResultFormatError, match="not valid JSON"):
        load_summary(path)
    with pytest.raises(ResultFormatError, match="does not exist"):
        load_summary(tmp_path / "missing.json")


def test_config_files_are_triton_text_format(tmp_path: Path) -> None:
    config = mc.ModelConfig(name="m", max_batch_size=16, backend="python")
    config.dynamic_batching.preferred_batch_size.extend([16, 8])
    config.dynamic_batching.max_queue_delay_microseconds = 500
    config.instance_group.add(count=2, kind=mc.ModelInstanceGroup.KIND_CPU)
    run = RunDirectory(tmp_path)
    path = run.write_best(config)
    assert path == tmp_path / "best" / "config.pbtxt"
    assert parse_config_text(path.read_text()) == config
    paths = run.write_pareto([config, config])
    assert [p.relative_to(tmp_path).as_posix() for p in paths] == [
        "pareto/01/config.pbtxt",
        "pareto/02/config.pbtxt",
    ]


def test_minimal_report_escapes_and_embeds_the_summary() -> None:
    summary = {
        "run_id": "r",
        "model": "<script>alert(1)</script>",
        "device": "sim",
        "goals": {"p99_ms": 5},
        "gain": 2.5,
        "baseline": None,
        "best": None,
    }
    page = minimal_report(RunSummary.from_dict(summary), [record(0, failure="</script><b>")])
    assert "<script>alert(1)" not in page
    assert "&lt;script&gt;alert(1)" in page
    start = page.index('id="perfsweep-summary">') + len('id="perfsweep-summary">')
    embedded = page[start : page.index("</script>", start)]
    assert json.loads(embedded)["model"] == summary["model"]
    assert "2.50x" in page


def test_environment_and_run_id() -> None:
    env = environment("abc", {"kind": "fake"})
    assert env["scenario_hash"] == "abc" and env["target"] == {"kind": "fake"}
    assert "optuna" in env["packages"] and env["cpu_count"]
    assert new_run_id("resnet50").startswith("resnet50-")
