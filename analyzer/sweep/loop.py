"""The sweep, end to end: ``run_sweep(scenario) -> SweepOutcome``.

::

    target up -> baseline (the model's config as given)
    -> [predict] profile phase (predict/probe.py) -> every config's simulated capacity
       (predictions.json; analyzer.search.strategy.Guide)
    -> Optuna ask/tell (the strategy enqueues: predict its best unmeasured prediction, tpe the
       seeds, grid every config; random and tpe then sample):
        knobs -> ModelConfig -> trials/NNN/config.pbtxt -> repository load (no restart)
        -> measurement (capacity search started near the expected capacity, sequential steps;
           or fixed load, per objective) -> values + slacks -> tell [-> predict: refit]
    -> stop (trials, time budget, stagnation, the predicted best's band, the grid, Ctrl-C)
    -> validate: winner and runner-up at the winner's capacity (sequential), whole capacities
       re-measured only when the two are within noise -> best/config.pbtxt, summary.json
       (time per phase), report.html

A failed load or measurement is a failed trial with its reason kept; the sweep goes on. A
server that dies (:mod:`analyzer.target.liveness` holds the rule) measures nothing: a managed server
is restarted and a ``--url`` server waited for (``run.server_wait_s``), and the trial runs
again; a config that kills its server twice is a finding (``crashed the server``) and the
search goes on. A server that cannot be brought back stops the run: the trial it died in is
recorded ``interrupted: server died``, nothing else is measured, summary.json reports the best
so far as not validated, run.json says ``failed``, and :class:`TargetDiedError` carries the
outcome to the caller (exit 3; ``--resume`` finishes the run).

Seams: the server is a :class:`~analyzer.target.server.Target`, the load a
:class:`~analyzer.measure.generator.LoadGenerator`, the live view a :class:`SweepObserver`; tests pass
fakes for all three.
"""

from __future__ import annotations

import contextlib
import logging
import math
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from analyzer.config.knobs import (
    Knobs,
    apply_knobs,
    candidate_choices,
    kind_choices,
    knobs_of,
    mix_queue_policy_choices,
    response_cache_choices,
)
from analyzer.config.objective import Objective, objective_for, worst_value
from analyzer.config.scenario import Scenario
from analyzer.errors import InputError, TargetDiedError, TargetError
from analyzer.evaluation import Evaluator
from analyzer.evaluation.plan import NEIGHBOUR_GROWTH, Expected
from analyzer.measure.gain import GainSample, gain_estimate, gain_sentence
from analyzer.measure.generator import LoadGenerator
from analyzer.measure.goals import goals_met
from analyzer.predict import ProfileError
from analyzer.predict.profile import Profile, load_profile, run_dir_samples, save_profile
from analyzer.rundir import records
from analyzer.rundir.records import StopReason, TrialRecord
from analyzer.rundir.results import (
    RunDirectory,
    config_text,
    environment,
    new_run_id,
    utc_now,
    write_atomic,
)
from analyzer.search.strategy import (
    Guide,
    grid_configs,
    grid_note,
    nearest_capacity,
    resolve,
    sampler_for,
    with_prediction,
)
from analyzer.search.study import (
    DIED_REASON,
    INTERRUPTED_REASON,
    FinishedTrial,
    Search,
    SearchSpace,
    TrialOutcome,
)
from analyzer.target.factory import make_target
from analyzer.target.server import (
    ConfigRejectedError,
    Target,
    TargetLease,
    leased,
    observed_device,
    renew_target,
    untunable_reason,
)

_LOG = logging.getLogger(__name__)

__all__ = ["SweepObserver", "SweepOutcome", "run_sweep", "space_for"]

#: Consecutive trials failing because the target is gone before the sweep gives up.
MAX_TARGET_FAILURES = 3

#: The failure of a trial whose config killed the server twice (a finding, not a measurement).
CRASHED_REASON = "crashed the server"

#: The profile phase: the live server -> a Profile (``run_sweep(profiler=...)``; tests plant one).
Profiler = Callable[[Target, Scenario], Profile]


# --------------------------------------------------------------------------------------------------
# Records


@dataclass(frozen=True)
class SweepOutcome:
    """What a sweep produced: the trial records behind summary.json, and the file's record
    (:class:`analyzer.rundir.records.RunSummary`, in :attr:`record`; its JSON in :attr:`data`)."""

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
    record: records.RunSummary
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
        self, number: int, source: str, knobs: Knobs, index: int, budget: int
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

    def on_validation(self, number: int, repeat: int, result: TrialRecord) -> None:
        """One validation repeat finished."""

    def on_server_left(self, left: dict[str, Any]) -> None:
        """What the server holds now (``left_on_server`` of summary.json); also on failure."""

    def on_finish(self, summary: SweepOutcome) -> None:
        """Everything is written."""


# --------------------------------------------------------------------------------------------------
# Search space


def space_for(scenario: Scenario, base: mc.ModelConfig | None = None) -> SearchSpace:
    """The search space the scenario bounds (``base``: the model's config, which may refuse a
    response cache: :func:`analyzer.config.knobs.response_cache_choices`)."""
    s = scenario.space
    return SearchSpace.from_bounds(
        s.max_batch_size,
        s.max_queue_delay_us,
        s.delay_steps,
        s.preferred_batch_size,
        s.instance_count,
        response_cache_choices(s.response_cache, base),
        mix_queue_policy_choices(
            s.queue_policy, scenario.traffic.classes, scenario.goals.p99_ms, base
        ),
        candidate_choices(s.max_candidate_sequences, base),
        base=base,
        kind_choices=kind_choices(s.instance_kind, base),
    )


# --------------------------------------------------------------------------------------------------
# The sweep


@dataclass
class _State:
    scenario: Scenario
    objective: Objective
    run_dir: RunDirectory
    target: Target
    base_config: mc.ModelConfig
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
        t0 = time.monotonic()
        try:
            yield
        finally:
            self.phases[name] = round(self.phases.get(name, 0.0) + time.monotonic() - t0, 3)


