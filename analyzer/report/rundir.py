"""Reading a run directory for the report (the only I/O of the record).

Everything is parsed (through :mod:`analyzer.rundir.records`, the one reader of the result files)
and nothing derived: :func:`analyzer.report.build.build_record` does that.
Parameter importances come from the stored Optuna study through ``analyzer.search.study`` (the only
optuna importer).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from analyzer.errors import InputError, PerfsweepError, ResultFormatError
from analyzer.rundir.predictions import Predictions
from analyzer.rundir.records import load_predictions, load_summary, load_trial, load_validation
from analyzer.rundir.results import RunDirectory
from analyzer.rundir.summary import RunSummary
from analyzer.rundir.trial_record import TrialRecord
from analyzer.rundir.validation import Validation


@dataclass(frozen=True)
class RunData:
    """The contents of a run directory (typed records and texts, nothing derived).

    Attributes:
        root: The run directory.
        summary: summary.json.
        trials: Trial records (baseline first, then by number).
        run_state: run.json (None when absent).
        validation: validation.json (None when the file is absent).
        best_config_text: best/config.pbtxt (None when no config met the goals).
        baseline_config_text: baseline/config.pbtxt.
        scenario_toml: scenario.toml as written by the sweep.
        importances: Optuna parameter -> importance, or None.
        importance_note: Why importances are missing (empty when present).
        predictions: predictions.json (None when absent or unreadable).
        predictions_note: Why predictions.json could not be read (empty otherwise).
    """

    root: Path
    summary: RunSummary
    trials: tuple[TrialRecord, ...]
    run_state: dict[str, Any] | None = None
    validation: Validation | None = None
    best_config_text: str | None = None
    baseline_config_text: str | None = None
    scenario_toml: str | None = None
    importances: dict[str, float] | None = None
    importance_note: str = ""
    predictions: Predictions | None = None
    predictions_note: str = ""


def load_run(run_dir: Path, *, importances: bool = True) -> RunData:
    """Read a run directory.

    Args:
        run_dir: A directory written by ``perfsweep run``.
        importances: Compute parameter importances from the stored Optuna study (imports optuna).

    Returns:
        The parsed files.

    Raises:
        ResultFormatError: summary.json or a trial record is missing, damaged or of an unknown
            format version.
    """
    root = Path(run_dir)
    if not root.is_dir():
        raise InputError(f"{root} is not a directory; pass a run directory (reports/<run-id>)")
    directory = RunDirectory(root)
    if not directory.summary_json.exists() and directory.run_json.exists():
        status = directory.read_run_state().get("status", "unknown")
        finished = len(list((root / "trials").glob("*/measurement.json")))
        raise ResultFormatError(
            f"{root} has no summary.json yet: the run is {status} with {finished} trial(s) "
            "finished, and the summary is written when it ends. Wait for it, or continue a "
            f"stopped run with `perfsweep run --resume {root}`"
        )
    summary = load_summary(directory.summary_json)
    trials = sorted(map(load_trial, directory.trial_paths()), key=lambda r: r.number)
    run_state = None
    if directory.run_json.exists():
        run_state = directory.read_run_state()
    validation = None
    if directory.validation_json.exists():
        validation = load_validation(directory.validation_json)
    predictions, predictions_note = _predictions(directory)
    importance_values, note = None, ""
    if importances:
        importance_values, note = _importances(summary, run_state, root)
    else:
        note = "not computed (importances disabled)"
    return RunData(
        root=root,
        summary=summary,
        trials=tuple(trials),
        run_state=run_state,
        validation=validation,
        best_config_text=_read_text(root, summary.best.config_path if summary.best else None),
        baseline_config_text=_read_text(
            root, summary.baseline.config_path if summary.baseline else None
        ),
        scenario_toml=_read_text(root, "scenario.toml"),
        importances=importance_values,
        importance_note=note,
        predictions=predictions,
        predictions_note=predictions_note,
    )


def _predictions(directory: RunDirectory) -> tuple[Predictions | None, str]:
    """predictions.json, or None and why not (an optional part: it never stops the report)."""
    path = directory.predictions_json
    if not path.exists():
        return None, ""
    try:
        return load_predictions(path), ""
    except ResultFormatError as exc:
        return None, f"predictions.json is not readable: {exc}"


def _read_text(root: Path, relative: str | None) -> str | None:
    if not relative:
        return None
    path = (root / relative).resolve()
    if not path.is_relative_to(root.resolve()):  # a summary must not point outside its run
        return None
    try:
        return path.read_text(encoding="utf-8")
    except OSError:
        return None


def _importances(
    summary: RunSummary, run_state: Mapping[str, Any] | None, root: Path
) -> tuple[dict[str, float] | None, str]:
    """Importances from the stored study, or None and why not."""
    storage = (run_state or {}).get("storage")
    study_name = (run_state or {}).get("study_name") or summary.study.get("study_name")
    if not storage or not study_name:
        return None, "not recorded: run.json names no study storage"
    if "://" not in storage:
        # run.json records the journal path as the sweep saw it; a moved directory (a CI
        # artifact) still holds the journal next to run.json.
        local = root / Path(storage).name
        if not Path(storage).exists() and local.exists():
            storage = str(local)
        if not Path(storage).exists():
            return None, f"not available: the study journal {Path(storage).name} is missing"
    from analyzer.search.study import param_importances  # optuna: only when a report is built

    try:
        return param_importances(storage, study_name), ""
    except PerfsweepError as exc:
        return None, f"not available: {exc}"
