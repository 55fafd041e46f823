"""The run directory: layout, versioned JSON, atomic writes, trials.csv, loaders.

Layout (``docs/reference.md`` documents every file)::

    reports/<run-id>/
      run.json  scenario.toml  study.journal  server/server.log
      baseline/{config.pbtxt, measurement.json}
      trials/NNN/{config.pbtxt, measurement.json}
      trials.csv  validation.json  best/config.pbtxt  pareto/NN/config.pbtxt
      summary.json  report.html

Every file is written to a temporary name in its directory and then ``os.replace``d
(:mod:`analyzer.documents`), so a crash never leaves half a file, and a trial's files are written
as soon as it ends (a killed run keeps every finished trial). The typed records come from
:mod:`analyzer.rundir.records`, which builds on :mod:`analyzer.documents` too and never on this
module.
"""

from __future__ import annotations

import datetime as dt
import html
import json
import os
import platform
import socket
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any, TypeAlias

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from analyzer.config.pipeline import knob_cells
from analyzer.documents import (
    RUN_KIND,
    SUMMARY_KIND,
    TRIAL_KIND,
    VALIDATION_KIND,
    header,
    json_default,
    read_versioned,
    write_atomic,
    write_json,
)
from analyzer.rundir import records
from analyzer.rundir.summary import ConfigEntry, RunSummary
from analyzer.rundir.trial_record import TrialRecord
from analyzer.rundir.validation import Validation

TRIAL_COLUMNS = (
    "number", "source", "state", "max_batch_size", "max_queue_delay_us", "preferred_batch_size",
    "instance_count", "throughput_rps", "offered_rps", "p50_ms", "p90_ms", "p99_ms", "error_rate",
    "meets_goals", "p99_slack", "duration_s", "failure",
)  # fmt: skip

_PACKAGES = ("perfsweep", "optuna", "locust", "tritonclient", "onnxruntime", "numpy", "pandas")


def utc_now() -> str:
    """Current time, ISO-8601 UTC with seconds."""
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def new_run_id(model: str, now: dt.datetime | None = None) -> str:
    """``<model>-<UTC yyyymmdd-HHMMSS>``."""
    now = now or dt.datetime.now(dt.timezone.utc)
    return f"{model}-{now.strftime('%Y%m%d-%H%M%S')}"


def config_text(config: mc.ModelConfig) -> str:
    """A ModelConfig as config.pbtxt text (Triton's own protobuf text format)."""
    return text_format.MessageToString(config)


def parse_config_text(text: str, *, allow_unknown_field: bool = False) -> mc.ModelConfig:
    """Parse config.pbtxt text (raises ``text_format.ParseError`` on bad input).

    ``allow_unknown_field``: skip fields this protobuf does not know (a user's config written for
    a newer Triton), as the managed server's repository config is read."""
    return text_format.Parse(text, mc.ModelConfig(), allow_unknown_field=allow_unknown_field)