def run_sweep(
    scenario: Scenario,
    *,
    target: Target | None = None,
    load: LoadGenerator | None = None,
    run_dir: Path | None = None,
    resume: bool = False,
    observer: SweepObserver | None = None,
    clock: Callable[[], float] = time.monotonic,
    command: list[str] | None = None,
    profiler: Profiler | None = None,
) -> SweepOutcome:
    """Run (or resume) a sweep and write its run directory.

    Args:
        scenario: The validated scenario.
        target: The server under test; None = built from the scenario (managed or ``--url``).
        load: The load generator; None = a Locust generator aimed at the target.
        run_dir: The run directory; None = a new ``<output_dir>/<run-id>``. Required to resume.
        resume: Continue the study stored in ``run_dir`` (finished trials are kept).
        observer: Receives progress events.
        clock: Monotonic clock (time budgets).
        command: The command line that started the run (recorded in run.json for the report).
        profiler: The profile phase of ``--search predict`` (None: probe the target,
            :func:`probe_profile`).

    Returns:
        The summary (also written as ``summary.json``).

    Raises:
        TargetError: The target could not be started or kept alive.
        InputError: The scenario cannot run (e.g. the storage cannot be opened).
    """
    observer = observer or SweepObserver()
    started = clock()
    started_at = utc_now()
    # A new run's run.json and scenario.toml are written once the target is up and its model
    # can be tuned: a run that never started leaves no run behind (only a managed server's log,
    # which the error names). A resumed run is marked running again at once.
    directory, run_state = _prepare_run_dir(scenario, run_dir, resume)
    if resume and command is not None:
        run_state.setdefault("command", list(command))
        directory.write_run_state(run_state)
    try:
        summary = _sweep(
            scenario,
            directory,
            run_state,
            target,
            load,
            resume,
            observer,
            clock,
            started,
            started_at,
            command,
            profiler or probe_profile,
        )
    except BaseException as exc:
        if not run_state:
            raise  # the run never started: nothing to mark
        # Keep the directory honest for --resume and for readers: this run did not finish.
        if not isinstance(exc, KeyboardInterrupt):
            run_state.update(
                status="failed", error=str(exc).splitlines()[0] if str(exc) else repr(exc)
            )
        else:
            run_state.update(status="interrupted")
        run_state["finished_at"] = utc_now()
        directory.write_run_state(run_state)
        raise
    observer.on_finish(summary)
    return summary


def _sweep(
    scenario: Scenario,
    directory: RunDirectory,
    run_state: dict[str, Any],
    target: Target | None,
    load: LoadGenerator | None,
    resume: bool,
    observer: SweepObserver,
    clock: Callable[[], float],
    started: float,
    started_at: str,
    command: list[str] | None,
    profiler: Profiler,
) -> SweepOutcome:
    with contextlib.ExitStack() as stack:
        if target is None:
            _refuse_untunable(_repository_config(scenario))  # before a server loads it
            target = make_target(scenario, directory.root)
            stack.callback(target.stop)
        target.notify = observer.on_server
        target.start()
        base_config = target.model_config()
        _refuse_untunable(base_config)  # before anything is loaded
        if resume and (saved := _saved_baseline_config(directory)) is not None:
            # A killed run left a shared server on some trial's config: the original is the
            # one the first process measured and recorded.
            base_config = saved
        if not run_state:
            run_state.update(_create_run(scenario, directory, command))
        if load is None:
            load = stack.enter_context(_locust_generator(scenario, target, observer))
        space = space_for(scenario, base_config)
        objective = objective_for(scenario.objective)
        strategy, why = resolve(scenario, base_config)
        search = Search(
            space,
            objective.directions,
            storage=run_state["storage"],
            study_name=run_state["study_name"],
            sampler=sampler_for(strategy, scenario),
            seed=scenario.run.seed,
            metric_names=objective.metric_names,
        )
        state = _State(
            scenario,
            objective,
            directory,
            target,
            base_config,
            search,
            Evaluator(scenario, load, observer.on_phase),
            observer,
            strategy=strategy,
        )
        # A resumed run's server history goes on from what the earlier processes saw.
        state.server_events = list(run_state.get("server_events") or [])
        state.earlier_restarts = int(run_state.get("server_restarts") or 0)
        state.earlier_outages = list(run_state.get("outages") or [])
        # Two workers of one study must not reload one shared server under each other: claimed
        # before anything is loaded, renewed after every trial, released however the run ends.
        state.lease = stack.enter_context(leased(search, target))
        observer.on_start(directory.root, scenario, target.describe())
        if why:
            state.note(why)
        for record in directory.load_existing_trials():
            result = _resumed(record)
            if result.number < 0:
                state.baseline = result
            else:
                state.results[result.number] = result
        if resume and scenario.run.storage is None:
            for lost in search.recover_interrupted():
                _record_interrupted(state, lost.number, lost.source, lost.knobs, lost.started_at)

        stop_reason = StopReason.INTERRUPTED
        try:
            if state.strategy == "predict":
                # Profile first: the baseline's capacity search then starts at its forecast,
                # and its operating point calibrates the predictions of the whole space.
                state.guide = _profiled(state, profiler)
            if state.baseline is None:
                with state.phase("baseline"):
                    state.baseline = _measure_baseline(state)
            if state.guide is not None and not state.guide.predictions:
                state.guide = _predicted(state, state.guide)
            if state.strategy == "predict" and state.guide is None:
                state.strategy = "tpe"
            if state.baseline.meets_goals:
                state.evaluator.hint_rps = state.baseline.throughput_rps
            state.evaluator.reference_rps = objective.reference_rps(
                state.evaluator.reference_rps,
                state.baseline.throughput_rps,
                scenario.traffic.min_rate_rps,
            )
            fresh = not search.finished() and search.started_count() == 0
            if fresh and state.strategy == "tpe":
                for knobs in space.seeds(knobs_of(base_config), scenario.goals.p99_ms):
                    search.enqueue(knobs, "sensible default")
            if state.strategy == "grid":
                grid = grid_configs(space)
                if (text := grid_note(len(grid), scenario.budget.trials)) is not None:
                    state.note(text)
                if fresh:
                    for knobs in grid:
                        search.enqueue(knobs, "grid", source="grid")
            with state.phase("search"):
                stop_reason = _search_loop(state, clock, started)
            if stop_reason is not StopReason.INTERRUPTED:
                with state.phase("validation"):
                    validation = _validate(state)
            else:
                validation = []
        except KeyboardInterrupt:
            stop_reason, validation = StopReason.INTERRUPTED, []
        except TargetDiedError as exc:
            # Nothing more is sent to the server: the run so far is written (the best not
            # validated), run.json says failed, and the caller gets the outcome with the error.
            state.dead = True
            run_state.update(error=_first_line(exc), failed_at=utc_now())
            exc.outcome = _finish(
                state, StopReason.SERVER_DIED, [], started_at, clock() - started, run_state
            )
            raise
        except BaseException:
            run_state["left_on_server"] = _leave_server(state, None)
            raise
        return _finish(state, stop_reason, validation, started_at, clock() - started, run_state)


def _resumed(record: TrialRecord) -> TrialRecord:
    """A record read back on ``--resume``: records written before the one rule could say an
    unusable measurement met the goals; it does not."""
    return replace(record, meets_goals=record.meets_goals and record.problem() is None)


def _repository_config(scenario: Scenario) -> mc.ModelConfig | None:
    """The managed server's model config as written on disk (None when unknown or unreadable:
    the server then reports the problem itself)."""
    m = scenario.model
    if m.url or m.repository is None:
        return None
    path = Path(m.repository) / m.name / "config.pbtxt"
    try:
        config = text_format.Parse(
            path.read_text(encoding="utf-8"), mc.ModelConfig(), allow_unknown_field=True
        )
    except (OSError, text_format.ParseError, ValueError):
        return None
    if not config.name:
        config.name = m.name
    return config


