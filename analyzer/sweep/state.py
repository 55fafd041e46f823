"""What one sweep holds while it runs, and what it gives back.

:class:`SweepOutcome` (the result of ``run_sweep``), :class:`SweepObserver` (what a live view
is told), the sweep's limits, and ``SweepState``: the scenario, run directory, target, search and
results one sweep shares between its phases (``loop``, ``trials``, ``predictions``,
``validation``, ``finish``).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tritonclient.grpc import model_config_pb2 as mc

from analyzer.config.objective import Objective
from analyzer.config.pipeline import TrialKnobs, Tuned
from analyzer.config.scenario import Scenario
from analyzer.evaluation import Evaluator
from analyzer.predict.profile import Profile
from analyzer.rundir.results import RunDirectory, utc_now
from analyzer.rundir.summary import RunSummary, StopReason
from analyzer.rundir.trial_record import TrialRecord
from analyzer.search.strategy import Guide
from analyzer.search.study import Search
from analyzer.target.leases import TargetLease
from analyzer.target.protocol import Target

#: Consecutive trials failing because the target is gone before the sweep gives up.
MAX_TARGET_FAILURES = 3

#: The failure of a trial whose config killed the server twice (a finding, not a measurement).
CRASHED_REASON = "crashed the server"

#: The profile phase: the live server -> a Profile (``run_sweep(profiler=...)``; tests plant one).
Profiler = Callable[[Target, Scenario], Profile]

__all__ = ["SweepObserver", "SweepOutcome"]


@dataclass(frozen=True)
class SweepOutcome:
    """What a sweep produced: the trial records behind summary.json, and the file's record
    (:class:`analyzer.rundir.summary.RunSummary`, in :attr:`record`; its JSON in :attr:`data`)."""

    run_dir: Path
    run_id: str
    baseline: TrialRecord | None
    best: TrialRecord | None
    gain: float | None
    trials: dict[str, int]
    stop_reason: StopReason
    best_config_path: Path | None
    pareto: list[TrialRecord]
    #: summary.json as its typed record.
    record: RunSummary
    #: Seconds per phase (summary.json's ``phases``, and ``report``: rendering it).
    phases: dict[str, float] = field(default_factory=dict)

    @property
    def data(self) -> dict[str, Any]:
        """summary.json as written (``record.to_dict()``)."""
        return self.record.to_dict()


class SweepObserver:
    """Receives progress events (the CLI's live view subclasses this). Methods must not block."""

    def on_start(self, run_dir: Path, scenario: Scenario, target: dict[str, Any]) -> None:
        """The target is up and the run directory exists."""

    def on_trial_start(
        self, number: int, source: str, knobs: TrialKnobs, index: int, budget: int
    ) -> None:
        """A config is about to be loaded and measured (``number`` -1 = baseline)."""

    def on_phase(self, text: str) -> None:
        """What the current trial is doing (load level, retry)."""

    def on_note(self, text: str) -> None:
        """Something the user should read (a fall-back, a budget smaller than the grid)."""

    def on_server(self, text: str) -> None:
        """The server under test died, is restarted, waited for, or answers again."""

    def on_trial_end(self, result: TrialRecord, best: TrialRecord | None) -> None:
        """A trial finished; ``best`` is the best feasible trial so far."""

    def on_validation(
        self, number: int, repeat: int, result: TrialRecord, check_rps: float | None = None
    ) -> None:
        """One validation repeat finished (``check_rps``: it was a check at that one rate, not
        a capacity search)."""

    def on_server_left(self, left: dict[str, Any]) -> None:
        """What the server holds now (``left_on_server`` of summary.json); also on failure."""

    def on_finish(self, summary: SweepOutcome) -> None:
        """Everything is written."""


@dataclass
class SweepState:
    scenario: Scenario
    objective: Objective
    run_dir: RunDirectory
    target: Target
    #: What the sweep sets: the model, or a pipeline's composing models.
    tuned: Tuned
    search: Search
    evaluator: Evaluator
    observer: SweepObserver
    results: dict[int, TrialRecord] = field(default_factory=dict)
    baseline: TrialRecord | None = None
    target_failures: int = 0
    #: Validation repeats per trial number (-1 = the baseline).
    validated: dict[int, list[TrialRecord]] = field(default_factory=dict)
    #: A config was pushed to the server (so a shared server must be given one back).
    touched: bool = False
    #: What was left on the server (summary ``left_on_server``); None until decided.
    left: dict[str, Any] | None = None
    #: Why the chosen config won a throughput tie on GPU use (summary ``tie_break``).
    tie_break: str | None = None
    #: The search that runs (``predict``, ``tpe``, ``random``, ``grid``) and why it is not the
    #: one asked for (summary ``search_strategy``, ``search_note``).
    strategy: str = "tpe"
    notes: list[str] = field(default_factory=list)
    #: The load's data shows that batches cannot form: the search measures instance counts only.
    batches_inert: bool = False
    #: ``--search predict``: the predictions and the rules on them.
    guide: Guide | None = None
    #: Seconds per phase (summary ``phases``).
    phases: dict[str, float] = field(default_factory=dict)
    #: This worker's claim on a shared server (``model.url``) in the study; None: managed.
    lease: TargetLease | None = None
    #: What happened to the server: each death, with the trial and the time (summary
    #: ``server_events``).
    server_events: list[dict[str, Any]] = field(default_factory=list)
    #: The server died and could not be brought back: nothing more is sent to it.
    dead: bool = False
    #: Restarts and outages of the processes before a ``--resume`` (run.json).
    earlier_restarts: int = 0
    earlier_outages: list[dict[str, Any]] = field(default_factory=list)
    #: The sweep's monotonic clock (a virtual one in virtual time): phases and trial durations.
    clock: Callable[[], float] = time.monotonic

    @property
    def base_config(self) -> mc.ModelConfig:
        """The measured model's own config (a pipeline's: its ensemble or BLS model)."""
        return self.tuned.base

    def server_event(self, trial: int, source: str, what: str, detail: str) -> None:
        """Record and show something that happened to the server during ``trial``."""
        label = "baseline" if trial < 0 and source == "baseline" else f"trial {trial}"
        if source == "validation":
            label = f"validation of trial {trial}"
        self.server_events.append(
            {"at": utc_now(), "trial": trial, "source": source, "event": what, "detail": detail}
        )
        self.observer.on_server(f"{label}: {what}: {detail}")

    def note(self, text: str) -> None:
        """Tell the user (console) and keep it for summary.json."""
        self.notes.append(text)
        self.observer.on_note(text)

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Time a phase (added up when it runs more than once)."""
        t0 = self.clock()
        try:
            yield
        finally:
            self.phases[name] = round(self.phases.get(name, 0.0) + self.clock() - t0, 3)


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
