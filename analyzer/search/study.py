"""The search: knobs, their encoding, and the Optuna study behind the ask/tell loop.

This is the only module that imports optuna. Everything else sees :class:`Knobs` (the searched part
of a model config, defined in ``analyzer.config.knobs``), :class:`SearchSpace` (a finite grid of knobs)
and :class:`Search` (ask a trial, tell its outcome).

Encoding (why integers): every knob is an integer index, so no invalid config can be sampled and
the sampler sees an ordered space::

    log2_mbs    max_batch_size = 2 ** log2_mbs          (bounds from the scenario)
    delay_idx   max_queue_delay_us = ladder[delay_idx]  (0, then a geometric ladder)
    pref_depth  0: no preferred sizes; d: {mbs, mbs/2, ..., mbs/2**d} (never above mbs)
    instances   instance_group[0].count (the base config's one group)
    instances_i instance_group[i].count, one per group when the base config has several
                (each within the same bounds; Knobs.group_counts)
    cache_idx   response_cache = cache_choices[cache_idx]      (only with two or more choices)
    policy_idx  queue_policy = policy_choices[policy_idx]      (only with two or more choices)
    cand_idx    max_candidate_sequences = candidate_choices[cand_idx]  (the same; the oldest
                strategy of a stateful model)
    kind_idx    instance_kind = kind_choices[kind_idx]         (the same: KIND_CPU vs KIND_GPU)

Preferred sizes are relative to ``max_batch_size`` because Triton refuses a preferred size above
the max batch size, and Optuna refuses categorical choices that change between trials.
"""

from __future__ import annotations

import datetime as dt
import itertools
import logging
import math
import time
import warnings
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import optuna
from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend
from optuna.trial import TrialState

from analyzer.config.knobs import Knobs, QueuePolicyKnob
from analyzer.config.model_config import group_devices
from analyzer.errors import InputError

if TYPE_CHECKING:
    from tritonclient.grpc import model_config_pb2 as mc

__all__ = [  # Knobs is analyzer.config.knobs's (no optuna there): import it from there
    "DIED_REASON",
    "INTERRUPTED_REASON",
    "AskedTrial",
    "FinishedTrial",
    "InterruptedTrial",
    "Search",
    "SearchSpace",
    "TrialOutcome",
    "delay_ladder",
    "journal_storage",
    "param_importances",
    "preferred_sizes",
]

Direction = Literal["maximize", "minimize"]

#: Reason recorded on trials that were RUNNING when a previous process died; they are re-run.
INTERRUPTED_REASON = "interrupted: the run stopped during this trial; it is re-run on --resume"
#: The failure of a trial the run stopped in because its server died (re-run on ``--resume``).
DIED_REASON = "interrupted: server died; the trial is re-run on --resume"
#: Failures that mark a trial the run stopped in, not a result: it runs again.
_NOT_RESULTS = (INTERRUPTED_REASON, DIED_REASON)

#: Study attribute listing the numbers of trials a killed run left RUNNING (failed on resume):
#: Optuna's public API can set attributes only on a trial this process asked for.
_INTERRUPTED_ATTR = "interrupted_trials"


def delay_ladder(low_us: int, high_us: int, steps: int) -> tuple[int, ...]:
    """The searched delay values: 0 (when ``low_us`` is 0) then a geometric ladder to ``high_us``.

    Delays grow geometrically because their effect does: 100 µs vs 200 µs matters as much as
    5 ms vs 10 ms.
    """
    if high_us == 0 or steps == 1:
        return (low_us,) if steps == 1 else (0,)
    values: list[int] = []
    start = low_us
    geometric_steps = steps
    if low_us == 0:
        values.append(0)
        geometric_steps -= 1
        start = max(1, round(high_us / 2 ** max(geometric_steps - 1, 0)))
    if geometric_steps >= 1:
        if geometric_steps == 1:
            values.append(high_us)
        else:
            ratio = (high_us / start) ** (1 / (geometric_steps - 1))
            values.extend(round(start * ratio**i) for i in range(geometric_steps))
    return tuple(sorted(set(values)))