def _refuse_untunable(config: mc.ModelConfig | None) -> None:
    """Raise InputError for a model no dynamic-batching config can tune."""
    if config is None:
        return
    reason = untunable_reason(config)
    if reason:
        raise InputError(reason)
    if config.max_batch_size == 0:
        # Its inputs carry no batch dimension: no batching config could ever load.
        raise InputError(
            f"model {config.name!r} has max_batch_size 0 (no batch dimension), so it cannot "
            "be batched; give it a batch dimension and max_batch_size >= 1 to tune it"
        )


def _saved_baseline_config(directory: RunDirectory) -> mc.ModelConfig | None:
    path = directory.trial_dir(-1) / "config.pbtxt"
    if not path.exists():
        return None
    return text_format.Parse(path.read_text(encoding="utf-8"), mc.ModelConfig())


def _record_interrupted(
    state: _State,
    number: int,
    source: str,
    knobs: Knobs,
    started_at: str,
    reason: str = INTERRUPTED_REASON,
) -> None:
    """Record a trial the run stopped during: it is a trial of this run, not a result."""
    result = TrialRecord(
        number=number,
        source=source,
        state="interrupted",
        config=knobs,
        failure=reason,
        started_at=started_at,
    )
    state.results[number] = result
    state.run_dir.write_trial(result)


def _leave_server(state: _State, chosen: TrialRecord | None) -> dict[str, Any]:
    """Put a shared server back on a known config (``run.leave``) and say which; once.

    The config is sent explicitly in the load override: an empty load means "the on-disk
    config" on one server and "keep the override" on another (Triton).
    """
    if state.left is not None:
        return state.left
    target, base = state.target, state.base_config
    left: dict[str, Any] = {"config": None, "knobs": None, "detail": ""}
    state.left = left  # decided: a second Ctrl-C during the load does not retry it
    if not target.shared:
        left["detail"] = "the managed server is stopped at the end of the run: nothing is left"
    elif state.dead:
        left["detail"] = (
            "the server died and did not return: nothing was restored (once back it holds "
            "the config it started with)"
        )
    elif not state.touched:
        left.update(config="original", knobs=knobs_of(base).to_dict())
        left["detail"] = "the model's original config (the run never changed it)"
    else:
        which, config, detail = "original", base, "restored the model's original config"
        if state.scenario.run.leave == "best":
            if chosen is None:
                detail = "no config met the goals, so restored the model's original config"
            elif chosen.number < 0:
                which, detail = (
                    "best",
                    "the best config is the model's original config: restored it",
                )
            else:
                which, config = "best", apply_knobs(base, chosen.config)
                detail = f"loaded the best config (trial {chosen.number})"
        try:
            target.load_config(config)
        except (TargetError, OSError) as exc:
            left["detail"] = (
                f"could not load the {which} config back ({exc}); the server may still hold the "
                "last trial's config"
            )
        else:
            left.update(config=which, knobs=knobs_of(config).to_dict(), detail=detail)
    state.observer.on_server_left(left)
    return left


def _prepare_run_dir(
    scenario: Scenario, run_dir: Path | None, resume: bool
) -> tuple[RunDirectory, dict[str, Any]]:
    if resume:
        if run_dir is None:
            raise InputError("--resume needs the run directory")
        directory = RunDirectory(Path(run_dir))
        state = directory.read_run_state()
        if state.get("status") == "failed":
            # Why the last process stopped stays on record, no longer as the run's status.
            failure = {
                k: state.pop(k) for k in ("error", "failed_at", "failed_trial") if k in state
            }
            state.setdefault("earlier_failures", []).append(failure)
        state.update(status="running", resumed_at=utc_now())
        directory.write_run_state(state)
        return directory, state
    if run_dir is None:
        run_id = new_run_id(scenario.model.name)
        run_dir = scenario.run.output_dir / run_id
        suffix = 1
        while run_dir.exists():
            suffix += 1
            run_dir = scenario.run.output_dir / f"{run_id}-{suffix}"
    directory = RunDirectory(Path(run_dir))
    if directory.run_json.exists():
        raise InputError(
            f"{directory.root} already holds a run; use --resume {directory.root} or another directory"
        )
    return directory, {}  # written by _create_run once the target is up


def _create_run(
    scenario: Scenario, directory: RunDirectory, command: list[str] | None
) -> dict[str, Any]:
    """Write scenario.toml and run.json (status running) of a new run; returns the run state."""
    directory.root.mkdir(parents=True, exist_ok=True)
    write_atomic(directory.scenario_toml, scenario.to_toml())
    state: dict[str, Any] = {
        "run_id": directory.root.name,
        "status": "running",
        "storage": scenario.run.storage or str(directory.journal),
        "study_name": scenario.run.study_name or directory.root.name,
        "scenario_hash": scenario.hash(),
        "started_at": utc_now(),
        "finished_at": None,
    }
    if command is not None:
        state["command"] = list(command)
    directory.write_run_state(state)
    return state


@contextlib.contextmanager
def _locust_generator(
    scenario: Scenario, target: Target, observer: SweepObserver
) -> Iterator[LoadGenerator]:
    from analyzer.load import LocustLoadGenerator  # gevent: only when measuring
    from analyzer.load.engine import engine_options
    from analyzer.measure.measurement import WindowStats
    from analyzer.measure.specs import LoadMode, LoadSpec

    def on_window(spec: LoadSpec, window: WindowStats) -> None:
        unit = "req/s" if spec.mode is LoadMode.REQUEST_RATE else "users"
        observer.on_phase(
            f"load {spec.target:g} {unit}: window {window.index + 1} "
            f"{window.throughput_rps:.1f} req/s, p99 {window.p99_ms:.1f} ms"
        )

    options = engine_options(
        scenario,
        target.url,
        target.model,
        # GPU utilisation, memory and power per window: the managed server's metrics port,
        # or --metrics-url for a --url server (None: the engine tries the HTTP port once).
        metrics_url=getattr(target, "metrics_url", "") or scenario.model.metrics_url or None,
        # model.protocol grpc: a managed server's own gRPC port; a --url server's HTTP port + 1.
        grpc_url=getattr(target, "grpc_url", "") or None,
        distributed=True,
        # Latency is timed from the intended send, so send lag is already in every p99; a lag
        # of a tenth of the goal cannot flip a verdict, so only more than that is "saturated".
        # The tightest goal counts: a class held to 60 ms is flipped by a 40 ms stall.
        max_send_lag_ms=max(10.0, 0.1 * scenario.tightest_p99_ms()),
        on_window=on_window,
    )
    with LocustLoadGenerator(options) as generator:
        yield generator


