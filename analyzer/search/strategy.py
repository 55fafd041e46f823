"""Which configs a sweep measures: the search strategies of ``perfsweep run --search`` (pure).

::

    predict  profile -> the simulator's capacity for every config (a band around each; a
             generative engine's: its steps timed, simulated on its own scheduler)
             -> measure the predicted best first -> refit the profile from each measurement
             -> stop once the measured best lies in the band of the predicted best, or the
                predicted best inside the measured best's bracket
    tpe      Optuna's TPE after the sensible seeds (the only search before predictions and sequential steps)
    random   Optuna's RandomSampler, seeded
    grid     every config of the space, in its order, bounded by ``budget.trials``

Optuna owns the study in every strategy: ``predict`` and ``grid`` enqueue their configs
(``study.enqueue_trial``) and tell the measured values like any trial. This module decides
*which* configs; the sweep measures them. :class:`Guide` holds the predictions of ``predict``
and the rules on them; the profile phase itself (a live probe) is the sweep's.

Nothing here talks to a server: the simulator runs on a :class:`~analyzer.predict.profile.Profile`.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from tritonclient.grpc import model_config_pb2 as mc

from analyzer.config.model_config import group_devices, knobs_of
from analyzer.config.pipeline import TrialKnobs, config_cost, engine_of
from analyzer.config.scenario import Scenario
from analyzer.config.traffic import TrafficMode
from analyzer.measure.arrivals import POISSON, ArrivalProcess
from analyzer.predict import ProfileError
from analyzer.predict.fitting import WindowSample
from analyzer.predict.profile import Profile
from analyzer.rundir.predictions import ConfigPrediction, Prediction, Predictions
from analyzer.rundir.trial_record import TrialRecord
from analyzer.search.predictors import ModelPredictor, Predictor
from analyzer.search.space import Space, grid_configs

__all__ = [
    "STRATEGIES",
    "Guide",
    "band",
    "grid_configs",
    "nearest_capacity",
    "resolve",
]

STRATEGIES = ("predict", "tpe", "random", "grid")

#: Arrivals per simulated rate (the simulator's default: p99 of 3000 requests).
SIM_REQUESTS = 3000

#: Resolution of the simulated capacity search (2 %: well inside a 10 % band).
SIM_RESOLUTION = 0.02


def resolve(scenario: Scenario, base: mc.ModelConfig | None = None) -> tuple[str, str | None]:
    """The strategy a scenario can run before any profile is taken, and why it is not the one
    asked for (None: it is).

    ``predict`` needs a capacity objective (it predicts capacities) in open loop (the simulator
    drives the scenario's open-loop arrivals) and a stateless model (``base``, the model's config, when known:
    the simulator forms batches as the dynamic batcher does, not per sequence slot); anything
    else falls back to ``tpe``. A probe that fails later falls back the same way (the sweep
    says so).
    """
    asked = scenario.search.strategy
    if asked != "predict":
        return asked, None
    if base is not None and (why := _unmodelled(scenario, base)) is not None:
        return "tpe", f"search predict: model '{base.name}' {why}; searching with tpe"
    if not scenario.objective_spec().capacity:
        return "tpe", (
            f"search predict: the {scenario.objective} objective measures a fixed load, not a "
            "capacity the simulator could predict; searching with tpe"
        )
    if scenario.traffic.mode is not TrafficMode.RATE:
        return "tpe", (
            "search predict: the simulator drives open-loop arrivals, and this "
            "scenario's load is closed loop (traffic.mode = concurrency); searching with tpe"
        )
    return "predict", None


def _unmodelled(scenario: Scenario, base: mc.ModelConfig) -> str | None:
    """What the simulator does not model: of the model's own config (kept by every trial), or
    of the searched knobs."""
    if engine_of(base) is not None:
        # A generative engine: the engine simulator (analyzer.predict.engine_sim) steps its
        # scheduler; configs it leaves out (several engines, a TensorRT-LLM scheduler policy)
        # are left unpredicted one by one, and predict never chooses them.
        return None
    if base.HasField("sequence_batching"):
        return (
            "uses the sequence batcher, whose batches the simulator cannot form (one request "
            "per sequence slot at a time, a backlog of sequences waiting for a slot)"
        )
    if scenario.space.queue_policy is None and knobs_of(base).queue_policy is not None:
        return (
            "sets priority levels or a queue policy, which the simulator (one FIFO queue) does "
            "not model"
        )
    if group_devices(base) is not None:
        return (
            "has several instance groups (or one on several GPUs), and the simulator models "
            "the instances of one device"
        )
    if scenario.space.instance_kind and len(set(scenario.space.instance_kind)) > 1:
        return (
            "searches the instance kind, and a profile is taken on one kind: the other's "
            "execution times are unknown until measured"
        )
    return None


def sampler_for(strategy: str, scenario: Scenario) -> str:
    """The Optuna sampler behind a strategy's own asks (``random`` for ``random``)."""
    return "random" if strategy == "random" else scenario.run.sampler