def environment(scenario_hash: str, target: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Where the measurements were taken: host, CPU, GPU, package versions, scenario hash."""
    packages = {}
    for name in _PACKAGES:
        try:
            packages[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return {
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "gpu": _gpu_names(),
        "packages": packages,
        "scenario_hash": scenario_hash,
        "target": dict(target or {}),
    }


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _gpu_names() -> list[str]:
    root = Path("/proc/driver/nvidia/gpus")
    names = []
    if root.is_dir():
        for info in sorted(root.glob("*/information")):
            for line in info.read_text().splitlines():
                if line.startswith("Model:"):
                    names.append(line.split(":", 1)[1].strip())
    return names


#: The configs one trial sets: one model's, or one per composing model of a pipeline.
Configs: TypeAlias = "mc.ModelConfig | Sequence[mc.ModelConfig]"


def write_configs(folder: Path, configs: Configs, tree: bool = False) -> Path:
    """One model's config as ``folder/config.pbtxt`` (its path returned); with ``tree`` (a
    pipeline's composing models) as a repository tree, ``folder/<model>/config.pbtxt``
    (``folder`` returned): each file drops into the model's directory of a repository."""
    if isinstance(configs, mc.ModelConfig):
        configs = (configs,)
    if not tree:
        (config,) = configs
        path = folder / "config.pbtxt"
        write_atomic(path, config_text(config))
        return path
    for config in configs:
        write_atomic(folder / config.name / "config.pbtxt", config_text(config))
    return folder


@dataclass
class RunDirectory:
    """One sweep's directory. Paths are properties so every module agrees on the layout."""

    root: Path
    trial_rows: dict[int, dict[str, Any]] = field(default_factory=dict)
    #: Configs are written as repository trees (``<folder>/<model>/config.pbtxt``): the run
    #: tunes a pipeline's composing models.
    tree: bool = False

    @property
    def run_json(self) -> Path:
        return self.root / "run.json"

    @property
    def scenario_toml(self) -> Path:
        return self.root / "scenario.toml"

    @property
    def journal(self) -> Path:
        return self.root / "study.journal"

    @property
    def server_log(self) -> Path:
        return self.root / "server" / "server.log"

    @property
    def summary_json(self) -> Path:
        return self.root / "summary.json"

    @property
    def trials_csv(self) -> Path:
        return self.root / "trials.csv"

    @property
    def validation_json(self) -> Path:
        return self.root / "validation.json"

    @property
    def predictions_json(self) -> Path:
        """The simulator's capacity for every config (``--search predict``; Predictions)."""
        return self.root / "predictions.json"

    @property
    def report_html(self) -> Path:
        return self.root / "report.html"

    @property
    def best_config(self) -> Path:
        return self.root / "best" / "config.pbtxt"

    def trial_dir(self, number: int) -> Path:
        """``trials/NNN`` (``baseline`` for number -1)."""
        return self.root / "baseline" if number < 0 else self.root / "trials" / f"{number:03d}"

    def pareto_config(self, rank: int) -> Path:
        return self.root / "pareto" / f"{rank:02d}" / "config.pbtxt"

    def relative(self, path: Path) -> str:
        """``path`` relative to the run directory (as summary.json records it)."""
        return str(path.relative_to(self.root))

    # -- writers ---------------------------------------------------------------------------------

    def write_run_state(self, state: Mapping[str, Any]) -> None:
        """run.json: identity and status of the run (``--resume`` reads it)."""
        write_json(self.run_json, {**header(RUN_KIND), **state})

    def read_run_state(self) -> dict[str, Any]:
        return read_versioned(self.run_json, RUN_KIND)

    def write_config(self, number: int, configs: Configs) -> Path:
        """``trials/NNN/config.pbtxt`` (or baseline/) for the config about to be measured; a
        pipeline's as ``trials/NNN/<model>/config.pbtxt`` (:func:`write_configs`)."""
        return write_configs(self.trial_dir(number), configs, self.tree)

    def configs_at(self, folder: Path) -> Path:
        """Where :func:`write_configs` puts a trial's configs under ``folder``: its
        ``config.pbtxt``, or the folder itself for a pipeline's tree."""
        return folder if self.tree else folder / "config.pbtxt"

    def read_configs(self, number: int, names: Sequence[str]) -> tuple[mc.ModelConfig, ...] | None:
        """The configs :meth:`write_config` wrote for models ``names`` (None: not written)."""
        folder = self.trial_dir(number)
        paths = (
            [folder / n / "config.pbtxt" for n in names] if self.tree else [folder / "config.pbtxt"]
        )
        if not all(p.exists() for p in paths):
            return None
        return tuple(parse_config_text(p.read_text(encoding="utf-8")) for p in paths)

    def write_trial(self, record: TrialRecord | Mapping[str, Any]) -> None:
        """The trial record, then trials.csv with its row (both atomic).

        ``record`` is a :class:`~analyzer.rundir.trial_record.TrialRecord`, or a trial record's JSON
        without its header (tests plant hand-made ones; written as given, under the current header).
        """
        if isinstance(record, TrialRecord):
            full = record.to_dict()
        else:
            full = {**header(TRIAL_KIND), **record}
        number = int(full["number"])
        write_json(self.trial_dir(number) / "measurement.json", full)
        self.trial_rows[number] = trial_row(full)
        self.write_trials_csv()

    def trial_paths(self) -> list[Path]:
        """Every trial record on disk: the baseline's first, then by number."""
        paths = [self.trial_dir(-1) / "measurement.json"]
        paths += sorted((self.root / "trials").glob("*/measurement.json"))
        return [p for p in paths if p.exists()]

    def load_existing_trials(self) -> list[TrialRecord]:
        """Trial records already on disk (after ``--resume``), by number; baseline first."""
        found = [records.load_trial(path) for path in self.trial_paths()]
        for record in found:
            self.trial_rows[record.number] = trial_row(record.to_dict())
        return found

    def write_trials_csv(self) -> None:
        import pandas as pd

        rows = [self.trial_rows[n] for n in sorted(self.trial_rows)]
        frame = pd.DataFrame(rows, columns=list(TRIAL_COLUMNS))
        write_atomic(self.trials_csv, frame.to_csv(index=False))

    def write_best(self, configs: Configs) -> Path:
        return write_configs(self.best_config.parent, configs, self.tree)

    def write_pareto(self, configs: Iterable[Configs]) -> list[Path]:
        return [
            write_configs(self.pareto_config(rank).parent, each, self.tree)
            for rank, each in enumerate(configs, start=1)
        ]

    def write_validation(self, validation: Validation | list[Mapping[str, Any]]) -> None:
        """validation.json: a :class:`~analyzer.rundir.validation.Validation`, or its candidate dicts."""
        if isinstance(validation, Validation):
            write_json(self.validation_json, validation.to_dict())
            return
        write_json(
            self.validation_json, {**header(VALIDATION_KIND), "candidates": list(validation)}
        )

    def write_summary(self, summary: RunSummary | Mapping[str, Any]) -> None:
        """summary.json: a :class:`~analyzer.rundir.summary.RunSummary`, or its dict without header."""
        if isinstance(summary, RunSummary):
            write_json(self.summary_json, summary.to_dict())
            return
        write_json(self.summary_json, {**header(SUMMARY_KIND), **summary})

    def write_minimal_report(self, summary: RunSummary) -> None:
        """A small self-contained report.html (the report module writes the rich one)."""
        write_atomic(
            self.report_html,
            minimal_report(summary, [self.trial_rows[n] for n in sorted(self.trial_rows)]),
        )


def load_summary(path: Path) -> dict[str, Any]:
    """summary.json (a run directory or the file itself) as a dict of the current version.

    The typed record is :func:`analyzer.rundir.records.load_summary`; this is its ``to_dict()``, for
    scripts and tests that index the JSON as ``jq`` would.
    """
    return records.load_summary(Path(path)).to_dict()


def load_trial_record(path: Path) -> dict[str, Any]:
    """A ``trials/NNN/measurement.json`` as a dict of the current version
    (:func:`analyzer.rundir.records.load_trial`'s ``to_dict()``)."""
    return records.load_trial(Path(path)).to_dict()


def trial_row(record: Mapping[str, Any]) -> dict[str, Any]:
    """The trials.csv row of a trial record."""
    config = record.get("config") or {}
    constraints = record.get("constraints") or {}
    # A pipeline's knobs: each column holds its stages' values in step order, ``8/16/8``.
    stages = list(config["stages"].values()) if "stages" in config else [config]

    def column(key: str) -> Any:
        values = [s.get(key) for s in stages]
        if key == "preferred_batch_size":
            values = [" ".join(str(v) for v in sizes or []) for sizes in values]
        return values[0] if len(values) == 1 else "/".join(str(v) for v in values)

    return {
        "number": record["number"],
        "source": record.get("source"),
        "state": record.get("state"),
        "max_batch_size": column("max_batch_size"),
        "max_queue_delay_us": column("max_queue_delay_us"),
        "preferred_batch_size": column("preferred_batch_size"),
        "instance_count": column("instance_count"),
        "throughput_rps": record.get("throughput_rps"),
        "offered_rps": record.get("offered_rps"),
        "p50_ms": record.get("p50_ms"),
        "p90_ms": record.get("p90_ms"),
        "p99_ms": record.get("p99_ms"),
        "error_rate": record.get("error_rate"),
        "meets_goals": record.get("meets_goals"),
        "p99_slack": constraints.get("p99_slack"),
        "duration_s": record.get("duration_s"),
        "failure": record.get("failure"),
    }


def minimal_report(summary: RunSummary, rows: list[Mapping[str, Any]]) -> str:
    """Baseline vs best and the trial table as one HTML page; every value is escaped."""

    def esc(value: Any) -> str:
        if isinstance(value, float):
            return f"{value:.2f}"
        return html.escape("" if value is None else str(value))

    def entry_cells(entry: ConfigEntry | None) -> str:
        if entry is None:
            return "<td colspan=5>none</td>"
        return "".join(
            f"<td>{esc(v)}</td>"
            for v in (
                *knob_cells(entry.config),
                f"{esc(entry.throughput_rps)} rps, p99 {esc(entry.p99_ms)} ms",
            )
        )

    head = "".join(f"<th>{esc(c)}</th>" for c in TRIAL_COLUMNS)
    body = "\n".join(
        "<tr>" + "".join(f"<td>{esc(r.get(c))}</td>" for c in TRIAL_COLUMNS) + "</tr>" for r in rows
    )
    goals = summary.goals
    gain = summary.gain
    # JSON inside <script> is not HTML-decoded: escape only what could close the element.
    data = json.dumps(summary.to_dict(), default=json_default).replace("<", "\\u003c")
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>perfsweep {esc(summary.run_id)}</title>
<style>body{{font-family:sans-serif;margin:2em}}table{{border-collapse:collapse}}
td,th{{border:1px solid #ccc;padding:2px 6px;text-align:right}}</style></head><body>
<h1>perfsweep: {esc(summary.model)} on {esc(summary.device)}</h1>
<p>Objective {esc(summary.objective)}; goal p99 &le; {esc(goals.get("p99_ms"))} ms,
error rate &le; {esc(goals.get("max_error_rate"))}. Gain over baseline:
<b>{esc(f"{gain:.2f}x" if gain is not None else "n/a")}</b>.</p>
<table><tr><th></th><th>max_batch_size</th><th>delay us</th><th>preferred</th><th>instances</th><th>result</th></tr>
<tr><th>baseline</th>{entry_cells(summary.baseline)}</tr>
<tr><th>best</th>{entry_cells(summary.best)}</tr></table>
<h2>Trials</h2><table><tr>{head}</tr>
{body}</table>
<script type="application/json" id="perfsweep-summary">{data}</script>
</body></html>
"""