def _measure_baseline(state: _State) -> TrialRecord:
    """The model's own config, measured once. With predictions its forecast capacity is
    checked, not searched for: a step below the forecast that must pass and one above it that
    must fail bracket the capacity (the gain's interval covers that bracket); a full capacity
    search runs only when either step disagrees with the forecast."""
    knobs = knobs_of(state.base_config)
    state.run_dir.write_config(-1, state.base_config)
    state.observer.on_trial_start(-1, "baseline", knobs, 0, state.scenario.budget.trials)
    forecast = state.guide.forecast(knobs) if state.guide is not None else None
    expect = None
    if forecast is not None and forecast.capacity_rps > 0 and state.objective.capacity:
        expect = Expected(forecast.capacity_rps, check=True)
    result = _run_trial(state, -1, "baseline", knobs, state.base_config, expect=expect)
    if forecast is not None:
        result = replace(result, prediction=forecast)
    state.run_dir.write_trial(result)
    state.observer.on_trial_end(result, None)
    return result


def _run_trial(
    state: _State,
    number: int,
    source: str,
    knobs: Knobs,
    config: mc.ModelConfig,
    factor: float = 1.0,
    near_rps: float | None = None,
    expect: Expected | None = None,
    check_rps: float | None = None,
    fails_at_rps: float | None = None,
) -> TrialRecord:
    """Load ``config`` and measure it; a failure becomes a failed result, never an exception.

    ``check_rps``: one sequential step at that rate instead (validation); else the objective's
    measurement, its capacity search near ``near_rps`` or ``expect`` (an expected capacity and
    how to bracket it, :func:`_expected`), below ``fails_at_rps`` when a rate is
    known to fail (validation).

    A server that dies during the trial (:class:`TargetDiedError`) is brought back by
    ``ensure_alive`` (a restart, or a wait for a ``--url`` server) and the trial runs again
    once; a second death makes the trial a finding: failed, ``crashed the server``.

    Raises:
        TargetDiedError: The server is dead and cannot be brought back: the sweep stops.
    """
    started_at, t0 = utc_now(), time.monotonic()
    failure = ""
    for attempt in (1, 2):
        try:
            state.target.ensure_alive()
        except TargetDiedError as exc:  # it cannot be brought back: the sweep stops
            state.server_event(number, source, "lost", _first_line(exc))
            raise
        try:
            state.touched = True
            state.target.load_config(config)
            evaluation = (
                state.evaluator.check(check_rps, factor)
                if check_rps
                else state.evaluator.evaluate(
                    factor,
                    near_rps,
                    expected=expect,
                    fails_at_rps=fails_at_rps,
                )
            )
        except ConfigRejectedError as exc:
            failure = str(exc)
            break
        except TargetDiedError as exc:
            failure = _first_line(exc)
            if attempt == 1:
                state.server_event(number, source, "died", failure)
                continue
            # The same config lost its server twice: the config is the finding.
            state.server_event(number, source, CRASHED_REASON, failure)
            failure = f"{CRASHED_REASON} twice: {failure}"
            state.target_failures += 1
            break
        except TargetError as exc:
            failure = str(exc)
            if attempt == 1:
                state.observer.on_phase(f"target failed ({exc}); retrying")
                continue
            state.target_failures += 1
            break
        except (OSError, RuntimeError, ValueError) as exc:  # load generator failures
            failure = f"{type(exc).__name__}: {exc}"
            break
        state.target_failures = 0
        numbers, constraints = evaluation.numbers, evaluation.constraints
        return TrialRecord(
            number=number,
            source=source,
            state="complete",
            config=knobs,
            throughput_rps=numbers["throughput_rps"],
            offered_rps=numbers["offered_rps"],
            p50_ms=numbers["p50_ms"],
            p90_ms=numbers["p90_ms"],
            p99_ms=numbers["p99_ms"] if math.isfinite(numbers["p99_ms"]) else 0.0,
            error_rate=numbers["error_rate"],
            # The one rule: a usable measurement, and every slack satisfied.
            meets_goals=goals_met(evaluation.measurement.problem(), constraints),
            constraints=dict(constraints),
            values=evaluation.values,
            started_at=started_at,
            duration_s=round(time.monotonic() - t0, 3),
            measurement=evaluation.measurement,
        )
    return TrialRecord(
        number=number,
        source=source,
        state="failed",
        config=knobs,
        failure=failure,
        started_at=started_at,
        duration_s=round(time.monotonic() - t0, 3),
    )


def _stagnant(results: dict[int, TrialRecord], scenario: Scenario, objective: Objective) -> bool:
    """True after ``patience`` trials without a feasible improvement of ``min_improvement``."""
    b = scenario.budget
    best: TrialRecord | None = None
    since = 0
    for number in sorted(results):
        r = results[number]
        if r.state == "interrupted":
            continue  # not a result: its config runs again
        improved = (
            r.state == "complete"
            and r.meets_goals
            and objective.improved(r, best, b.min_improvement)
        )
        if improved:
            best, since = r, 0
        else:
            since += 1
    # Without any feasible config there is nothing to stagnate on: keep searching for one.
    return best is not None and since >= b.patience


def _search_loop(state: _State, clock: Callable[[], float], started: float) -> StopReason:
    scenario, search, guide = state.scenario, state.search, state.guide
    budget = scenario.budget
    grid = len(grid_configs(search.space)) if state.strategy == "grid" else None
    while True:
        done = search.started_count()
        if done >= budget.trials:
            return StopReason.TRIALS
        if budget.time_budget_s is not None and clock() - started >= budget.time_budget_s:
            return StopReason.TIME_BUDGET
        if grid is not None:
            if done >= grid:
                return StopReason.GRID
        elif guide is not None:
            measured = [r.config for r in state.results.values() if r.state != "interrupted"]
            best = state.objective.best(state.results.values())
            bracket = state.objective.gain_sample(best) if best else None
            if guide.settled(
                best.throughput_rps if best else None,
                bracket.high if bracket and bracket.high > bracket.value else None,
            ):
                return StopReason.PREDICTION
            upcoming = guide.next_config(measured)
            if upcoming is not None:
                search.enqueue(upcoming, "predicted capacity", source="predict")
            elif _stagnant(state.results, scenario, state.objective):
                return StopReason.STAGNATION  # every prediction measured: the sampler goes on
        elif _stagnant(state.results, scenario, state.objective):
            return StopReason.STAGNATION
        asked = search.ask()
        config = apply_knobs(state.base_config, asked.knobs)
        state.run_dir.write_config(asked.number, config)
        state.observer.on_trial_start(
            asked.number, asked.source, asked.knobs, done + 1, budget.trials
        )
        try:
            result = _run_trial(
                state,
                asked.number,
                asked.source,
                asked.knobs,
                config,
                expect=_expected(state, asked.knobs),
            )
        except (KeyboardInterrupt, TargetDiedError) as exc:
            # Not a result: the config runs again on --resume.
            reason = DIED_REASON if isinstance(exc, TargetDiedError) else INTERRUPTED_REASON
            search.fail(asked.number, reason)
            search.enqueue(asked.knobs, "re-run", again=True, source=asked.source)
            _record_interrupted(state, asked.number, asked.source, asked.knobs, utc_now(), reason)
            raise
        if guide is not None:
            result = with_prediction(result, guide.predictions)
        if result.state == "complete":
            search.tell(
                asked.number,
                TrialOutcome(
                    result.values,
                    result.constraints,
                    {"throughput_rps": result.throughput_rps, "p99_ms": result.p99_ms},
                ),
            )
            if result.meets_goals and (state.evaluator.hint_rps or 0) < result.throughput_rps:
                state.evaluator.hint_rps = result.throughput_rps
        else:
            search.fail(asked.number, result.failure or "failed")
            if state.target_failures >= MAX_TARGET_FAILURES:
                state.results[asked.number] = result
                state.run_dir.write_trial(result)
                raise TargetDiedError(
                    f"{MAX_TARGET_FAILURES} trials in a row lost their server: {result.failure}",
                    state.target.url,
                )
        state.results[asked.number] = result
        if state.lease is not None:
            state.lease = renew_target(search, state.lease)
        state.run_dir.write_trial(result)
        state.observer.on_trial_end(result, state.objective.best(state.results.values()))
        if guide is not None and result.state == "complete":
            _refit(state, guide, budget.trials - search.started_count())