def preferred_sizes(max_batch_size: int, depth: int) -> tuple[int, ...]:
    """Preferred sizes at ``depth``: ``max_batch_size`` and its ``depth`` next halvings.

    Depth 0 is no preferred size. ``{max_batch_size}`` alone is never produced: Triton
    normalises an empty list to exactly that, so it would repeat depth 0.
    """
    if depth <= 0:
        return ()
    sizes = {max_batch_size >> i for i in range(depth + 1) if max_batch_size >> i >= 1}
    return tuple(sorted(sizes, reverse=True)) if len(sizes) > 1 else ()


@dataclass(frozen=True)
class SearchSpace:
    """A finite grid of valid knobs, and its integer encoding.

    Attributes:
        log2_mbs: Inclusive bounds of log2(max_batch_size).
        delays_us: The delay ladder.
        max_pref_depth: Largest preferred-size depth searched (0: never set preferred sizes).
        fixed_preferred: Preferred sizes used by every config instead of a searched depth.
        instances: Inclusive bounds of the instance count (of each group, with
            ``group_devices``).
        cache_choices: Values of :attr:`Knobs.response_cache` searched
            (:func:`analyzer.config.choices.response_cache_choices`; ``(None,)``: the model's own).
        policy_choices: Values of :attr:`Knobs.queue_policy` searched
            (:func:`analyzer.config.choices.queue_policy_choices`; ``(None,)``: the model's own).
        candidate_choices: Values of :attr:`Knobs.max_candidate_sequences` searched
            (:func:`analyzer.config.choices.candidate_choices`; ``(None,)``: the model's own).
        kind_choices: Values of :attr:`Knobs.instance_kind` searched
            (:func:`analyzer.config.choices.kind_choices`; ``(None,)``: the model's own).
        group_devices: Instances one count makes in each instance group of the base config
            (:func:`analyzer.config.model_config.group_devices`); None: one plain count, the knobs without
            :attr:`Knobs.group_counts`. Several groups: one ``instances_i`` dimension each; one
            group on several GPUs keeps the one ``instances`` dimension.
    """

    log2_mbs: tuple[int, int]
    delays_us: tuple[int, ...]
    max_pref_depth: int = 2
    fixed_preferred: tuple[int, ...] | None = None
    instances: tuple[int, int] = (1, 1)
    cache_choices: tuple[bool | None, ...] = (None,)
    policy_choices: tuple[QueuePolicyKnob | None, ...] = (None,)
    candidate_choices: tuple[int | None, ...] = (None,)
    group_devices: tuple[int, ...] | None = None
    kind_choices: tuple[str | None, ...] = (None,)

    def __post_init__(self) -> None:
        if self.group_devices is not None and not self.group_devices:
            raise ValueError("group_devices needs one entry per instance group (None: one count)")
        if self.fixed_preferred:
            needed = max(self.fixed_preferred)
            lo = max(self.log2_mbs[0], math.ceil(math.log2(needed)))
            if lo > self.log2_mbs[1]:
                raise InputError(
                    f"preferred size {needed} is above the largest max_batch_size "
                    f"{2 ** self.log2_mbs[1]}"
                )
            # Configs with max_batch_size below a fixed preferred size would be refused by
            # Triton: such points are removed from the space rather than sampled and rejected.
            object.__setattr__(self, "log2_mbs", (lo, self.log2_mbs[1]))

    @classmethod
    def from_bounds(
        cls,
        max_batch_size: tuple[int, int],
        max_queue_delay_us: tuple[int, int],
        delay_steps: int,
        preferred: str | Sequence[int],
        instance_count: tuple[int, int],
        cache_choices: tuple[bool | None, ...] = (None,),
        policy_choices: tuple[QueuePolicyKnob | None, ...] = (None,),
        candidate_choices: tuple[int | None, ...] = (None,),
        base: mc.ModelConfig | None = None,
        kind_choices: tuple[str | None, ...] = (None,),
    ) -> SearchSpace:
        """Build the space from the scenario's ``[space]`` bounds (``base``: the model's config,
        whose instance groups are searched one count each when it has several)."""
        fixed: tuple[int, ...] | None = None
        depth = 2
        if preferred == "none":
            depth = 0
        elif not isinstance(preferred, str):
            fixed = tuple(int(s) for s in preferred)
            depth = 0
        return cls(
            log2_mbs=(int(math.log2(max_batch_size[0])), int(math.log2(max_batch_size[1]))),
            delays_us=delay_ladder(max_queue_delay_us[0], max_queue_delay_us[1], delay_steps),
            max_pref_depth=depth,
            fixed_preferred=fixed,
            instances=instance_count,
            cache_choices=cache_choices,
            policy_choices=policy_choices,
            candidate_choices=candidate_choices,
            group_devices=None if base is None else group_devices(base),
            kind_choices=kind_choices,
        )

    # -- encoding -------------------------------------------------------------------------------

    def param_bounds(self) -> dict[str, tuple[int, int]]:
        """Integer parameters and their inclusive bounds (a dimension with one value is omitted)."""
        bounds = {
            "log2_mbs": self.log2_mbs,
            "delay_idx": (0, len(self.delays_us) - 1),
            "pref_depth": (0, self.max_pref_depth),
            **dict.fromkeys(self._instance_params(), self.instances),
            "cache_idx": (0, len(self.cache_choices) - 1),
            "policy_idx": (0, len(self.policy_choices) - 1),
            "cand_idx": (0, len(self.candidate_choices) - 1),
            "kind_idx": (0, len(self.kind_choices) - 1),
        }
        return {name: b for name, b in bounds.items() if b[0] < b[1]}

    def decode(self, params: Mapping[str, int]) -> Knobs:
        """Knobs from integer parameters (missing single-valued dimensions take their value)."""
        mbs = 2 ** int(params.get("log2_mbs", self.log2_mbs[0]))
        depth = int(params.get("pref_depth", 0))
        if self.fixed_preferred is not None:
            pref = tuple(sorted(self.fixed_preferred, reverse=True))
        else:
            pref = preferred_sizes(mbs, depth)
        counts = tuple(int(params.get(name, self.instances[0])) for name in self._instance_params())
        devices = self.group_devices
        return Knobs(
            max_batch_size=mbs,
            max_queue_delay_us=self.delays_us[int(params.get("delay_idx", 0))],
            preferred_batch_size=pref,
            instance_count=(
                counts[0]
                if devices is None
                else sum(c * d for c, d in zip(counts, devices, strict=True))
            ),
            response_cache=self.cache_choices[int(params.get("cache_idx", 0))],
            queue_policy=self.policy_choices[int(params.get("policy_idx", 0))],
            max_candidate_sequences=self.candidate_choices[int(params.get("cand_idx", 0))],
            group_counts=None if devices is None else counts,
            instance_kind=self.kind_choices[int(params.get("kind_idx", 0))],
        )

    def encode(self, knobs: Knobs) -> dict[str, int]:
        """The parameters of the grid point closest to ``knobs`` (used to seed the search)."""
        lo, hi = self.log2_mbs
        log2 = min(max(round(math.log2(max(knobs.max_batch_size, 1))), lo), hi)
        delay_idx = min(
            range(len(self.delays_us)),
            key=lambda i: abs(self.delays_us[i] - knobs.max_queue_delay_us),
        )
        depth = min(max(len(knobs.preferred_batch_size) - 1, 0), self.max_pref_depth)
        cache = knobs.response_cache
        policy = knobs.queue_policy
        cand = knobs.max_candidate_sequences
        params = {
            "log2_mbs": log2,
            "delay_idx": delay_idx,
            "pref_depth": depth,
            **self._encode_instances(knobs),
            "cache_idx": self.cache_choices.index(cache) if cache in self.cache_choices else 0,
            "policy_idx": (
                self.policy_choices.index(policy) if policy in self.policy_choices else 0
            ),
            "cand_idx": _nearest_choice(self.candidate_choices, cand),
            "kind_idx": (
                self.kind_choices.index(knobs.instance_kind)
                if knobs.instance_kind in self.kind_choices
                else 0
            ),
        }
        return {k: v for k, v in params.items() if k in self.param_bounds()}

    def _instance_params(self) -> tuple[str, ...]:
        """The instance dimensions: ``instances``, or ``instances_0``... for several groups."""
        devices = self.group_devices
        if devices is None or len(devices) == 1:
            return ("instances",)
        return tuple(f"instances_{i}" for i in range(len(devices)))

    def _encode_instances(self, knobs: Knobs) -> dict[str, int]:
        """Each group's count moved into the bounds; knobs without counts for these groups give
        every group their ``instance_count`` (as a count on the first group, before groups)."""
        names = self._instance_params()
        counts = knobs.group_counts
        if counts is None or len(counts) != len(names):
            counts = (knobs.instance_count,) * len(names)
        lo, hi = self.instances
        return {name: min(max(c, lo), hi) for name, c in zip(names, counts, strict=True)}

    def _every_group(self, count: int) -> dict[str, int]:
        """Parameters giving every instance group ``count``."""
        return dict.fromkeys(self._instance_params(), count)

    def points(self) -> Iterator[dict[str, int]]:
        """Every grid point's parameters (brute force and benchmarks)."""
        bounds = self.param_bounds()
        names = list(bounds)
        ranges = [range(lo, hi + 1) for lo, hi in bounds.values()]
        for combo in itertools.product(*ranges):
            yield dict(zip(names, combo, strict=True))

    def size(self) -> int:
        """Number of grid points."""
        return math.prod(hi - lo + 1 for lo, hi in self.param_bounds().values())

    def seeds(self, start: Knobs | None = None, p99_goal_ms: float | None = None) -> list[Knobs]:
        """Sensible first configs to measure before the sampler takes over.

        The model's own config moved onto the grid; Triton's documented starting point
        (``dynamic_batching {}``: largest batch, no delay) with one instance and with the most
        instances; and, when the latency goal is known, the largest batch with a queue delay of
        a quarter of the goal on half the instances (the Nexus rule of thumb: spend up to half
        the budget forming and running a batch). These replace random start-up trials.
        """
        lo, hi = self.log2_mbs
        ilo, ihi = self.instances
        candidates: list[Knobs] = []
        if start is not None:
            candidates.append(self.decode(self.encode(start)))
        candidates.append(self.decode({"log2_mbs": hi, "delay_idx": 0, **self._every_group(ilo)}))
        candidates.append(self.decode({"log2_mbs": hi, "delay_idx": 0, **self._every_group(ihi)}))
        if p99_goal_ms is not None:
            quarter = Knobs(
                max_batch_size=2 ** ((lo + hi + 1) // 2),
                max_queue_delay_us=round(p99_goal_ms * 1000 / 4),
                instance_count=(ilo + ihi + 1) // 2,
            )
            candidates.append(self.decode(self.encode(quarter)))
        unique: list[Knobs] = []
        for knobs in candidates:
            if knobs not in unique:
                unique.append(knobs)
        return unique


@dataclass(frozen=True)
class TrialOutcome:
    """What one trial measured, in the terms the sampler needs.

    Attributes:
        values: Objective values in the study's direction order (one for single objective).
        constraints: Named slacks; <= 0 means satisfied. Always the same keys.
        user_attrs: Extra JSON-able facts kept with the trial.
    """

    values: tuple[float, ...]
    constraints: Mapping[str, float]
    user_attrs: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class AskedTrial:
    """A trial handed out by :meth:`Search.ask`."""

    number: int
    params: Mapping[str, int]
    knobs: Knobs
    source: str  # "seed"/"predict"/"grid" (enqueued) or "search" (the sampler's)


@dataclass(frozen=True)
class InterruptedTrial:
    """A trial a killed run left RUNNING (failed and re-queued by ``recover_interrupted``)."""

    number: int
    knobs: Knobs
    source: str
    started_at: str


@dataclass(frozen=True)
class FinishedTrial:
    """A finished trial as stored in the study."""

    number: int
    state: str  # "complete" | "failed"
    knobs: Knobs
    values: tuple[float, ...]
    constraints: Mapping[str, float]
    user_attrs: Mapping[str, Any]

    @property
    def feasible(self) -> bool:
        """Complete, with every constraint satisfied."""
        return self.state == "complete" and all(v <= 0 for v in self.constraints.values())


def journal_storage(path: str) -> JournalStorage:
    """The embedded default storage: an append-only journal file (crash-safe, no server)."""
    return JournalStorage(JournalFileBackend(path))


class Search:
    """An Optuna study driven by ask/tell, with seeds, constraints and resume.

    Args:
        space: The grid to search.
        directions: One direction per objective value.
        storage: A journal file path, or an RDB URL (``postgresql://...``, ``sqlite:///...``).
        study_name: Name of the study inside the storage (created if missing, else continued).
        sampler: ``tpe`` or ``random``.
        seed: Seed of the sampler.
        metric_names: Names of the objective values (shown by optuna-dashboard).
    """

    def __init__(
        self,
        space: SearchSpace,
        directions: Sequence[Direction],
        storage: str,
        study_name: str,
        sampler: str = "tpe",
        seed: int = 0,
        metric_names: Sequence[str] | None = None,
    ) -> None:
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self.space = space
        self.directions = tuple(directions)
        self._storage = _open_storage(storage)
        self._open: dict[int, optuna.trial.Trial] = {}
        try:
            self._study = optuna.create_study(
                storage=self._storage,
                study_name=study_name,
                directions=list(directions),
                sampler=_make_sampler(sampler, seed, len(self.directions)),
                load_if_exists=True,
            )
        except Exception as exc:  # sqlalchemy / journal errors: translate where they enter
            raise InputError(
                f"cannot open the Optuna study {study_name!r} in {_redacted(storage)}: "
                f"{_first_line(exc)}"
            ) from exc
        if tuple(d.name.lower() for d in self._study.directions) != self.directions:
            raise InputError(
                f"study {study_name!r} in {_redacted(storage)} optimises {self._study.directions}, not "
                f"{list(self.directions)}; use another --study-name"
            )
        if metric_names and not self._study.metric_names:
            with warnings.catch_warnings():  # experimental API, stable enough for a label
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                self._study.set_metric_names(list(metric_names))

    # -- seeding and resume ----------------------------------------------------------------------

    def enqueue(self, knobs: Knobs, reason: str, again: bool = False, source: str = "seed") -> None:
        """Queue ``knobs`` to be tried next.

        Args:
            knobs: The config (moved onto the grid).
            reason: Why (kept as the trial's ``seed`` attribute).
            again: Queue it even if the same point was tried before (re-running an interrupted
                trial); otherwise such a point is skipped.
            source: The trial's source when asked (``seed``; ``predict``, ``grid``: chosen by
                that strategy).
        """
        params = self.space.encode(knobs)
        attrs = {"seed": reason} if source == "seed" else {"seed": reason, "source": source}
        self._study.enqueue_trial(params, user_attrs=attrs, skip_if_exists=not again)

    def recover_interrupted(self) -> list[InterruptedTrial]:
        """Fail trials left RUNNING by a killed run and queue their configs again.

        Only safe when no other worker uses the study (the embedded journal storage): a shared
        RDB study's RUNNING trials may belong to a live worker.

        Returns:
            The trials failed this way (the sweep records each as interrupted).
        """
        found = []
        lost = set(self._interrupted())
        for trial in self._study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            lost.add(trial.number)
            # Recorded before the tell: a crash in between must not make it count as a result.
            self._study.set_user_attr(_INTERRUPTED_ATTR, sorted(lost))
            self._study.tell(trial.number, state=TrialState.FAIL)
            source = _source(trial.user_attrs)
            attrs = (
                {"seed": "re-run"}
                if source in ("seed", "search")
                else {"seed": "re-run", "source": source}
            )
            self._study.enqueue_trial(dict(trial.params), user_attrs=attrs)
            params = {k: int(v) for k, v in trial.params.items()}
            started = trial.datetime_start
            found.append(
                InterruptedTrial(
                    number=trial.number,
                    knobs=self.space.decode(params),
                    source=source,
                    started_at=started.astimezone(dt.timezone.utc).isoformat(timespec="seconds")
                    if started
                    else "",
                )
            )
        return found

    # -- ask / tell -------------------------------------------------------------------------------

    def ask(self) -> AskedTrial:
        """The next config to measure."""
        trial = self._study.ask()
        bounds = self.space.param_bounds()
        params = {name: trial.suggest_int(name, lo, hi) for name, (lo, hi) in bounds.items()}
        source = _source(trial.user_attrs)
        self._open[trial.number] = trial
        return AskedTrial(trial.number, params, self.space.decode(params), source)

    def tell(self, number: int, outcome: TrialOutcome) -> None:
        """Record a completed trial: values, constraint slacks, attributes."""
        trial = self._open.pop(number)
        for key, value in outcome.user_attrs.items():
            trial.set_user_attr(key, value)
        for key, value in outcome.constraints.items():
            trial.set_constraint(key, float(value))
        self._study.tell(trial, list(outcome.values))

    def fail(self, number: int, reason: str) -> None:
        """Record a failed trial and why (the sweep goes on)."""
        trial = self._open.pop(number)
        trial.set_user_attr("failure", reason)
        self._study.tell(trial, state=TrialState.FAIL)

    # -- study attributes (the shared-target lease, analyzer.target.leases.claim_target) ---------------

    def study_attrs(self) -> dict[str, Any]:
        """The study's user attributes, read from the storage now (other workers' included)."""
        return dict(self._study.user_attrs)

    def set_study_attr(self, key: str, value: Any) -> None:
        """Set one study user attribute (JSON-able) in the storage, seen by every worker."""
        self._study.set_user_attr(key, value)

    # -- queries ----------------------------------------------------------------------------------

    def _interrupted(self) -> list[int]:
        """Numbers of the trials :meth:`recover_interrupted` failed."""
        return [int(n) for n in self._study.user_attrs.get(_INTERRUPTED_ATTR, ())]

    def _is_interrupted(self, trial: optuna.trial.FrozenTrial, lost: Sequence[int]) -> bool:
        return trial.number in lost or trial.user_attrs.get("failure") in _NOT_RESULTS

    def finished(self) -> list[FinishedTrial]:
        """Complete and failed trials, by number (interrupted trials excluded: they re-run)."""
        result = []
        lost = self._interrupted()
        for t in self._study.get_trials(
            deepcopy=False, states=(TrialState.COMPLETE, TrialState.FAIL)
        ):
            if self._is_interrupted(t, lost):
                continue
            params = {k: int(v) for k, v in t.params.items()}
            result.append(
                FinishedTrial(
                    number=t.number,
                    state="complete" if t.state == TrialState.COMPLETE else "failed",
                    knobs=self.space.decode(params),
                    values=tuple(t.values) if t.values is not None else (),
                    constraints=dict(t.constraints or {}),
                    user_attrs=dict(t.user_attrs),
                )
            )
        return sorted(result, key=lambda f: f.number)

    def started_count(self) -> int:
        """Trials started or finished in the study by any worker (budgets count these)."""
        states = (TrialState.RUNNING, TrialState.COMPLETE, TrialState.FAIL)
        lost = self._interrupted()
        return sum(
            1
            for t in self._study.get_trials(deepcopy=False, states=states)
            if not self._is_interrupted(t, lost)
        )

    def pareto_front(self) -> list[FinishedTrial]:
        """Feasible non-dominated trials (multi-objective studies)."""
        best = {t.number for t in self._study.best_trials}
        return [f for f in self.finished() if f.number in best and f.feasible]


def param_importances(storage: str, study_name: str) -> dict[str, float]:
    """How much each searched parameter mattered for reaching the best trials of a stored study.

    Optuna's default evaluator (PED-ANOVA) with ``target_quantile=0.25`` instead of 0.1, because
    sweeps have tens of trials, not hundreds, and the top 10 % would be one or two trials. A
    multi-objective study is judged by closeness to its Pareto front.

    Args:
        storage: The study's storage (journal file path or RDB URL, as run.json records it).
        study_name: Name of the study inside the storage.

    Returns:
        Parameter name (``log2_mbs``, ``delay_idx``, ``pref_depth``, ``instances`` (or
        ``instances_0``... per instance group);
        ``cache_idx``, ``policy_idx`` and ``cand_idx`` where searched) -> importance, normalised to sum to 1, largest first.

    Raises:
        InputError: The study cannot be opened, or has too few complete trials to judge.
    """
    import warnings

    try:
        study = optuna.load_study(study_name=study_name, storage=_open_storage(storage))
    except InputError:
        raise
    except Exception as exc:
        raise InputError(
            f"cannot open the Optuna study {study_name!r} in {_redacted(storage)}: "
            f"{_first_line(exc)}"
        ) from exc
    complete = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    if len(complete) < 4:
        raise InputError(
            f"{len(complete)} complete trials in study {study_name!r}: too few to judge "
            "parameter importance (at least 4 are needed)"
        )
    evaluator = optuna.importance.PedAnovaImportanceEvaluator(target_quantile=0.25)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # experimental-feature and quantile notices
            values = optuna.importance.get_param_importances(study, evaluator=evaluator)
    except (RuntimeError, ValueError) as exc:
        raise InputError(f"parameter importance unavailable: {_first_line(exc)}") from exc
    return {name: float(v) for name, v in values.items()}


def _nearest_choice(choices: Sequence[int | None], value: int | None) -> int:
    """Index of ``value`` among ``choices``; an int not among them takes the nearest int choice
    (a model's own candidate count moved onto the grid), anything else the first."""
    if value in choices:
        return choices.index(value)
    if value is None:
        return 0
    numbers = [(abs(c - value), i) for i, c in enumerate(choices) if c is not None]
    return min(numbers)[1] if numbers else 0


def _source(user_attrs: Mapping[str, Any]) -> str:
    """A trial's source: what enqueued it (``seed``, ``predict``, ``grid``), else ``search``."""
    if "source" in user_attrs:
        return str(user_attrs["source"])
    return "seed" if "seed" in user_attrs else "search"


def _make_sampler(name: str, seed: int, n_objectives: int) -> optuna.samplers.BaseSampler:
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if name != "tpe":
        raise InputError(f"unknown sampler {name!r}; use 'tpe' or 'random'")
    # Seeds (enqueued trials) count as start-up trials, so few random ones are needed; the
    # constraint slacks come from trial.set_constraint (Optuna >= 5.0).
    return optuna.samplers.TPESampler(
        seed=seed,
        n_startup_trials=4,
        # Measured on planted landscapes (benchmarks/search_efficiency.py): with this few
        # trials, independent TPE finds the optimum's neighbourhood sooner than multivariate.
        multivariate=False,
        group=False,
        constant_liar=True,
    )


def _open_storage(storage: str) -> optuna.storages.BaseStorage:
    if "://" in storage:
        url = storage
        if url.startswith("postgresql://"):
            url = "postgresql+psycopg2://" + url[len("postgresql://") :]
        if url.startswith("postgresql+psycopg2://"):
            try:
                import psycopg2  # noqa: F401  (sqlalchemy's driver for this URL)
            except ImportError:
                raise InputError(
                    f"the study storage {_redacted(storage)} needs the PostgreSQL driver "
                    "psycopg2, which is not installed: pip install 'perfsweep[postgres]'"
                ) from None
        error: Exception | None = None
        for attempt in range(3):
            try:
                # No heartbeat: Optuna only beats inside study.optimize, not in ask/tell loops.
                return optuna.storages.RDBStorage(url, engine_kwargs={"pool_pre_ping": True})
            except Exception as exc:
                # Workers starting together race to create the schema; the loser's retry finds
                # it in place. Other errors (refused connection, bad URL) fail the same way again.
                error = exc
                time.sleep(0.5 * (attempt + 1))
        raise InputError(
            f"cannot open the study storage {_redacted(storage)}: {_first_line(error or Exception())}; "
            "check the URL, that the database exists and accepts connections"
        ) from error
    return journal_storage(storage)


def _redacted(storage: str) -> str:
    """A storage URL without its password."""
    if "://" in storage and "@" in storage:
        scheme, rest = storage.split("://", 1)
        creds, host = rest.rsplit("@", 1)
        return f"{scheme}://{creds.split(':', 1)[0]}:***@{host}"
    return storage


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


logging.getLogger("optuna").setLevel(logging.WARNING)
