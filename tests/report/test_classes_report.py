"""A run with a priority mix splits latency by class in the report.

The planted run's goal is p99 <= 25 ms. Its best and baseline records get traffic classes at
their operating point (urgent: priority 1, its own 12.5 ms goal; bulk: the run's goal, the
baseline's with rejected requests) and the
scenario gets the matching ``[[traffic.classes]]``; the report is built and rendered. A run
without classes looks exactly as before.
"""

from __future__ import annotations

import dataclasses
import html
import json
import re
from pathlib import Path

import pytest

from analyzer.config.scenario import Scenario
from analyzer.measure.measurement import ClassStats, Measurement
from analyzer.report import build_record, load_run
from analyzer.report.classes import ClassedReportRecord, run_goals
from analyzer.report.render import render_report
from analyzer.report.rundir import RunData
from analyzer.rundir.measurements import CapacityMeasurement
from analyzer.rundir.trial_record import TrialRecord

RUN_GOAL_MS = 25.0
URGENT_GOAL_MS = 12.5


def _classes(urgent_p99: float, bulk_errors: int) -> tuple[ClassStats, ...]:
    return (
        ClassStats("urgent", 1, 0.2, 0, 200, 0, 4.0, 6.0, urgent_p99),
        ClassStats("bulk", 0, 0.8, 5000, 800, bulk_errors, 10.0, 15.0, 22.0),
    )


def _with_classes(record: TrialRecord, classes: tuple[ClassStats, ...]) -> TrialRecord:
    assert isinstance(record.measurement, CapacityMeasurement)
    result = record.measurement.result

    def add(m: Measurement | None) -> Measurement | None:
        return dataclasses.replace(m, classes=classes) if m is not None else None

    result = dataclasses.replace(
        result,
        best=add(result.best),
        points=tuple(add(p) for p in result.points),  # type: ignore[misc]
    )
    return dataclasses.replace(record, measurement=CapacityMeasurement(result))


def _scenario_toml(run: RunData) -> str:
    goals = dict(run.summary.goals)
    assert goals["p99_ms"] == RUN_GOAL_MS  # the planted sweep's
    scenario = Scenario.model_validate(
        {
            "goals": {"p99_ms": goals["p99_ms"], "max_error_rate": goals["max_error_rate"]},
            "traffic": {
                "classes": [
                    {"name": "urgent", "share": 0.2, "priority": 1, "p99_ms": URGENT_GOAL_MS},
                    {"name": "bulk", "share": 0.8, "timeout_us": 5000},
                ]
            },
        }
    )
    return scenario.to_toml()


@pytest.fixture(scope="module")
def mixed_run(planted_run: Path) -> RunData:
    run = load_run(planted_run)
    best, baseline = run.summary.best, run.summary.baseline
    assert best is not None and baseline is not None
    # The best: every class within its goal; the baseline: urgent over its own 12.5 ms (though
    # within the run's 25 ms), bulk rejected.
    planted = {
        best.trial_number: _classes(urgent_p99=9.0, bulk_errors=0),
        baseline.trial_number: _classes(urgent_p99=18.0, bulk_errors=40),
    }
    trials = tuple(
        _with_classes(r, planted[r.number]) if r.number in planted else r for r in run.trials
    )
    return dataclasses.replace(run, trials=trials, scenario_toml=_scenario_toml(run))


def test_the_goals_per_class_come_from_the_scenario(mixed_run: RunData) -> None:
    goals = run_goals(mixed_run)
    assert goals is not None
    assert goals.class_p99_ms("urgent") == URGENT_GOAL_MS
    assert goals.class_p99_ms("bulk") == RUN_GOAL_MS


def test_best_and_baseline_get_a_table_per_class(mixed_run: RunData) -> None:
    record = build_record(mixed_run)
    assert isinstance(record, ClassedReportRecord)
    tables = {t.role: t for t in record.classes}
    assert set(tables) == {"best", "baseline"}
    best = {row.name: row for row in tables["best"].rows}
    assert [row.name for row in tables["best"].rows] == ["urgent", "bulk"]
    assert (best["urgent"].priority, best["urgent"].share, best["urgent"].p99_ms) == (1, 0.2, 9.0)
    assert (best["urgent"].goal_p99_ms, best["bulk"].goal_p99_ms) == (URGENT_GOAL_MS, RUN_GOAL_MS)
    assert best["urgent"].meets_goal and best["bulk"].meets_goal
    baseline = {row.name: row for row in tables["baseline"].rows}
    assert baseline["urgent"].meets_goal is False  # 18 ms: over its own 12.5 ms
    assert (baseline["bulk"].error_count, baseline["bulk"].error_rate) == (40, 0.05)
    assert baseline["bulk"].meets_goal is False  # 5 % of its requests failed
    assert tables["best"].unit == "req/s"


def test_the_page_embeds_and_shows_the_class_table(mixed_run: RunData) -> None:
    page = render_report(build_record(mixed_run))
    data = json.loads(
        re.search(r'id="perfsweep-data">(.*?)</script>', page, re.S).group(1)  # type: ignore[union-attr]
    )
    roles = [t["role"] for t in data["classes"]]
    assert sorted(roles) == ["baseline", "best"]
    table = re.search(r'<table id="classes-table">(.*?)</table>', page, re.S)
    assert table is not None
    rows = re.findall(r'<tr data-role="(\w+)" data-class="(\w+)">(.*?)</tr>', table.group(1))
    assert [(role, name) for role, name, _ in rows] == [
        (t["role"], c["name"]) for t in data["classes"] for c in t["rows"]
    ]
    cells = {
        (role, name): " ".join(html.unescape(re.sub(r"<[^>]+>", " ", body)).split())
        for role, name, body in rows
    }
    # class, priority, share, timeout, requests, p50, p99, goal, errors, verdict
    assert cells[("best", "urgent")].endswith("urgent 1 20 % - 200 4.00 9.00 12.5 0 (0.00 %) yes")
    assert cells[("baseline", "bulk")].endswith(
        "bulk default 80 % 5.0 800 10.00 22.00 25.0 40 (5.00 %) no"
    )
    assert cells[("best", "urgent")].startswith("best (trial ")
    assert '<td class="bad">18.00</td>' in table.group(1)  # the baseline's urgent p99


def test_a_run_without_classes_is_unchanged(planted_run: Path) -> None:
    record = build_record(load_run(planted_run))
    assert type(record) is not ClassedReportRecord
    assert "classes" not in record.to_dict()
    assert 'id="classes-table"' not in render_report(record)