def _expected(state: _State, knobs: Knobs) -> Expected | None:
    """Where a trial's capacity search starts, and the growth that brackets it: the config's
    predicted capacity (small steps), else the capacity of the nearest finished trial, the
    baseline included (larger steps: a neighbour is a looser guess); None: neither is known."""
    if not state.objective.capacity:
        return None
    if state.guide is not None:
        prediction = state.guide.prediction(knobs)
        if prediction is not None and prediction.capacity_rps > 0:
            return Expected(prediction.capacity_rps)
    finished = [*state.results.values(), *([state.baseline] if state.baseline else [])]
    rps = nearest_capacity(state.search.space, knobs, finished)
    return None if rps is None else Expected(rps, NEIGHBOUR_GROWTH)


# --------------------------------------------------------------------------------------------------
# Predict: the profile phase and the predictions


def probe_profile(target: Target, scenario: Scenario) -> Profile:
    """The profile phase on a live server (:func:`analyzer.predict.probe.probe`), up to the
    space's largest batch (the model's own ``max_batch_size`` may be smaller), within
    ``search.profile_time_s``, with the requests the load sends (the scenario's ``[input]``,
    its size mix included). The probe leaves a probe config loaded: the sweep loads the
    next trial's (or gives a shared server its config back at the end).

    Raises:
        ProfileError: The model cannot be probed, or the profile cannot represent the request
            data (the message says why).
        TargetError: The server failed a request or refused a probe config.
    """
    from analyzer.load.engine import input_options
    from analyzer.predict.probe import ProbePlan, probe
    from analyzer.target.server_stats import http_stats_source

    # The probe reads batch_stats: a server without them (or not answering) is told apart
    # before any probe config is loaded.
    try:
        http_stats_source(target.url, target.model)()
    except Exception as exc:  # urllib / socket / JSON errors: translated where they enter
        raise ProfileError(
            f"the server's statistics (/v2/models/{target.model}/stats) cannot be read: "
            f"{_first_line(exc)}"
        ) from exc
    largest = scenario.space.max_batch_size[1]
    # Interference is information (the simulator serialises the device itself): 2 instances
    # when the space has several, none otherwise.
    several = scenario.space.instance_count[1] > 1
    plan = ProbePlan(instances=2 if several else 1, time_budget_s=scenario.search.profile_time_s)
    inputs = input_options(scenario.input, scenario.run.seed)  # the load's own request data
    return probe(_Widened(target, largest), plan, inputs=inputs)


class _Widened:
    """A target whose model config reads ``max_batch_size`` as the space's largest, so the probe
    profiles every batch size a searched config can execute (the space's bounds are the user's
    statement that such configs load)."""

    def __init__(self, target: Target, max_batch_size: int) -> None:
        self._target = target
        self._mbs = max_batch_size

    def __getattr__(self, name: str) -> Any:
        return getattr(self._target, name)

    def model_config(self) -> mc.ModelConfig:
        config = self._target.model_config()
        config.max_batch_size = max(config.max_batch_size, self._mbs)
        return config


def _profiled(state: _State, profiler: Profiler) -> Guide | None:
    """The profile phase (or a resumed run's predictions): a guide that can forecast single
    configs (the baseline) before :func:`_predicted` simulates the space; None when no profile
    can be taken (the sweep then searches with tpe and says why)."""
    scenario, directory = state.scenario, state.run_dir
    goal, half = scenario.goals.p99_ms, scenario.search.band
    ceiling = scenario.traffic.max_rate_rps
    profile_path = directory.root / "profile.json"
    if directory.predictions_json.exists() and profile_path.exists():
        try:
            saved = records.load_predictions(directory.predictions_json)
            return Guide.from_record(saved, load_profile(profile_path), goal, half, ceiling)
        except (InputError, OSError) as exc:
            _LOG.warning("predictions of the resumed run unreadable (%s): predicting again", exc)
    state.observer.on_trial_start(
        -1, "profile", knobs_of(state.base_config), 0, scenario.budget.trials
    )
    state.observer.on_phase("profile phase: batches of chosen sizes")
    try:
        with state.phase("profile"):
            state.touched = True
            profile = profiler(state.target, scenario)
    except (ProfileError, TargetError, InputError, OSError, RuntimeError, ValueError) as exc:
        state.note(
            f"search predict: no profile could be taken ({_first_line(exc)}); searching with tpe"
        )
        return None
    save_profile(profile, profile_path)
    return Guide(profile, goal, half, seed=scenario.run.seed, ceiling_rps=ceiling)


def _predicted(state: _State, guide: Guide) -> Guide | None:
    """The predict phase: the profile's latency offset calibrated on the baseline's operating
    point, then every config of the space simulated; None when nothing could be predicted."""
    directory = state.run_dir
    space_configs = grid_configs(state.search.space)
    state.observer.on_phase(f"predicting {len(space_configs)} configs")
    try:
        with state.phase("predict"):
            guide.calibrate(_finished(state))
            guide.predict_space(space_configs)
    except (InputError, ValueError) as exc:
        state.note(f"search predict: the simulator failed ({_first_line(exc)}); searching with tpe")
        return None
    profile = guide.profile
    if not guide.predictions:
        state.note(
            f"search predict: the profile covers batch sizes {profile.min_batch_size}-"
            f"{profile.max_batch_size}, no config of the space; searching with tpe"
        )
        return None
    policies = [k for k in guide.uncovered if k.queue_policy is not None]
    larger = [k for k in guide.uncovered if k.queue_policy is None]
    if policies:
        state.note(
            f"search predict: {len(policies)} configs set priorities or a queue policy, which "
            "the simulator does not model: they are not predicted, and predict does not choose "
            "them"
        )
    if larger:
        state.note(
            f"search predict: {len(larger)} configs need batches above the profiled "
            f"{profile.max_batch_size}: they are not predicted, and predict does not choose them"
        )
    records.write_predictions(directory.predictions_json, guide.record(space_configs))
    best = guide.best()
    if best is not None:
        state.observer.on_phase(
            f"predicted best {best[0].label()}: {best[1].capacity_rps:.0f} req/s "
            f"({best[1].low_rps:.0f}-{best[1].high_rps:.0f})"
        )
    return guide


