"""The typed records of a run directory: summary.json, trial records and validation.json.

This module alone turns those files into objects and back; the report, the gate and the sweep
read and write them through it. Each record kind is a module beside this one: ``summary``,
``trial_record``, ``validation``, ``predictions``, ``measurements`` (a trial's measurement),
all on ``parsing`` (the helpers and migration every ``from_dict`` shares)::

    RunSummary   summary.json                 load_summary(path)     write_summary(path, s)
    TrialRecord  trials/NNN/measurement.json  load_trial(path)       write_trial(path, r)
                 (and baseline/)
    Validation   validation.json              load_validation(path)  write_validation(path, v)
    Predictions  predictions.json             load_predictions(path) write_predictions(path, p)

Each record is a frozen dataclass with ``to_dict()`` (the file's JSON, version header included)
and ``from_dict()`` (its inverse, which also reads every older version it knows). A trial's
measurement is one of four typed shapes, told apart by :attr:`TrialMeasurement.kind`, so no
reader has to guess it from the keys:

    CapacityMeasurement  a capacity search (objective ``throughput``)
    FixedMeasurement     one fixed load level (objective ``latency``)
    ParetoMeasurement    a capacity search plus the reference level (objective ``pareto``)
    ShapesMeasurement    a capacity search per arrival shape (several ``traffic.arrival``)

Loaders refuse a file of another kind, or of a version newer than (or unknown to) this
perfsweep, with :class:`~analyzer.errors.ResultFormatError` saying what to do; a damaged file
(a required key missing, a value of the wrong type) is refused the same way.

Format versions: each record's kind has its current version, its history (the optional keys
each version gained over time) and its migrations in :data:`analyzer.documents.FORMATS`; every
``to_dict()`` writes that version and every ``from_dict()`` lifts an older one through it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from analyzer.documents import (
    FORMATS,
    PREDICTIONS_KIND,
    SUMMARY_KIND,
    TRIAL_KIND,
    VALIDATION_KIND,
    read_document,
    refuse_version,
    write_json,
)
from analyzer.errors import ResultFormatError
from analyzer.rundir.predictions import Predictions
from analyzer.rundir.summary import RunSummary
from analyzer.rundir.trial_record import TrialRecord
from analyzer.rundir.validation import Validation


def _load(path: Path, kind: str, parse: Callable[[Mapping[str, Any]], Any]) -> Any:
    data = read_document(path, kind)
    if "format_version" not in data:  # from_dict takes header-less dicts; a file has a header
        refuse_version(path, None, FORMATS[kind].current)
    try:
        return parse(data)
    except ResultFormatError as exc:
        raise ResultFormatError(f"{path}: {exc}") from exc


def summary_path(path: Path) -> Path:
    """summary.json of a run directory, or ``path`` itself when it is a file."""
    path = Path(path)
    return path / "summary.json" if path.is_dir() else path


def load_summary(path: Path) -> RunSummary:
    """Read summary.json (a run directory or the file itself).

    Raises:
        ResultFormatError: Missing, damaged, another kind, or a version this perfsweep cannot read.
    """
    result: RunSummary = _load(summary_path(path), SUMMARY_KIND, RunSummary.from_dict)
    return result


def load_trial(path: Path) -> TrialRecord:
    """Read a ``trials/NNN/measurement.json`` (or ``baseline/measurement.json``)."""
    result: TrialRecord = _load(Path(path), TRIAL_KIND, TrialRecord.from_dict)
    return result


def load_validation(path: Path) -> Validation:
    """Read validation.json."""
    result: Validation = _load(Path(path), VALIDATION_KIND, Validation.from_dict)
    return result


def load_predictions(path: Path) -> Predictions:
    """Read predictions.json (a run directory or the file itself).

    Raises:
        ResultFormatError: Missing, damaged, another kind, or a version this perfsweep cannot read.
    """
    path = Path(path)
    if path.is_dir():
        path = path / "predictions.json"
    result: Predictions = _load(path, PREDICTIONS_KIND, Predictions.from_dict)
    return result


def write_predictions(path: Path, predictions: Predictions) -> None:
    """Atomically write predictions.json."""
    write_json(Path(path), predictions.to_dict())


def write_summary(path: Path, summary: RunSummary) -> None:
    """Atomically write summary.json."""
    write_json(Path(path), summary.to_dict())


def write_trial(path: Path, record: TrialRecord) -> None:
    """Atomically write a trial record."""
    write_json(Path(path), record.to_dict())


def write_validation(path: Path, validation: Validation) -> None:
    """Atomically write validation.json."""
    write_json(Path(path), validation.to_dict())