#: Measured configs the "nothing left to gain" verdict needs: a line through fewer is no record.
FLAT_MIN_MEASURED = 4

#: Predictions and their bands are rounded to this many req/s (3 decimals).
BAND_ROUNDING_RPS = 1e-3


def band(capacity_rps: float, half_width: float) -> Prediction:
    """A predicted capacity with its band, ``capacity * (1 +- half_width)``, rounded to
    :data:`BAND_ROUNDING_RPS`."""
    return Prediction(
        round(capacity_rps, 3),
        round(capacity_rps * (1 - half_width), 3),
        round(capacity_rps * (1 + half_width), 3),
    )


def grid_note(configs: int, trials: int) -> str | None:
    """What a user is told when the grid is larger than the budget (None: it fits)."""
    if configs <= trials:
        return None
    return (
        f"search grid: the space has {configs} configs and the budget {trials} trials; "
        f"measuring the first {trials} in the space's order (--trials {configs} measures all)"
    )


def nearest_capacity(
    space: Space, knobs: TrialKnobs, finished: Iterable[TrialRecord]
) -> float | None:
    """The capacity of the finished trial whose config is nearest to ``knobs`` on the grid
    (L1 distance of the encoded knobs; the latest of equals), among those that met the goals;
    None when none did.
    """
    here = space.encode(knobs)
    best: tuple[int, int] | None = None
    rps: float | None = None
    for r in finished:
        if not (r.complete and r.meets_goals and r.throughput_rps > 0):
            continue
        there = space.encode(r.config)
        distance = sum(abs(here.get(k, 0) - there.get(k, 0)) for k in set(here) | set(there))
        key = (distance, -r.number)
        if best is None or key < best:
            best, rps = key, r.throughput_rps
    return rps


