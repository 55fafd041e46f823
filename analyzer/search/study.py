"""The search: the Optuna study behind the ask/tell loop.

This is the only module that imports optuna. Everything else sees :class:`Knobs` (the searched part
of a model config, defined in ``analyzer.config.knobs``),
:class:`~analyzer.search.space.SearchSpace` (a finite grid of knobs, encoded as integer indexes:
:mod:`analyzer.search.space`) and :class:`Search` (ask a trial, tell its outcome).
"""

from __future__ import annotations

import datetime as dt
import logging
import time
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import optuna
from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend
from optuna.trial import TrialState

from analyzer.config.pipeline import TrialKnobs
from analyzer.errors import InputError
from analyzer.search.space import JointSpace, Space

__all__ = [  # Knobs: analyzer.config.knobs and .pipeline (no optuna there)
    "DIED_REASON",
    "INTERRUPTED_REASON",
    "AskedTrial",
    "FinishedTrial",
    "InterruptedTrial",
    "Search",
    "TrialOutcome",
    "journal_storage",
    "param_importances",
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
    knobs: TrialKnobs
    source: str  # "seed"/"predict"/"grid" (enqueued) or "search" (the sampler's)


@dataclass(frozen=True)
class InterruptedTrial:
    """A trial a killed run left RUNNING (failed and re-queued by ``recover_interrupted``)."""

    number: int
    knobs: TrialKnobs
    source: str
    started_at: str


@dataclass(frozen=True)
class FinishedTrial:
    """A finished trial as stored in the study."""

    number: int
    state: str  # "complete" | "failed"
    knobs: TrialKnobs
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
        space: Space,
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
                sampler=_make_sampler(sampler, seed, _startup_trials(space)),
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

    def enqueue(
        self, knobs: TrialKnobs, reason: str, again: bool = False, source: str = "seed"
    ) -> None:
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


def _source(user_attrs: Mapping[str, Any]) -> str:
    """A trial's source: what enqueued it (``seed``, ``predict``, ``grid``), else ``search``."""
    if "source" in user_attrs:
        return str(user_attrs["source"])
    return "seed" if "seed" in user_attrs else "search"


def _startup_trials(space: Space) -> int:
    """TPE's start-up trials (seeds included): 4, and 2 more per further model of a joint space.

    A joint space's seeds set every model alike (zipped), and independent TPE fitted on
    histories that are alike per model proposes the same value for each: it would search only
    the configs where all models agree. Random start-up trials draw each model's knobs apart.
    """
    return 4 + 2 * (len(space.stages) - 1) if isinstance(space, JointSpace) else 4


def _make_sampler(name: str, seed: int, startup: int = 4) -> optuna.samplers.BaseSampler:
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if name != "tpe":
        raise InputError(f"unknown sampler {name!r}; use 'tpe' or 'random'")
    # Seeds (enqueued trials) count as start-up trials, so few random ones are needed; the
    # constraint slacks come from trial.set_constraint (Optuna >= 5.0).
    return optuna.samplers.TPESampler(
        seed=seed,
        n_startup_trials=startup,
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