def _finished(state: _State) -> list[TrialRecord]:
    """Every measurement so far, the baseline's first: where the predictions' latency offset is
    calibrated."""
    return [*([state.baseline] if state.baseline else []), *state.results.values()]


def _refit(state: _State, guide: Guide, remaining: int) -> None:
    """Rescale the probed profile to the run's trial windows, calibrate its latency offset on every
    operating point measured so far (the baseline's included), and re-predict the configs
    still in reach (twice the trials left); a run whose windows carry no statistics keeps its
    execution times."""
    if remaining <= 0:
        return
    try:
        samples = run_dir_samples(state.run_dir.root)
    except (InputError, ValueError) as exc:
        _LOG.debug("no refit of the execution times: %s", exc)
        samples = []
    try:
        guide.refit(
            samples,
            [r.config for r in state.results.values()],
            2 * remaining,
            _finished(state),
            where=f"run directory {state.run_dir.root.name}",
        )
    except (InputError, ValueError) as exc:
        _LOG.debug("no refit: %s", exc)
        return
    records.write_predictions(
        state.run_dir.predictions_json, guide.record(grid_configs(state.search.space))
    )


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _validate(state: _State) -> list[records.ValidationCandidate]:
    """Re-measure the best configs before one is chosen: at the winner's capacity
    (``budget.validation = "check"``, a capacity objective in open loop:
    :func:`_validate_at_capacity`), else every top config ``budget.validate_repeats`` times
    with longer windows."""
    objective = state.objective
    if not objective.validates or state.scenario.budget.validate_top == 0:
        return []
    check = state.scenario.budget.validation == "check"
    if check and objective.checks_at_capacity and state.evaluator.plan.open_loop:
        return _validate_at_capacity(state)
    return _validate_repeats(state)


def _validate_at_capacity(state: _State) -> list[records.ValidationCandidate]:
    """Validation that pays for itself.

    The winner and the runner-up (``budget.validate_top`` >= 2) are each measured once at the
    winner's capacity with the sequential test (:meth:`Evaluator.check`, longer windows): a
    step far from the goal ends after a few hundred requests. Their whole capacities are
    re-measured (a capacity search near each) only when the two are within noise: the
    runner-up serves the winner's capacity too, or the winner does not. The baseline is
    measured once (its baseline measurement); it competes only when its capacity beat the
    winner's in the search.
    """
    scenario, objective = state.scenario, state.objective
    b = scenario.budget
    feasible = [r for r in state.results.values() if r.state == "complete" and r.meets_goals]
    top = objective.validation_candidates(feasible, min(b.validate_top, 2))
    if not top:
        return []
    winner = top[0]
    rate = winner.throughput_rps

    def measure(r: TrialRecord, index: int, total: int, **how: Any) -> TrialRecord:
        state.observer.on_trial_start(r.number, "validation", r.config, index, total)
        result = _run_trial(
            state,
            r.number,
            "validation",
            r.config,
            apply_knobs(state.base_config, r.config),
            factor=b.validate_window_factor,
            **how,
        )
        state.observer.on_validation(r.number, index, result)
        return result

    checks = {r.number: measure(r, 1, 2, check_rps=rate) for r in top}
    winner_held = checks[winner.number].meets_goals
    # A runner-up whose check did not complete is not known to be slower: within noise too.
    close = [
        r for r in top[1:] if checks[r.number].state != "complete" or checks[r.number].meets_goals
    ]
    remeasured: dict[int, list[TrialRecord]] = {}
    if close or not winner_held:
        state.observer.on_phase("within noise: re-measuring the whole capacities")
        for r in top:
            # A failed check bounds the re-measurement: it need not climb past that rate again.
            failed = checks[r.number].state == "complete" and not checks[r.number].meets_goals
            remeasured[r.number] = [
                measure(r, 2, 2, near_rps=r.throughput_rps, fails_at_rps=rate if failed else None)
            ]
    candidates = []
    for r in top:
        check = checks[r.number]
        # The check is the one repeat, unless the whole capacity was measured again: that
        # measurement then says what the config serves, and the check is kept beside it.
        runs = remeasured.get(r.number, [check])
        state.validated[r.number] = runs
        candidates.append(
            replace(
                _candidate(r, runs),
                check_rps=rate,
                check_met=check.meets_goals if check.state == "complete" else None,
                check=check.measurement,
            )
        )
    baseline = state.baseline
    if baseline is not None and baseline.meets_goals and baseline.throughput_rps > rate:
        # The starting config competes too (its one measurement): a sweep must never recommend
        # a config worse than what the model already had.
        state.validated.setdefault(baseline.number, []).append(baseline)
        candidates.append(_candidate(baseline, [baseline]))
    state.run_dir.write_validation(records.Validation(tuple(candidates)))
    return candidates


def _candidate(r: TrialRecord, runs: list[TrialRecord]) -> records.ValidationCandidate:
    """A validated config: every repeat's numbers and the one repeat rule's worst case."""
    ok = [x for x in runs if x.state == "complete"]
    # The one repeat rule (Objective.repeat_figure): the worst repeat, a repeat that missed
    # the goals counting as 0 req/s.
    worst_rps = (
        worst_value("throughput_rps", [x.throughput_rps if x.meets_goals else 0.0 for x in ok])
        if ok
        else 0.0
    )
    worst_p99 = worst_value("p99_ms", [x.p99_ms for x in ok]) if ok else math.inf
    return records.ValidationCandidate(
        trial_number=r.number,
        config=r.config,
        search_throughput_rps=r.throughput_rps,
        throughput_rps=tuple(x.throughput_rps for x in runs),
        p99_ms=tuple(x.p99_ms for x in runs),
        meets_goals=tuple(x.meets_goals for x in runs),
        worst_rps=worst_rps,
        worst_p99_ms=worst_p99 if math.isfinite(worst_p99) else None,
        all_meet_goals=bool(ok) and len(ok) == len(runs) and all(x.meets_goals for x in ok),
        p99_n=tuple(x.request_count() for x in runs),
        measurements=tuple(x.measurement for x in runs),
    )


