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
    -> validate: a cheaper tie once at the winner's capacity less the resolution; else the
       winner there and the runner-up at the winner's capacity (sequential), whole capacities
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

Seams: the server is a :class:`~analyzer.target.protocol.Target`, the load a
:class:`~analyzer.measure.generator.LoadGenerator`, the live view a :class:`SweepObserver`; tests
pass fakes for all three.

This module holds the loop (set-up, baseline, ask/tell, stop); its phases live beside it in
``analyzer/sweep/``: ``state`` (what the phases share, ``SweepOutcome``), ``trials`` (one trial),
``predictions`` (the profile phase), ``validation``, ``finish`` (winner, recommendation, report).
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from analyzer.config.choices import (
    candidate_choices,
    kind_choices,
    mix_queue_policy_choices,
    ragged_batch_choices,
    response_cache_choices,
)
from analyzer.config.knobs import EngineKnobs
from analyzer.config.objective import Objective, objective_for
from analyzer.config.pipeline import (
    TrialKnobs,
    Tuned,
    engine_of,
    ensemble_steps,
    is_ensemble,
    read_engine_file,
    stage_refusal,
)
from analyzer.config.scenario import Scenario
from analyzer.config.sections import stream_protocol
from analyzer.errors import InputError, TargetDiedError
from analyzer.evaluation import Evaluator
from analyzer.measure.generator import LoadGenerator
from analyzer.rundir.batching import batch_formation, batches_cannot_form, inert_before_trials
from analyzer.rundir.results import (
    RunDirectory,
    new_run_id,
    parse_config_text,
    utc_now,
    write_atomic,
)
from analyzer.rundir.summary import StopReason
from analyzer.rundir.trial_record import TrialRecord
from analyzer.search.space import (
    DEFAULT_MAX_NUM_BATCHED_TOKENS,
    DEFAULT_MAX_NUM_SEQS,
    EngineSpace,
    JointSpace,
    SearchSpace,
    Space,
)
from analyzer.search.strategy import (
    FLAT_MIN_MEASURED,
    grid_configs,
    grid_note,
    next_instance_count,
    resolve,
    sampler_for,
    with_prediction,
)
from analyzer.search.study import DIED_REASON, INTERRUPTED_REASON, Search, TrialOutcome
from analyzer.sweep.finish import finish_run, leave_server, request_mix
from analyzer.sweep.predictions import (
    predicted_guide,
    probe_profile,
    profile_phase,
    refit_predictions,
)
from analyzer.sweep.state import (
    MAX_TARGET_FAILURES,
    Profiler,
    SweepObserver,
    SweepOutcome,
    SweepState,
    first_line,
)
from analyzer.sweep.trials import expected_capacity, locust_generator, measure_baseline, run_trial
from analyzer.sweep.validation import validate_winners
from analyzer.target.factory import make_target
from analyzer.target.leases import leased, renew_target
from analyzer.target.protocol import Target, untunable_reason

__all__ = ["run_sweep", "space_for"]


def space_for(
    scenario: Scenario, base: mc.ModelConfig | None = None, min_batch: int = 1
) -> SearchSpace:
    """The search space the scenario bounds (``base``: the model's config, which may refuse a
    response cache: :func:`analyzer.config.choices.response_cache_choices`; ``min_batch``: the
    smallest max batch size the model may have, a pipeline's own for its composing models)."""
    s = scenario.space
    low, high = s.max_batch_size
    if min_batch > low:
        low = 2 ** math.ceil(math.log2(min_batch))
        if low > high:
            raise InputError(
                f"the pipeline sends batches of up to {min_batch} to {base.name if base else ''!r}"
                f", above the space's largest max_batch_size {high}: raise --max-batch-size "
                f"to {low} or more"
            )
    return SearchSpace.from_bounds(
        (low, high),
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
        ragged_choices=ragged_batch_choices(s.ragged_batch, base),
    )