def next_instance_count(
    counts: Iterable[int], served: Mapping[int, float], resolution: float
) -> int | None:
    """The next instance count worth a trial where batches cannot form; None when none is left.

    Without batches, more instances serve at least as much until a shared resource (the
    device, the host) saturates, and no more after: capacity rises with the instance count,
    then stays flat. So the largest count is measured first (the most any config serves), then
    a bisection finds the fewest instances tied with the best (within ``resolution``): a count
    below one that missed the tie serves less, a count above a tied one only costs more.

    Args:
        counts: The instance counts the space holds.
        served: Capacity per measured count (0: it missed the goals).
        resolution: The capacity search's resolution (what a tie is).
    """
    pending = sorted(set(counts) - set(served))
    if not served:
        return pending[-1] if pending else None
    floor = (1.0 - resolution) * max(served.values())
    fewest_tied = min(c for c, rps in served.items() if rps >= floor)
    below = max((c for c, rps in served.items() if rps < floor and c < fewest_tied), default=0)
    left = [c for c in pending if below < c < fewest_tied]
    return left[len(left) // 2] if left else None


def sim_workers() -> int:
    """Processes a predict phase simulates in."""
    # The predict phase runs alone (no load is offered meanwhile, the server idles): every
    # core simulates. A group per instance count, so more processes than groups idle.
    return max(1, os.cpu_count() or 1)


@dataclass
class Guide:
    """The predictions of ``--search predict`` and the decisions made on them.

    Attributes:
        predictor: What the predictions rest on (:mod:`analyzer.search.predictors`: one model's
            profile or a pipeline's; the probe's, then refitted).
        goal_p99_ms: The latency goal the capacities are predicted at.
        half_width: The band (``search.band``).
        predictions: Config -> predicted capacity and band (configs the predictor covers).
        uncovered: Configs of the space the predictor cannot predict (a larger batch than
            profiled): predict never chooses them.
        seed: Seed of every simulation.
        ceiling_rps: The highest rate the sweep offers (``traffic.max_rate_rps``): no
            measurement can show more, so no prediction says more (configs predicted above it
            tie there, and the smaller config ranks first).
        arrival: The arrival process the sweep offers (``traffic.arrival``), simulated alike.
    """

    predictor: Predictor
    goal_p99_ms: float
    half_width: float
    predictions: dict[TrialKnobs, Prediction] = field(default_factory=dict)
    uncovered: list[TrialKnobs] = field(default_factory=list)
    seed: int = 0
    ceiling_rps: float = math.inf
    arrival: ArrivalProcess = POISSON
    #: Times the predictor was refitted from the run's measurements.
    refits: int = 0
    #: Predictions of configs outside the space (the baseline), made on first ask.
    forecasts: dict[TrialKnobs, Prediction | None] = field(default_factory=dict)
    #: The predictor every refit rescales (the probe's; None: ``predictor`` as given).
    probed: Predictor | None = None
    #: The configs predicted, in the space's order (predictions.json's order).
    order: list[TrialKnobs] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.probed is None:
            self.probed = self.predictor

    @classmethod
    def predict(
        cls,
        predictor: Predictor | Profile,
        configs: Sequence[TrialKnobs],
        goal_p99_ms: float,
        half_width: float,
        seed: int = 0,
        ceiling_rps: float = math.inf,
        arrival: ArrivalProcess = POISSON,
    ) -> Guide:
        """Simulate every config's capacity at the goal (the predict phase); a bare profile is
        one model's."""
        if isinstance(predictor, Profile):
            predictor = ModelPredictor(predictor)
        guide = cls(
            predictor, goal_p99_ms, half_width, seed=seed, ceiling_rps=ceiling_rps, arrival=arrival
        )
        guide.predict_space(configs)
        return guide

    def candidates(self, space: Space) -> list[TrialKnobs]:
        """The configs of ``space`` the predict phase simulates (a pipeline's: a pruned
        product, :meth:`~analyzer.search.predictors.PipelinePredictor.candidates`)."""
        return self.predictor.candidates(space, self.goal_p99_ms, self.seed)

    def predict_space(self, configs: Sequence[TrialKnobs]) -> None:
        """Simulate the capacity of every config the predictor covers; the others are
        :attr:`uncovered`."""
        self.order = list(configs)
        covered = [k for k in configs if self.predictor.covers(k)]
        self.uncovered = [k for k in configs if not self.predictor.covers(k)]
        self._simulate(covered)

    def calibrate(self, trials: Iterable[TrialRecord]) -> None:
        """Set the predictor's latency offset from the measured operating points of ``trials``
        (each predictor reads what it needs: :func:`~analyzer.predict.fitting.operating_points`): the latency the server does not
        see; forecasts made before are forgotten."""
        self.predictor = self._calibrated(self.predictor, trials)
        self.forecasts.clear()

    def _calibrated(self, predictor: Predictor, trials: Iterable[TrialRecord]) -> Predictor:
        return predictor.calibrated(
            trials, requests=SIM_REQUESTS, seed=self.seed, arrival=self.arrival
        )

    @classmethod
    def from_record(
        cls,
        saved: Predictions,
        predictor: Predictor,
        goal_p99_ms: float,
        half_width: float,
        ceiling_rps: float = math.inf,
        arrival: ArrivalProcess = POISSON,
    ) -> Guide:
        """The guide of a resumed run (its predictions.json; no new simulation)."""
        guide = cls(predictor, goal_p99_ms, half_width, ceiling_rps=ceiling_rps, arrival=arrival)
        guide.predictions = {c.config: c.prediction for c in saved.configs}
        guide.order = [c.config for c in saved.configs]
        return guide

    def _simulate(self, configs: Sequence[TrialKnobs]) -> None:
        self.predictions.update(self._capacities(configs))

    def _capacities(self, configs: Sequence[TrialKnobs]) -> dict[TrialKnobs, Prediction]:
        if not configs:
            return {}
        found = self.predictor.capacities(
            configs,
            self.goal_p99_ms,
            requests=SIM_REQUESTS,
            seed=self.seed,
            resolution=SIM_RESOLUTION,
            workers=sim_workers() if len(configs) > 1 else 1,
            ceiling_rps=self.ceiling_rps,
            arrival=self.arrival,
        )
        return {k: band(min(cap, self.ceiling_rps), self.half_width) for k, cap in found.items()}

    # -- queries ----------------------------------------------------------------------------------

    def prediction(self, knobs: TrialKnobs) -> Prediction | None:
        """The predicted capacity of ``knobs`` (None: not predicted)."""
        return self.predictions.get(knobs)

    def forecast(self, knobs: TrialKnobs) -> Prediction | None:
        """The predicted capacity of any config, the space's or not (the baseline: the model's
        own config, often without dynamic batching), simulated on first ask and never ranked;
        None when the predictor does not cover it."""
        if knobs in self.predictions:
            return self.predictions[knobs]
        if knobs not in self.forecasts:
            covered = self.predictor.covers(knobs)
            self.forecasts[knobs] = self._capacities([knobs])[knobs] if covered else None
        return self.forecasts[knobs]

    def ranked(self) -> list[TrialKnobs]:
        """Predicted configs, highest predicted capacity first (ties: the smaller config
        first: fewer instances, smaller batches, shorter delay)."""
        return sorted(
            self.predictions, key=lambda k: (-self.predictions[k].capacity_rps, config_cost(k))
        )

    def best(self) -> tuple[TrialKnobs, Prediction] | None:
        """The predicted best config and its prediction (None: nothing predicted)."""
        ranked = self.ranked()
        return (ranked[0], self.predictions[ranked[0]]) if ranked else None

    def next_config(self, measured: Iterable[TrialKnobs]) -> TrialKnobs | None:
        """The unmeasured config with the highest predicted capacity (None: all measured)."""
        done = set(measured)
        return next((k for k in self.ranked() if k not in done), None)

    def settled(self, best_measured_rps: float | None, fails_at_rps: float | None = None) -> bool:
        """Measuring further predictions cannot be expected to win: the measured best lies in
        the band of the predicted best (or above it: no config is predicted to beat it), or
        the predicted best lies inside the measured best's bracket.

        A capacity search brackets a capacity: the best passed at ``best_measured_rps`` and
        failed (confirmed) at ``fails_at_rps``, the next rate it tried; the capacity lies in
        between, and the search's resolution cannot place it closer. A predicted best at or
        below that failing rate is therefore not predicted to beat the measured best by more
        than the measurement can resolve. (Seen on a real Triton: the best measured exactly at
        its band's low edge, the refit then put a neighbouring config 0.7 % higher, its band
        edge just above the measurement, and the search measured four more configs, all worse.)
        """
        best = self.best()
        if best is None or best_measured_rps is None or best_measured_rps <= 0:
            return False
        # The band is rounded to BAND_ROUNDING_RPS; a capacity search starts at EXPECTED_START of
        # the rounded capacity, which is the band's low edge up to that rounding: a capacity
        # measured at its first rate is inside.
        if best_measured_rps >= best[1].low_rps - BAND_ROUNDING_RPS:
            return True
        return fails_at_rps is not None and best[1].capacity_rps <= fails_at_rps

    def nothing_left(
        self, measured: Sequence[tuple[TrialKnobs, float, float]], bar_rps: float
    ) -> str | None:
        """Why no unmeasured config has a chance to beat the measured best by more than the
        measurement resolves, or None while one may.

        The predictions are judged by what they got right: a line through the measured configs'
        (predicted, measured) capacities says what an unmeasured prediction is worth (its slope
        held at 0 or above: predictions that rank measurements the wrong way carry no
        information), and the largest measurement above that line is the luck any config may
        still have. Every unmeasured config's chance (line + that luck) at or below ``bar_rps``
        (the best's capacity plus the search's resolution, or the rate it failed at) leaves
        nothing to gain. On a plateau (measurements flat whatever the predictions said) the line
        is flat at the plateau; where the predictions are biased but ordered, the line corrects
        the bias. No verdict on fewer than :data:`FLAT_MIN_MEASURED` measurements, or while an
        unmeasured config is predicted above every measured one (the line would extrapolate).

        Args:
            measured: Per complete trial that met the goals: its config, its prediction when it
                was measured, its measured capacity.
            bar_rps: What a config must be expected to beat to be worth a trial.
        """
        points = [(x, y) for _, x, y in measured if x > 0 and y > 0]
        if len(points) < FLAT_MIN_MEASURED:
            return None
        done = {k for k, _, _ in measured}
        left = [p.capacity_rps for k, p in self.predictions.items() if k not in done]
        if not left:
            return None
        top = max(left)
        if top > max(x for x, _ in points):
            return None
        n = len(points)
        mx = sum(x for x, _ in points) / n
        my = sum(y for _, y in points) / n
        sxx = sum((x - mx) ** 2 for x, _ in points)
        slope = max(0.0, sum((x - mx) * (y - my) for x, y in points) / sxx) if sxx > 0 else 0.0

        def line(x: float) -> float:
            return my + slope * (x - mx)

        luck = max(0.0, max(y - line(x) for x, y in points))
        chance = line(top) + luck
        if chance > bar_rps:
            return None
        low, high = min(y for _, y in points), max(y for _, y in points)
        return (
            f"nothing left to gain: the {n} configs measured served {low:.1f}-{high:.1f} "
            f"req/s (their predictions {min(x for x, _ in points):.1f}-"
            f"{max(x for x, _ in points):.1f}), and on that record no unmeasured config is "
            f"expected above {chance:.1f} req/s, within the resolution of the best "
            f"({bar_rps:.1f} req/s)"
        )

    def refit(
        self,
        samples: Sequence[WindowSample] | None,
        measured: Iterable[TrialKnobs],
        candidates: int,
        trials: Iterable[TrialRecord] = (),
        where: str = "the run's trials",
    ) -> None:
        """Rescale the probed predictor to the run's own windows (:func:`~analyzer.predict.
        fitting.rescaled`; None or no usable window: keep the execution times), calibrate its
        latency offset on the operating points of the finished ``trials`` (the latency the
        server does not see), and re-predict the ``candidates`` best unmeasured configs (the
        ones the search may still measure); the rest keep theirs."""
        assert self.probed is not None
        predictor = self.predictor
        if samples:
            try:
                predictor = self.probed.rescaled(samples, where)
            except ProfileError:
                predictor = self.predictor
        predictor = self._calibrated(predictor, trials)
        if predictor == self.predictor:
            return  # nothing new: the same simulation would give the same predictions
        done = set(measured)
        top = [k for k in self.ranked() if k not in done][: max(1, candidates)]
        top = [k for k in top if predictor.covers(k)]
        if not top:
            return
        self.predictor = predictor
        self.refits += 1
        self._simulate(top)

    def one_per_instance_count(self) -> None:
        """Keep the cheapest predicted config of each instance count (:func:`config_cost`) and
        forget the rest: where batches cannot form, the batching knobs change nothing, and one
        config stands for every config of its instance count."""
        kept: dict[int, TrialKnobs] = {}
        for k in self.predictions:
            count = getattr(k, "instance_count", None)
            if count is None:
                return  # a pipeline's or a mix's configs: each stage batches on its own
            if count not in kept or config_cost(k) < config_cost(kept[count]):
                kept[count] = k
        self.predictions = {k: self.predictions[k] for k in kept.values()}

    def record(self, order: Sequence[TrialKnobs] | None = None) -> Predictions:
        """predictions.json: every predicted config (in ``order``; default: the order they were
        predicted in, the space's) and the predictor."""
        configs = tuple(
            ConfigPrediction(k, self.predictions[k])
            for k in (self.order if order is None else order)
            if k in self.predictions
        )
        return Predictions(self.predictor.summary(self.refits), configs)


def relative_error(predicted: float, measured: float) -> float:
    """``|predicted - measured| / measured`` (inf when nothing was measured)."""
    return abs(predicted - measured) / measured if measured > 0 else math.inf


def with_prediction(
    record: TrialRecord, predictions: Mapping[TrialKnobs, Prediction]
) -> TrialRecord:
    """``record`` with its config's prediction (unchanged when it has none)."""
    p = predictions.get(record.config)
    return record if p is None else replace(record, prediction=p)
