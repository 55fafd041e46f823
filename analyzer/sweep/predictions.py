"""Predict: the profile phase and the predictions (``--search predict``).

:func:`probe_profile` measures the live server's profile; ``profile_phase`` and ``predicted_guide``
turn it into every config's simulated capacity (``predictions.json``) and a
:class:`~analyzer.search.strategy.Guide`; ``refit_predictions`` refits the profile on measured trials.
"""

from __future__ import annotations

import logging
from typing import Any

from tritonclient.grpc import model_config_pb2 as mc

from analyzer.config.knobs import Knobs
from analyzer.config.pipeline import JointKnobs, TrialKnobs
from analyzer.config.scenario import Scenario
from analyzer.config.sections import InputSection
from analyzer.errors import InputError, TargetError
from analyzer.predict import ProfileError
from analyzer.predict.fitting import run_dir_samples
from analyzer.predict.mix_sim import MixModel, MixProfile
from analyzer.predict.pipeline_sim import PipelineProfile
from analyzer.predict.profile import Profile
from analyzer.rundir import records
from analyzer.rundir.trial_record import TrialRecord
from analyzer.search.predictors import (
    MixPredictor,
    ModelPredictor,
    PipelinePredictor,
    Predictor,
    load_predictor,
)
from analyzer.search.strategy import Guide, sim_workers
from analyzer.sweep.state import Profiler, SweepState, first_line
from analyzer.target.protocol import Target

_LOG = logging.getLogger(__name__)


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
    from analyzer.predict.probe import probe
    from analyzer.predict.probe_plan import ProbePlan
    from analyzer.target.server_stats import http_stats_source
    from analyzer.target.transport import UrllibTransport

    # The probe reads batch_stats: a server without them (or not answering) is told apart
    # before any probe config is loaded.
    try:
        http_stats_source(target.url, target.model, transport=UrllibTransport(target.access))()
    except Exception as exc:  # urllib / socket / JSON errors: translated where they enter
        raise ProfileError(
            f"the server's statistics (/v2/models/{target.model}/stats) cannot be read: "
            f"{first_line(exc)}"
        ) from exc
    largest = scenario.space.max_batch_size[1]
    # Interference is information (the simulator serialises the device itself): 2 instances
    # when the space has several, none otherwise.
    several = scenario.space.instance_count[1] > 1
    plan = ProbePlan(instances=2 if several else 1, time_budget_s=scenario.search.profile_time_s)
    inputs = input_options(scenario.input, scenario.run.seed)  # the load's own request data
    return probe(_Widened(target, largest), plan, inputs=inputs)


class _StageView:
    """A pipeline's target seen as one of its composing models (what the probe measures)."""

    def __init__(self, target: Target, model: str) -> None:
        self._target = target
        self.model = model

    def __getattr__(self, name: str) -> Any:
        return getattr(self._target, name)

    def model_config(self) -> mc.ModelConfig:
        config = self._target.config_of(self.model)
        if config is None:
            raise ProfileError(f"the server has no model {self.model!r} to profile")
        return config

    def load_config(self, config: mc.ModelConfig) -> None:
        # A probe config may break the pipeline (a step batching less than the ensemble): wait
        # for the composing model alone; _probed loads its own config back after the probe.
        self._target.load_config(config, wait_for_model=False)


def _probed(state: SweepState, profiler: Profiler) -> Predictor:
    """The profile phase: the tuned model's profile, or each composing model's (a pipeline's
    stages, a mix's models)."""
    tuned, target, scenario = state.tuned, state.target, state.scenario
    if not tuned.pipeline:
        return ModelPredictor(profiler(target, scenario))
    mix = scenario.mix()
    # A pipeline's request data is the pipeline's: each composing model is probed with requests
    # built from its own inputs. A mix's load builds every model's requests from its own
    # metadata with the scenario's input options: so is each model probed.
    inputs = scenario if mix else scenario.model_copy(update={"input": InputSection()})
    kind = "model" if mix else "composing model"
    profiles = []
    for name, original in zip(tuned.names, tuned.originals(), strict=True):
        state.observer.on_phase(f"profile phase: {kind} {name}")
        try:
            profiles.append((name, profiler(_StageView(target, name), inputs)))  # type: ignore[arg-type]
        finally:
            # Its own config back (a pipeline ready again) before the next model's probe.
            target.load_config(original)
    if mix:
        goals = {name: (share, p99, rate) for name, share, p99, rate in scenario.mix_shares_goals()}
        return MixPredictor(
            MixProfile(tuple(MixModel(name, p, *goals[name]) for name, p in profiles)),
            workers=sim_workers(),
        )
    return PipelinePredictor(PipelineProfile(tuple(profiles)))


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