def engine_space_for(scenario: Scenario, tuned: Tuned) -> EngineSpace:
    """A generative engine's space: the scenario's values of each knob, else the defaults
    (:class:`EngineSpace`); chunked prefill and the memory share as the engine's own unless
    the scenario searches them; the engine count as the model's own (a server started from a
    command runs one)."""
    s = scenario.space
    own = tuned.knobs()
    assert isinstance(own, EngineKnobs)
    chunked = {
        None: (own.enable_chunked_prefill,),
        "on": (True,),
        "off": (False,),
        "search": (True, False),
    }[s.enable_chunked_prefill]
    return EngineSpace(
        seqs=tuple(sorted(set(s.max_num_seqs or DEFAULT_MAX_NUM_SEQS))),
        tokens=tuple(sorted(set(s.max_num_batched_tokens or DEFAULT_MAX_NUM_BATCHED_TOKENS))),
        chunked=chunked,
        memory=(
            tuple(sorted(set(s.gpu_memory_utilization)))
            if s.gpu_memory_utilization
            else (own.gpu_memory_utilization,)
        ),
        instances=(own.instance_count, own.instance_count),
        policy=own.batch_scheduler_policy,
    )


def tuned_space(scenario: Scenario, tuned: Tuned) -> Space:
    """The space of a sweep: its model's, or one per composing model of a pipeline (each max
    batch size at least the pipeline's own, which Triton requires of an ensemble), or a
    generative engine's (:func:`engine_space_for`)."""
    if tuned.engine is not None:
        return engine_space_for(scenario, tuned)
    if not tuned.pipeline:
        return space_for(scenario, tuned.base)
    floor = max(1, tuned.base.max_batch_size) if is_ensemble(tuned.base) else 1
    return JointSpace(tuple((c.name, space_for(scenario, c, floor)) for c in tuned.stages))


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
    if target is None and scenario.model.server == "virtual" and not scenario.model.url:
        from analyzer.predict.virtual import virtual_seams

        target, virtual_load, clock, virtual_profiler = virtual_seams(scenario)
        load, profiler = load or virtual_load, profiler or virtual_profiler
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
            on_disk = _repository_config(scenario)
            if on_disk is not None and engine_of(on_disk) is None:  # refused before a load
                _tuned(scenario, on_disk, lambda name: _repository_config(scenario, name))
            target = make_target(scenario, directory.root)
            stack.callback(target.stop)
        target.notify = observer.on_server
        target.start()
        base = target.model_config()
        if (engine := engine_of(base)) is not None:
            scenario = streaming_scenario(scenario, base)
            tuned = Tuned(base, engine=engine, engine_file=_engine_file(scenario, target))
        else:
            if scenario.goals.ttft_p99_ms is not None or scenario.goals.itl_p99_ms is not None:
                raise InputError(
                    f"--ttft-p99-ms and --itl-p99-ms are goals of a generative model's token "
                    f"streams; {base.name!r} answers each request once: give it --p99-ms"
                )
            tuned = _tuned(scenario, base, target.config_of)
        directory.tree = tuned.pipeline  # a pipeline's configs are repository trees
        if resume and (saved := _saved_originals(directory, tuned)) is not None:
            # A killed run left a shared server on some trial's configs: the originals are the
            # ones the first process measured and recorded.
            tuned = saved
        base_config = tuned.base
        if not run_state:
            run_state.update(_create_run(scenario, directory, command))
        if load is None:
            stages = tuned.names if tuned.pipeline else ()
            load = stack.enter_context(locust_generator(scenario, target, observer, stages))
        space = tuned_space(scenario, tuned)
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
        state = SweepState(
            scenario,
            objective,
            directory,
            target,
            tuned,
            search,
            Evaluator(scenario, load, observer.on_phase),
            observer,
            strategy=strategy,
            clock=clock,
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
                state.guide = profile_phase(state, profiler)
            if state.baseline is None:
                with state.phase("baseline"):
                    state.baseline = measure_baseline(state)
            if state.guide is not None and not state.guide.predictions:
                state.guide = predicted_guide(state, state.guide)
            if state.strategy == "predict" and state.guide is None:
                state.strategy = "tpe"
            if state.guide is not None and (share := _unbatchable_share(state)) is not None:
                state.note(inert_before_trials(share))
                state.guide.one_per_instance_count()
                state.batches_inert = True
            if state.baseline.meets_goals:
                state.evaluator.hint_rps = state.baseline.throughput_rps
            state.evaluator.reference_rps = objective.reference_rps(
                state.evaluator.reference_rps,
                state.baseline.throughput_rps,
                scenario.traffic.min_rate_rps,
            )
            fresh = not search.finished() and search.started_count() == 0
            if fresh and state.strategy == "tpe":
                for knobs in space.seeds(tuned.knobs(), scenario.goals.p99_ms):
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
                    validation = validate_winners(state)
            else:
                validation = []
        except KeyboardInterrupt:
            stop_reason, validation = StopReason.INTERRUPTED, []
        except TargetDiedError as exc:
            # Nothing more is sent to the server: the run so far is written (the best not
            # validated), run.json says failed, and the caller gets the outcome with the error.
            state.dead = True
            run_state.update(error=first_line(exc), failed_at=utc_now())
            exc.outcome = finish_run(
                state, StopReason.SERVER_DIED, [], started_at, clock() - started, run_state
            )
            raise
        except BaseException:
            run_state["left_on_server"] = leave_server(state, None)
            raise
        return finish_run(state, stop_reason, validation, started_at, clock() - started, run_state)


def streaming_scenario(scenario: Scenario, base: mc.ModelConfig) -> Scenario:
    """The scenario of a generative model's sweep: its load speaks a token stream (Triton's
    ``generate_stream`` for ``model.protocol = "http"``, ``ModelStreamInfer`` for ``grpc``;
    a server started from a command, OpenAI's ``/v1/completions``) and it is held to token
    goals.

    Raises:
        InputError: no token goal is given.
    """
    g = scenario.goals
    if g.ttft_p99_ms is None and g.itl_p99_ms is None:
        raise InputError(
            f"{base.name!r} is a generative model ({base.backend} engine): give its goals as "
            "--ttft-p99-ms and/or --itl-p99-ms (goals.ttft_p99_ms, goals.itl_p99_ms)"
        )
    protocol = stream_protocol(scenario.model.protocol, bool(scenario.model.serve_command))
    if protocol == scenario.model.protocol:
        return scenario
    model = scenario.model.model_copy(update={"protocol": protocol})
    return scenario.model_copy(update={"model": model})


def _engine_file(scenario: Scenario, target: Target) -> dict[str, Any] | None:
    """A vLLM engine's own settings (``<model>/1/model.json``) from the repository perfsweep
    can read (the managed server's, or ``model.repository``); None for a server whose files
    are out of reach (``--url``: its baseline runs on them, and each trial's file holds the
    knobs over vLLM's defaults)."""
    root = getattr(target, "repository", None) or scenario.model.repository
    return None if root is None else read_engine_file(Path(root), scenario.model.name)


def _resumed(record: TrialRecord) -> TrialRecord:
    """A record read back on ``--resume``: records written before the one rule could say an
    unusable measurement met the goals; it does not."""
    return replace(record, meets_goals=record.meets_goals and record.problem() is None)


def _repository_config(scenario: Scenario, name: str | None = None) -> mc.ModelConfig | None:
    """The managed server's config of model ``name`` (default: the scenario's) as written on
    disk (None when unknown or unreadable: the server then reports the problem itself)."""
    m = scenario.model
    if m.url or m.repository is None:
        return None
    name = name or m.name
    path = Path(m.repository) / name / "config.pbtxt"
    try:
        config = parse_config_text(path.read_text(encoding="utf-8"), allow_unknown_field=True)
    except (OSError, text_format.ParseError, ValueError):
        return None
    if not config.name:
        config.name = name
    return config


def _tuned(
    scenario: Scenario, base: mc.ModelConfig, read: Callable[[str], mc.ModelConfig | None]
) -> Tuned:
    """What the sweep sets: the model itself, or a pipeline's composing models (an ensemble's
    steps, or ``model.composing_models``) read with ``read``.

    Raises:
        InputError: The model or a composing model cannot be tuned; the message names the step
            and what can be tuned instead.
    """
    names, caller = _stage_names(scenario, base)
    if not names:
        _refuse_untunable(base)
        return Tuned(base)
    stages = []
    for name in names:
        config = read(name)
        if config is None:
            raise InputError(
                f"{caller(name)} calls model {name!r}, which is not in the repository: add it, "
                "or tune the other composing models by naming them (--composing-models)"
            )
        if (why := stage_refusal(caller(name), config)) is not None:
            raise InputError(why)
        stages.append(config)
    return Tuned.of(base, stages)


def _stage_names(
    scenario: Scenario, base: mc.ModelConfig
) -> tuple[tuple[str, ...], Callable[[str], str]]:
    """The composing models to tune (a mix's models: every one), and who calls each (for
    messages)."""
    named = scenario.model.composing_models
    if mix := scenario.mix():
        if named or is_ensemble(base):
            raise InputError(
                f"a mix of models ({', '.join(mix)}) tunes plain models served together; "
                f"{base.name!r} is a pipeline: tune it on its own"
            )
        return mix, lambda name: "the mix of models"
    if not is_ensemble(base):
        return named, lambda name: f"model {base.name!r}"
    steps = ensemble_steps(base)
    if unknown := [n for n in named if n not in steps]:
        raise InputError(
            f"--composing-models {', '.join(unknown)}: ensemble {base.name!r} calls only "
            f"{', '.join(steps)}"
        )
    order = [s.model_name for s in base.ensemble_scheduling.step]
    return (
        tuple(n for n in steps if not named or n in named),
        lambda name: f"step {order.index(name) + 1} of ensemble {base.name!r}",
    )


def _refuse_untunable(config: mc.ModelConfig) -> None:
    """Raise InputError for a model no dynamic-batching config can tune."""
    reason = untunable_reason(config)
    if reason:
        raise InputError(reason)
    if config.max_batch_size == 0:
        # Its inputs carry no batch dimension: no batching config could ever load.
        raise InputError(
            f"model {config.name!r} has max_batch_size 0 (no batch dimension), so it cannot "
            "be batched; give it a batch dimension and max_batch_size >= 1 to tune it"
        )


def _saved_originals(directory: RunDirectory, tuned: Tuned) -> Tuned | None:
    """The configs the first process of a resumed run found (None: it recorded none)."""
    saved = directory.read_configs(-1, tuned.names)
    if saved is None:
        return None
    if tuned.engine is not None:
        return replace(tuned, base=saved[0])
    return Tuned.of(tuned.base, saved) if tuned.pipeline else Tuned(saved[0])


def _record_interrupted(
    state: SweepState,
    number: int,
    source: str,
    knobs: TrialKnobs,
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


def _predicted_points(state: SweepState) -> list[tuple[TrialKnobs, float, float]]:
    """(config, predicted capacity when measured, measured capacity) of every complete trial
    that met the goals and had a prediction."""
    return [
        (r.config, r.prediction.capacity_rps, r.throughput_rps)
        for r in state.results.values()
        if r.state == "complete" and r.meets_goals and r.prediction is not None
    ]


def _unbatchable_share(state: SweepState) -> float | None:
    """The share of arrivals with the shape of the request ahead when the profile's data shows
    that batches cannot form in any config of the space
    (:func:`~analyzer.rundir.batching.batches_cannot_form`: shapes differ and no config allows
    ragged batches); None otherwise."""
    mix = request_mix(state)
    share = mix.same_shape_share() if mix is not None else None
    if not batches_cannot_form(share) or state.guide is None or not state.guide.predictions:
        return None
    base = state.tuned.base
    own_ragged = any(i.allow_ragged_batch for i in base.input if -1 in i.dims)
    for knobs in state.guide.predictions:
        ragged = getattr(knobs, "ragged_batch", True)
        if ragged or (ragged is None and own_ragged):
            return None
    return share


def _next_instance_count(state: SweepState) -> TrialKnobs | None:
    """Where batches cannot form, the next config of the guide (one per instance count) worth a
    trial (:func:`~analyzer.search.strategy.next_instance_count`); None when none is left."""
    assert state.guide is not None
    by_count = {getattr(k, "instance_count", 1): k for k in state.guide.predictions}
    served: dict[int, float] = {}
    for r in state.results.values():
        if r.state == "complete":
            count = getattr(r.config, "instance_count", 1)
            rps = r.throughput_rps if r.meets_goals else 0.0
            served[count] = max(served.get(count, 0.0), rps)
    count = next_instance_count(by_count, served, state.scenario.budget.capacity_resolution)
    return None if count is None else by_count[count]


def _inert_plateau(state: SweepState) -> str | None:
    """Why the search has nothing left to gain when batches do not form, else None.

    With batches that never form (:func:`~analyzer.rundir.batching.batch_formation`), the delay,
    preferred sizes and max batch size change nothing; once :data:`FLAT_MIN_MEASURED` trials
    over more than one instance count (where the space has more than one) all served the same
    within the capacity search's resolution, the instance count changes nothing either.
    """
    feasible = [r for r in state.results.values() if r.state == "complete" and r.meets_goals]
    if len(feasible) < FLAT_MIN_MEASURED:
        return None
    formation = batch_formation(feasible)
    if formation is None or not formation.inert:
        return None
    rates = [r.throughput_rps for r in feasible]
    if min(rates) < (1 - state.scenario.budget.capacity_resolution) * max(rates):
        return None
    counts = {r.config.instance_count for r in feasible}
    low, high = state.scenario.space.instance_count
    if len(counts) < 2 and low < high:
        return None
    return (
        f"nothing left to gain: batches do not form, and the {len(feasible)} configs measured "
        f"(instances {', '.join(str(c) for c in sorted(counts))}) all served "
        f"{min(rates):.1f}-{max(rates):.1f} req/s, within the capacity search's resolution"
    )


def _budget_spent(state: SweepState, budget_s: float) -> str:
    """What the time budget's end leaves: how far the search got, where the time went, what the
    baseline says, and the budget to raise."""
    trials = [r for r in state.results.values() if r.state != "interrupted"]
    met = [r for r in trials if r.state == "complete" and r.meets_goals]
    spent = ", ".join(f"{name} {s:.0f} s" for name, s in state.phases.items() if s >= 0.5)
    where = f" ({spent})" if spent else ""
    if not trials:
        head = f"the time budget ({budget_s:g} s) ran out before trial 0{where}"
    elif not met:
        head = (
            f"the time budget ({budget_s:g} s) ran out after {len(trials)} "
            f"trial{'s' if len(trials) != 1 else ''}, none of which met the goals{where}"
        )
    else:
        return f"the time budget ({budget_s:g} s) ran out after {len(trials)} trials"
    baseline = state.baseline
    if baseline is not None and baseline.meets_goals:
        head += (
            f"; the baseline (the model's own config) meets the goals at "
            f"{baseline.throughput_rps:.1f} req/s, so it is the answer until a searched config "
            "beats it"
        )
    return f"{head}: raise --time-budget-s (budget.time_budget_s) to search"


def _search_loop(state: SweepState, clock: Callable[[], float], started: float) -> StopReason:
    scenario, search, guide = state.scenario, state.search, state.guide
    budget = scenario.budget
    grid = len(grid_configs(search.space)) if state.strategy == "grid" else None
    while True:
        done = search.started_count()
        if done >= budget.trials:
            return StopReason.TRIALS
        if budget.time_budget_s is not None and clock() - started >= budget.time_budget_s:
            state.note(_budget_spent(state, budget.time_budget_s))
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
            if best is not None and bracket is not None:
                bar = max(
                    best.throughput_rps * (1 + budget.capacity_resolution),
                    bracket.high if bracket.high > bracket.value else 0.0,
                )
                why = guide.nothing_left(_predicted_points(state), bar)
                if why is not None:
                    state.note(why)
                    return StopReason.NOTHING_LEFT
            if not state.batches_inert:
                upcoming = guide.next_config(measured)
            elif (upcoming := _next_instance_count(state)) is None:
                state.note(
                    "nothing left to gain: batches cannot form, and no instance count left "
                    "unmeasured can serve more, or as much for less"
                )
                return StopReason.NOTHING_LEFT
            if upcoming is not None:
                search.enqueue(upcoming, "predicted capacity", source="predict")
            elif _stagnant(state.results, scenario, state.objective):
                return StopReason.STAGNATION  # every prediction measured: the sampler goes on
        elif _stagnant(state.results, scenario, state.objective):
            return StopReason.STAGNATION
        # A grid measures every config by design (the brute force others are judged by).
        if grid is None and (why := _inert_plateau(state)) is not None:
            state.note(why)
            return StopReason.NOTHING_LEFT
        asked = search.ask()
        configs = state.tuned.configs(asked.knobs)
        state.run_dir.write_config(asked.number, configs)
        state.observer.on_trial_start(
            asked.number, asked.source, asked.knobs, done + 1, budget.trials
        )
        try:
            result = run_trial(
                state,
                asked.number,
                asked.source,
                asked.knobs,
                configs,
                expect=expected_capacity(state, asked.knobs),
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
            refit_predictions(state, guide, budget.trials - search.started_count())
