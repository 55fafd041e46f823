"""perfsweep's JSON documents: their format versions, atomic writes, reading a file of one kind.

The lowest layer of the run directory: :mod:`analyzer.rundir.records` (the typed records) and
:mod:`analyzer.rundir.results` (the directory's layout, which writes those records) both build on
it, so neither has to import the other's writers.

A file is written to a temporary name in its directory and then ``os.replace``d, so a crash
never leaves half a file.

Format versions (pyperf ``_bench.py`` style): :data:`FORMATS` is the one table of every kind of
document perfsweep writes, with its current version, what each version holds, and the
migrations that lift an older version to the next. Every writer takes its header from it
(:func:`header`) and every reader lifts what it reads through it (:meth:`FormatHistory.lift`).
A new version of a kind bumps ``current``, adds a line to ``history`` and one function to
``migrations`` (from the version before it). Keys that a version gained later without a bump
are optional keys of that version: their readers take a missing one as "not recorded".
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

from analyzer.errors import ResultFormatError

#: A migration: a document of version N (a copy the function may change) -> version N + 1.
Migration = Callable[[dict[str, Any]], dict[str, Any]]


@dataclass(frozen=True)
class FormatHistory:
    """One kind of document: its current version, its history, and how to read older versions."""

    #: The version this perfsweep writes.
    current: int
    #: Version -> what it holds (and the optional keys it gained over time, without a bump).
    history: Mapping[int, str]
    #: Version N -> the function that lifts a version-N document to version N + 1.
    migrations: Mapping[int, Migration] = field(default_factory=dict)

    def readable(self, version: object) -> bool:
        """True when ``version`` is the current one, or one the migrations lift to it."""
        if not isinstance(version, int) or isinstance(version, bool) or version > self.current:
            return False
        return all(v in self.migrations for v in range(version, self.current))

    def lift(self, data: Mapping[str, Any], where: object) -> Mapping[str, Any]:
        """``data`` at the current version, each migration run in turn.

        Raises:
            ResultFormatError: A version newer than this perfsweep's, or one it has no path from
                (``where`` names the document in the message).
        """
        version = data.get("format_version")
        if not self.readable(version):
            refuse_version(where, version, self.current)
        assert isinstance(version, int)
        for step in range(version, self.current):
            data = {**self.migrations[step](dict(data)), "format_version": step + 1}
        return data


RUN_KIND = "perfsweep.run"
SUMMARY_KIND = "perfsweep.summary"
TRIAL_KIND = "perfsweep.trial"
VALIDATION_KIND = "perfsweep.validation"
PREDICTIONS_KIND = "perfsweep.predictions"
LOAD_KIND = "perfsweep.load"
REPORT_KIND = "perfsweep.report"
PROFILE_KIND = "perfsweep.profile"
PREDICTION_KIND = "perfsweep.prediction"

#: Every kind of document perfsweep writes -> its format (docs/reference.md has the keys).
FORMATS: dict[str, FormatHistory] = {
    RUN_KIND: FormatHistory(
        1,
        {
            1: "run.json: the run's identity and status (``--resume`` reads it); the server "
            "history keys (``server_events``, ``server_restarts``, ``outages``, "
            "``left_on_server``, ``failed_trial``, ``error``) are optional (absent: none).",
        },
    ),
    SUMMARY_KIND: FormatHistory(
        1,
        {
            1: "summary.json (rundir/summary.py, RunSummary). Optional keys, added within "
            "version 1 and "
            "absent from files written before them (docs/examples/sim-before, sim-after), read "
            "as not recorded (None, an empty tuple or dict): ``device_requested``, ``devices``, "
            "``server_gpus``, ``gain_ci``, ``gain_significant``, ``gain_repeats``, "
            "``gain_text``, ``goal_text``, ``tie_break``, ``left_on_server``, "
            "``search_strategy``, ``search_note``, ``phases``, ``recommendation``, "
            "``server_events``, ``server_restarts``, ``outages``, ``stop_reason`` (read as "
            'not recorded: ``""``); the entries\' ``p99_n``/``p99_low_sample``/``p99_note``/'
            "``gpus``/``search_throughput_rps``/``source``, the goals' "
            "``max_gpu_memory_mb``/``note`` and the candidates' ``p99_n``.",
        },
    ),
    TRIAL_KIND: FormatHistory(
        1,
        {
            1: "trials/NNN/measurement.json (rundir/trial_record.py, TrialRecord). "
            "The measurement's kind is "
            "not written: it is read from the measurement's own keys. Optional keys, absent "
            'from early records: ``values`` (read as ``()``), ``started_at`` (``""``), '
            "``prediction`` (``--search predict`` only; None); the measurement's "
            "``send_gap_cv`` and ``late_share_1ms`` (None). A measurement with ``shapes`` "
            "(a search per arrival shape, each with its ``arrival``) is written only by runs "
            "whose ``traffic.arrival`` lists several shapes.",
        },
    ),
    VALIDATION_KIND: FormatHistory(
        1,
        {
            1: "validation.json: ``{candidates: [...]}``, each as summary.json's "
            "``validation``. Optional keys: ``measurements`` (absent before measurements were "
            "kept; read as ``()``), ``check_rps``, ``check_met``, ``check`` (absent before the "
            "validation check; None).",
        },
    ),
    PREDICTIONS_KIND: FormatHistory(
        1,
        {
            1: "predictions.json (rundir/predictions.py, Predictions): "
            "the profile the simulator used and "
            "every config of the space with its predicted capacity and band.",
        },
    ),
    LOAD_KIND: FormatHistory(
        1,
        {
            1: "``perfsweep load --output``: ``environment``, ``results`` (one Measurement per "
            "level) and, for a capacity search, ``capacity_rps`` and ``capacity``. A "
            "Measurement's ``arrival`` is the process's short form (``poisson``, "
            "``gamma:cv=2``, ``trace:FILE``, ...; once only poisson or constant); its optional "
            "keys ``send_gap_cv`` and ``late_share_1ms`` are absent from earlier files (None).",
        },
    ),
    REPORT_KIND: FormatHistory(
        1,
        {1: "report.html's embedded JSON (report.record.ReportRecord)."},
    ),
    PROFILE_KIND: FormatHistory(
        1,
        {
            1: "``perfsweep predict --profile`` (predict.profile.Profile). Optional keys: "
            "``mix`` and ``size_classes`` (absent: none).",
        },
    ),
    PREDICTION_KIND: FormatHistory(
        1,
        {1: "``perfsweep predict --json`` (predict.planner): the config and its prediction."},
    ),
}


def header(kind: str) -> dict[str, Any]:
    """The version header a document of ``kind`` is written with (its current version)."""
    return {"format_version": FORMATS[kind].current, "kind": kind}


def read_versioned(path: Path, kind: str) -> dict[str, Any]:
    """Read a file of ``kind`` and lift it to the current version (refuse what cannot be read)."""
    data = read_document(path, kind)
    return dict(FORMATS[kind].lift(data, path))


def _current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


_UMASK = _current_umask()


def write_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` via a temp file in the same directory and ``os.replace``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        # mkstemp creates 0600; results are ordinary files, readable as the umask allows.
        os.chmod(tmp, 0o666 & ~_UMASK)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def write_json(path: Path, data: Mapping[str, Any]) -> None:
    """Atomically write ``data`` as indented JSON."""
    write_atomic(path, json.dumps(data, indent=2, sort_keys=False, default=json_default) + "\n")


def read_document(path: Path, kind: str) -> dict[str, Any]:
    """Parse a perfsweep JSON file of ``kind``, any version (refuse other kinds, damaged JSON)."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ResultFormatError(f"{path} does not exist") from None
    except ValueError as exc:
        raise ResultFormatError(f"{path} is not valid JSON ({exc}); the file is damaged") from exc
    if not isinstance(data, dict) or data.get("kind") != kind:
        raise ResultFormatError(f"{path} is not a {kind} file")
    return data


def refuse_version(where: object, version: object, current: int) -> NoReturn:
    """Raise the one "cannot read this version" error: what happened and what to do."""
    raise ResultFormatError(
        f"{where} has format_version {version!r}; this perfsweep reads version {current}. "
        "Use the perfsweep version that wrote it, or re-run the sweep with this one"
    )


def json_default(value: Any) -> Any:
    """``json.dumps``'s ``default`` for perfsweep's files: paths as text, sets and tuples as
    lists; anything else is refused (``TypeError``)."""
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, (set, tuple)):
        return list(value)
    raise TypeError(f"cannot write {type(value).__name__} to JSON")