def _validate_repeats(state: _State) -> list[records.ValidationCandidate]:
    """Re-measure the top feasible configs with longer windows; keep every repeat's numbers."""
    scenario, objective = state.scenario, state.objective
    b = scenario.budget
    feasible = [r for r in state.results.values() if r.state == "complete" and r.meets_goals]
    top = objective.validation_candidates(feasible, b.validate_top)
    baseline = state.baseline
    if top and baseline and baseline.meets_goals and baseline.config not in [t.config for t in top]:
        # The starting config competes too: a sweep must never recommend a config that is
        # worse than what the model already had, just because one search measurement was lucky.
        top.append(baseline)
    order = [(r, i) for i in range(b.validate_repeats) for r in top]
    random.Random(scenario.run.seed).shuffle(order)  # interleaved: drift hits all alike
    repeats: dict[int, list[TrialRecord]] = {r.number: [] for r in top}
    for r, i in order:
        state.observer.on_trial_start(r.number, "validation", r.config, i + 1, b.validate_repeats)
        config = state.base_config if r.number < 0 else apply_knobs(state.base_config, r.config)
        result = _run_trial(
            state,
            r.number,
            "validation",
            r.config,
            config,
            factor=b.validate_window_factor,
            near_rps=r.throughput_rps,
        )
        repeats[r.number].append(result)
        state.validated.setdefault(r.number, []).append(result)
        state.observer.on_validation(r.number, i + 1, result)
    candidates = [_candidate(r, repeats[r.number]) for r in top]
    state.run_dir.write_validation(records.Validation(tuple(candidates)))
    return candidates


def _choose(
    state: _State, validation: list[records.ValidationCandidate]
) -> tuple[TrialRecord | None, float | None]:
    """The best worst case among validated configs, else the best search trial."""
    passing = [c for c in validation if c.all_meet_goals]
    if passing:
        chosen, state.tie_break = state.objective.choose(
            passing, state.scenario.budget.capacity_resolution
        )
        number = chosen.trial_number
        if number < 0 and state.baseline is not None:
            return state.baseline, chosen.worst_rps
        return state.results[number], chosen.worst_rps
    return state.objective.best(state.results.values()), None


def _headline(state: _State, result: TrialRecord | None) -> TrialRecord | None:
    """``result`` as its worst validation repeat (numbered like the trial), when it was validated
    and every repeat completed; the search measurement otherwise."""
    if result is None:
        return None
    runs = state.validated.get(result.number, [])
    if not runs or any(r.state != "complete" for r in runs):
        return result
    # A repeat that missed the goals (e.g. an invalid measurement with a low p99) is the worst
    # case, whatever its numbers read.
    return replace(state.objective.worst_repeat(runs), number=result.number)


def _finish(
    state: _State,
    stop_reason: StopReason,
    validation: list[records.ValidationCandidate],
    started_at: str,
    duration_s: float,
    run_state: dict[str, Any],
) -> SweepOutcome:
    scenario, directory = state.scenario, state.run_dir
    chosen, validated_rps = _choose(state, validation)
    died = stop_reason is StopReason.SERVER_DIED
    # Headline numbers: the worst validation repeat when validated, so that baseline, best and
    # gain all rest on the longer, re-measured windows rather than on one lucky search step.
    best = _headline(state, chosen)
    baseline = _headline(state, state.baseline)
    pareto, pareto_entries = _front(state)
    gain = _gain(state, chosen, best, baseline)
    if died and gain.gain is not None:
        gain = _Gain(
            gain.gain,
            f"gain over baseline: {gain.gain:.2f}x from the search, NOT VALIDATED: the server "
            "died before validation (resume the run to validate it)",
        )
    recommendation = _recommend(state, chosen, gain, died)
    best_path = candidate_path = None
    if recommendation.config is not None:
        best_path = directory.write_best(recommendation.config)
    if recommendation.withheld is not None:
        candidate_path = directory.root / "candidate" / "config.pbtxt"
        write_atomic(candidate_path, config_text(recommendation.withheld))
    left = _leave_server(state, recommendation.trial)
    goal_text = f"goal p99 <= {scenario.goals.p99_ms:g} ms" + (
        f": {scenario.goals.note}" if scenario.goals.note else ""
    )
    counts: dict[str, int] = {"complete": 0, "failed": 0, "interrupted": 0}
    for r in state.results.values():
        counts[r.state] = counts.get(r.state, 0) + 1
    counts["total"] = sum(counts.values())
    best_entry = None
    if best and chosen:
        entry_path = candidate_path or best_path
        best_entry = records.ConfigEntry.from_trial(
            best,
            config_path=directory.relative(entry_path) if entry_path else None,
            search_throughput_rps=chosen.throughput_rps,
            validated_throughput_rps=validated_rps,
        )
    baseline_entry = None
    if baseline and state.baseline:
        baseline_entry = records.ConfigEntry.from_trial(
            baseline,
            config_path=directory.relative(directory.trial_dir(-1) / "config.pbtxt"),
            search_throughput_rps=state.baseline.throughput_rps,
        )
    target_info = state.target.describe()
    devices = target_info.get("devices") or []
    restarts = state.earlier_restarts + int(target_info.get("restarts") or 0)
    outages = [*state.earlier_outages, *(target_info.get("outages") or ())]
    summary = records.RunSummary(
        run_id=run_state["run_id"],
        model=scenario.model.name,
        # The device that actually ran (the server's own report), not only the one asked for.
        device=observed_device(devices, state.target.device),
        device_requested=state.target.device,
        devices=tuple(devices),
        # The GPUs the server reported on /metrics (not the client host's: environment.gpu).
        server_gpus=tuple(records.server_gpus(baseline_entry, best_entry)),
        target_url=state.target.url,
        goals=scenario.goals.model_dump(),
        objective=scenario.objective,
        baseline=baseline_entry,
        best=best_entry,
        gain=gain.gain,
        gain_ci=gain.ci,
        gain_significant=gain.significant,
        gain_repeats=gain.repeats,
        gain_text=gain.text,
        goal_text=goal_text,
        tie_break=state.tie_break,
        trials=counts,
        stop_reason=stop_reason,
        left_on_server=left,
        pareto=pareto_entries,
        validation=tuple(validation),
        environment=environment(scenario.hash(), target_info),
        scenario=scenario.to_dict(),
        study={"storage": _redact(run_state["storage"]), "study_name": run_state["study_name"]},
        files={
            "best_config": directory.relative(best_path) if best_path else None,
            "trials_csv": "trials.csv",
            "report": "report.html",
            "study": "study.journal" if scenario.run.storage is None else None,
        },
        started_at=started_at,
        finished_at=utc_now(),
        duration_s=round(duration_s, 1),
        search_strategy=state.strategy,
        search_note="; ".join(state.notes) or None,
        phases={k: round(v, 1) for k, v in state.phases.items()},
        recommendation=recommendation.to_dict(
            directory.relative(candidate_path) if candidate_path else None
        ),
        server_events=tuple(state.server_events),
        server_restarts=restarts,
        outages=tuple(outages),
    )
    directory.write_summary(summary)
    # run.json first: the report reads the run's status from it.
    status = {StopReason.INTERRUPTED: "interrupted", StopReason.SERVER_DIED: "failed"}.get(
        stop_reason, "completed"
    )
    run_state.update(
        status=status,
        finished_at=summary.finished_at,
        left_on_server=left,
        server_restarts=restarts,
        outages=[dict(o) for o in summary.outages],
        server_events=[dict(e) for e in summary.server_events],
    )
    if died and state.server_events:
        last = state.server_events[-1]
        run_state["failed_trial"] = {"number": last["trial"], "source": last["source"]}
    directory.write_run_state(run_state)
    t0 = time.monotonic()
    _write_report(directory, summary)
    phases = {**summary.phases, "report": round(time.monotonic() - t0, 1)}
    return SweepOutcome(
        directory.root,
        run_state["run_id"],
        baseline,
        best,
        gain.gain,
        counts,
        stop_reason,
        best_path,
        pareto,
        summary,
        phases,
    )