def profile_phase(state: SweepState, profiler: Profiler) -> Guide | None:
    """The profile phase (or a resumed run's predictions): a guide that can forecast single
    configs (the baseline) before :func:`predicted_guide` simulates the space; None when no profile
    can be taken (the sweep then searches with tpe and says why)."""
    scenario, directory = state.scenario, state.run_dir
    goal, half = scenario.goals.p99_ms, scenario.search.band
    ceiling = scenario.traffic.max_rate_rps
    if len(scenario.traffic.shapes) > 1:
        state.note(
            "search predict: the simulator ranks configs under one arrival shape and "
            f"traffic.arrival lists {len(scenario.traffic.shapes)}; searching with tpe"
        )
        return None
    arrival = scenario.traffic.arrival_process()
    profile_path = directory.root / "profile.json"
    if directory.predictions_json.exists() and profile_path.exists():
        try:
            saved = records.load_predictions(directory.predictions_json)
            return Guide.from_record(
                saved, load_predictor(profile_path), goal, half, ceiling, arrival=arrival
            )
        except (InputError, OSError) as exc:
            _LOG.warning("predictions of the resumed run unreadable (%s): predicting again", exc)
    state.observer.on_trial_start(-1, "profile", state.tuned.knobs(), 0, scenario.budget.trials)
    state.observer.on_phase("profile phase: batches of chosen sizes")
    try:
        with state.phase("profile"):
            state.touched = True
            predictor = _probed(state, profiler)
    except (ProfileError, TargetError, InputError, OSError, RuntimeError, ValueError) as exc:
        state.note(
            f"search predict: no profile could be taken ({first_line(exc)}); searching with tpe"
        )
        return None
    predictor.save(profile_path)
    return Guide(
        predictor, goal, half, seed=scenario.run.seed, ceiling_rps=ceiling, arrival=arrival
    )


def predicted_guide(state: SweepState, guide: Guide) -> Guide | None:
    """The predict phase: the profile's latency offset calibrated on the baseline's operating
    point, then every config of the space simulated; None when nothing could be predicted."""
    directory = state.run_dir
    try:
        with state.phase("predict"):
            space_configs = guide.candidates(state.search.space)
            state.observer.on_phase(f"predicting {len(space_configs)} configs")
            guide.calibrate(_finished(state))
            guide.predict_space(space_configs)
    except (InputError, ValueError) as exc:
        state.note(f"search predict: the simulator failed ({first_line(exc)}); searching with tpe")
        return None
    if not guide.predictions:
        state.note(
            f"search predict: the profile covers {guide.predictor.coverage()}, no config of the "
            "space; searching with tpe"
        )
        return None
    policies = [k for k in guide.uncovered if _sets_policy(k)]
    larger = [k for k in guide.uncovered if not _sets_policy(k)]
    if policies:
        state.note(
            f"search predict: {len(policies)} configs set priorities or a queue policy, which "
            "the simulator does not model: they are not predicted, and predict does not choose "
            "them"
        )
    if larger:
        state.note(
            f"search predict: {len(larger)} configs need batches beyond the profiled "
            f"{guide.predictor.coverage()}: they are not predicted, and predict does not choose "
            "them"
        )
    records.write_predictions(directory.predictions_json, guide.record())
    best = guide.best()
    if best is not None:
        state.observer.on_phase(
            f"predicted best {best[0].label()}: {best[1].capacity_rps:.0f} req/s "
            f"({best[1].low_rps:.0f}-{best[1].high_rps:.0f})"
        )
    return guide


def _sets_policy(knobs: TrialKnobs) -> bool:
    stages = [k for _, k in knobs.stages] if isinstance(knobs, JointKnobs) else [knobs]
    return any(isinstance(k, Knobs) and k.queue_policy is not None for k in stages)


def _finished(state: SweepState) -> list[TrialRecord]:
    """Every measurement so far, the baseline's first: where the predictions' latency offset is
    calibrated."""
    return [*([state.baseline] if state.baseline else []), *state.results.values()]


def refit_predictions(state: SweepState, guide: Guide, remaining: int) -> None:
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
    records.write_predictions(state.run_dir.predictions_json, guide.record())
