"""A run with a priority mix (``[[traffic.classes]]``): a per-class table for the best and the
baseline config (:class:`ClassTable`): each class's priority, share, p99 against its own goal
and errors, at the config's operating point; and the run's goals (:func:`run_goals`).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from analyzer.errors import InputError
from analyzer.measure.goals import class_slacks
from analyzer.measure.specs import Goals, LoadMode
from analyzer.report.record import ConfigResult, ReportRecord
from analyzer.report.rundir import RunData
from analyzer.rundir.trial_record import TrialRecord

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib


@dataclass(frozen=True)
class ClassRow:
    """One traffic class at a config's operating point."""

    name: str
    #: Priority level sent (0: none, the model's default level).
    priority: int
    #: Share of the offered load.
    share: float
    #: ``timeout`` parameter sent, microseconds (0: none).
    timeout_us: int
    request_count: int
    error_count: int
    error_rate: float
    p50_ms: float
    p99_ms: float
    #: The class's own p99 goal (the run's ``goals.p99_ms`` when it has none).
    goal_p99_ms: float
    #: p99 within its goal and errors within the error budget (a class without requests: None).
    meets_goal: bool | None


@dataclass(frozen=True)
class ClassTable:
    """The traffic classes of one config (best or baseline) at its operating point."""

    role: str
    trial_number: int
    #: The operating point's load, in ``unit``.
    measured_at: float
    #: ``req/s`` (open loop) or ``users`` (closed loop).
    unit: str
    rows: tuple[ClassRow, ...]


@dataclass(frozen=True)
class ClassedReportRecord(ReportRecord):
    """A :class:`ReportRecord` with the per-class tables of a run with a priority mix.

    Only runs with traffic classes get one (every other record, and its JSON, is as before).
    """

    classes: tuple[ClassTable, ...] = ()


def run_goals(run: RunData) -> Goals | None:
    """The run's goals with each traffic class's own p99 goal (from ``scenario.toml``); None
    when the summary records no p99 goal."""
    goals = dict(run.summary.goals)
    if not goals.get("p99_ms"):
        return None
    classes: list[Any] = []
    if run.scenario_toml:
        try:
            classes = tomllib.loads(run.scenario_toml).get("traffic", {}).get("classes", [])
        except tomllib.TOMLDecodeError:
            classes = []
    p99_ms, max_error_rate = float(goals["p99_ms"]), float(goals.get("max_error_rate", 0.0))
    own = tuple((str(c["name"]), float(c["p99_ms"])) for c in classes if c.get("p99_ms", 0) > 0)
    try:
        return Goals(p99_ms=p99_ms, max_error_rate=max_error_rate, classes=own)
    except InputError:  # goals no sweep accepts (a class's above the run's): the run's for all
        return Goals(p99_ms=p99_ms, max_error_rate=max_error_rate)


def class_tables(
    run: RunData,
    roles: Sequence[tuple[str, ConfigResult | None]],
    records: Mapping[int, TrialRecord],
) -> tuple[ClassTable, ...]:
    """Per-class tables of the ``roles`` (best, baseline) whose operating point has traffic
    classes; empty for a run without a priority mix."""
    goals = run_goals(run)
    out = []
    for role, result in roles:
        record = records.get(result.trial_number) if result is not None else None
        op = record.operating_point() if record is not None else None
        if record is None or op is None or not op.classes or goals is None:
            continue
        # The one rule: a class meets its goal when its slacks are satisfied.
        slacks = class_slacks(op, goals)
        rows = []
        for c in op.classes:
            met = all(v <= 0 for v in slacks[c.name].values()) if c.name in slacks else None
            rows.append(
                ClassRow(
                    name=c.name,
                    priority=c.priority,
                    share=c.share,
                    timeout_us=c.timeout_us,
                    request_count=c.request_count,
                    error_count=c.error_count,
                    error_rate=c.error_rate,
                    p50_ms=c.p50_ms,
                    p99_ms=c.p99_ms,
                    goal_p99_ms=goals.class_p99_ms(c.name),
                    meets_goal=met,
                )
            )
        unit = "req/s" if op.mode is LoadMode.REQUEST_RATE else "users"
        out.append(ClassTable(role, record.number, float(op.target), unit, tuple(rows)))
    return tuple(out)