@dataclass(frozen=True)
class _Recommendation:
    """What ``best/config.pbtxt`` holds (``config``; None: nothing is written) and why."""

    #: ``best`` (the chosen config), ``original`` (the model's own) or None (nothing).
    which: str | None
    detail: str
    config: mc.ModelConfig | None = None
    #: The trial the config is (what a shared server is left on with ``--leave best``).
    trial: TrialRecord | None = None
    #: A winner not written as best/config.pbtxt (its gain is not significant).
    withheld: mc.ModelConfig | None = None

    def to_dict(self, candidate_path: str | None) -> dict[str, Any]:
        return {"config": self.which, "detail": self.detail, "candidate_config": candidate_path}


def _recommend(
    state: _State, chosen: TrialRecord | None, gain: _Gain, died: bool
) -> _Recommendation:
    """The one recommendation rule: best/config.pbtxt holds the chosen config only when it is
    known to be better than the model's own config.

    * nothing met the goals, or the server died before validation: nothing is written;
    * the chosen config is the model's own, or its gain is significant (the interval, or the
      one-sided bound, excludes 1.0), or no gain is stated because the baseline missed the goals
      (any config that meets them is better): the chosen config;
    * otherwise (the gain is not significant): the model's own config, and the chosen one is
      written to candidate/config.pbtxt for whoever wants to measure it further.
    """
    if chosen is None:
        return _Recommendation(None, "no config met the goals: nothing to recommend")
    if died:
        return _Recommendation(
            None, "the server died before validation: nothing is recommended until it is resumed"
        )
    config = apply_knobs(state.base_config, chosen.config)
    if chosen.number < 0:
        return _Recommendation(
            "original",
            "the model's own config: no searched config did better",
            state.base_config,
            chosen,
        )
    if gain.significant is False and state.baseline is not None:
        return _Recommendation(
            "original",
            f"the model's own config: trial {chosen.number} ({gain.gain:.2f}x) is not "
            "significantly better; it is in candidate/config.pbtxt",
            state.base_config,
            state.baseline,
            withheld=config,
        )
    return _Recommendation("best", f"trial {chosen.number}", config, chosen)


def _front(state: _State) -> tuple[list[TrialRecord], tuple[records.ParetoEntry, ...]]:
    """A front objective's feasible non-dominated trials by throughput, each config written
    to ``pareto/NN/``; nothing for a single-winner objective."""
    if not state.objective.multi:
        return [], ()
    directory = state.run_dir
    front: list[FinishedTrial] = state.search.pareto_front()
    pareto = sorted(
        (state.results[f.number] for f in front if f.number in state.results),
        key=lambda r: -r.throughput_rps,
    )
    paths = directory.write_pareto(apply_knobs(state.base_config, r.config) for r in pareto)
    entries = tuple(
        records.ParetoEntry(
            rank=rank,
            trial_number=r.number,
            config=r.config,
            throughput_rps=r.throughput_rps,
            p99_ms=r.p99_ms,
            reference_p99_ms=r.values[1] if len(r.values) > 1 else None,
            config_path=directory.relative(path),
        )
        for rank, (r, path) in enumerate(zip(pareto, paths, strict=True), start=1)
    )
    return pareto, entries


@dataclass(frozen=True)
class _Gain:
    """The gain over the baseline as summary.json states it (all None: not stated)."""

    gain: float | None
    text: str
    ci: tuple[float | None, float | None] | None = None
    significant: bool | None = None
    repeats: tuple[int, ...] | None = None


def _gain(
    state: _State,
    chosen: TrialRecord | None,
    best: TrialRecord | None,
    baseline: TrialRecord | None,
) -> _Gain:
    """The objective's gain of ``best`` over ``baseline`` (their headline numbers), with its
    uncertainty: a seeded bootstrap over each side's validation repeats (each within its
    capacity-search bracket); the search measurement when not validated."""
    objective = state.objective
    if best is None:
        return _Gain(None, "gain over baseline: n/a (no config met the goals)")
    if baseline is None or not objective.has_gain(baseline, best):
        return _Gain(None, "gain over baseline: n/a (the baseline missed the goals)")
    gain = round(objective.gain(objective.value(baseline), objective.value(best)), 3)
    if chosen is None or state.baseline is None:
        return _Gain(gain, gain_sentence(gain, None, None, None))

    def side(r: TrialRecord) -> list[GainSample]:
        runs = state.validated.get(r.number, [])
        if not runs or any(x.state != "complete" for x in runs):
            runs = [r]
        search = objective.gain_sample(r)
        samples = []
        for x in runs:
            sample = objective.gain_sample(x)
            if x is not r and sample.value > 0 and sample.high <= sample.value:
                # A check at one rate says the capacity is at least that rate; where it ends
                # is the search's bracket (its lowest failing rate), or nowhere when the search
                # met the goals at every rate it offered.
                if search.high > sample.value:
                    sample = replace(sample, high=search.high)
                elif search.censored:
                    sample = replace(sample, censored=True)
            samples.append(sample)
        return samples

    estimate = gain_estimate(
        side(chosen),
        side(state.baseline),
        higher_is_better=objective.higher_is_better,
        seed=state.scenario.run.seed,
    )
    if estimate is None:
        return _Gain(gain, gain_sentence(gain, None, None, None))
    ci = (estimate.ci_low, estimate.ci_high)
    repeats = tuple(estimate.repeats)
    return _Gain(
        estimate.gain,
        gain_sentence(estimate.gain, list(ci), estimate.significant, list(repeats)),
        ci,
        estimate.significant,
        repeats,
    )


def _write_report(directory: RunDirectory, summary: records.RunSummary) -> None:
    """Render ``report.html``; a rendering failure must never lose a finished sweep.

    On failure the minimal page is written instead and the reason is logged, so the run
    directory stays complete and ``perfsweep report RUN_DIR`` can be re-run after a fix.
    """
    from analyzer.report import write_report

    try:
        write_report(directory.root)
    except Exception:
        _LOG.exception(
            "report.html could not be rendered; wrote a minimal page instead "
            "(re-render with: perfsweep report %s)",
            directory.root,
        )
        directory.write_minimal_report(summary)


def _redact(storage: str) -> str:
    """A storage URL without its password."""
    if "://" in storage and "@" in storage:
        scheme, rest = storage.split("://", 1)
        creds, host = rest.rsplit("@", 1)
        user = creds.split(":", 1)[0]
        return f"{scheme}://{user}:***@{host}"
    return storage
