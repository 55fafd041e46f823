"""``summary.json``: how a sweep ended, the configs it compared, the winner and the gain."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from analyzer.config.pipeline import TrialKnobs
from analyzer.documents import SUMMARY_KIND, header
from analyzer.measure.gain import LOW_SAMPLE_P99, p99_sample_note
from analyzer.rundir.parsing import migrate, opt_float, opt_int, opt_str, parse_guarded, parse_knobs
from analyzer.rundir.trial_record import TrialRecord
from analyzer.rundir.validation import ValidationCandidate


class StopReason(str, enum.Enum):
    """Why a sweep's search ended: summary.json's ``stop_reason`` (the value is what is written).

    A file written before the key existed reads as :attr:`NOT_RECORDED` (``""``, written back as
    it was read).
    """

    #: ``budget.trials`` trials were started.
    TRIALS = "trials"
    #: ``budget.time_budget_s`` ran out.
    TIME_BUDGET = "time_budget"
    #: ``budget.patience`` trials without a feasible improvement of ``budget.min_improvement``.
    STAGNATION = "stagnation"
    #: ``--search predict``: the measured best lies in the predicted best's band.
    PREDICTION = "prediction"
    #: ``--search predict``: on the record of the configs measured, no unmeasured config is
    #: expected to beat the best by more than the search's resolution (a plateau).
    NOTHING_LEFT = "nothing_left_to_gain"
    #: ``--search grid``: every config of the grid was measured.
    GRID = "grid"
    #: Ctrl-C (or a kill): run.json says ``interrupted``; ``--resume`` goes on.
    INTERRUPTED = "interrupted"
    #: The server died and could not be brought back: run.json says ``failed``.
    SERVER_DIED = "server_died"
    #: Not in the file (written before summary.json recorded it).
    NOT_RECORDED = ""

    def __str__(self) -> str:
        return str(self.value)


@dataclass(frozen=True)
class ConfigEntry:
    """summary.json's ``baseline`` or ``best``: the config and its headline numbers.

    The numbers are the worst validation repeat when the config was validated (``source``
    ``validation``), else its search measurement.
    """

    config: TrialKnobs
    throughput_rps: float
    p50_ms: float
    p99_ms: float
    meets_goals: bool
    trial_number: int
    #: Relative to the run directory.
    config_path: str | None = None
    p99_n: int | None = None
    p99_low_sample: bool | None = None
    p99_note: str | None = None
    #: :data:`GPU_FIGURE_KEYS` per GPU at the operating point (None: no GPU metric).
    gpus: tuple[dict[str, Any], ...] | None = None
    #: ``best`` only: the worst validated capacity (None: not validated).
    validated_throughput_rps: float | None = None
    #: The search measurement's throughput (the headline may be a validation repeat's).
    search_throughput_rps: float | None = None
    source: str | None = None
    #: A generative config's token figures at its operating point: ``ttft_p99_ms``,
    #: ``itl_p99_ms``, ``output_tokens_per_s``, ``goodput_rps`` (None: requests answered once).
    tokens: dict[str, float | None] | None = None

    @classmethod
    def from_trial(
        cls,
        trial: TrialRecord,
        *,
        config_path: str | None,
        search_throughput_rps: float | None,
        validated_throughput_rps: float | None = None,
    ) -> ConfigEntry:
        """The entry of a headline trial (``sweep._finish``).

        ``p99_n`` is the number of latencies behind the percentiles; a p99 of fewer than
        :data:`~analyzer.measure.gain.LOW_SAMPLE_P99` is ``p99_low_sample`` with a ``p99_note``.
        """
        samples = trial.request_count()
        gpus = trial.gpu_figures()
        return cls(
            config=trial.config,
            throughput_rps=float(trial.throughput_rps),
            p50_ms=float(trial.p50_ms),
            p99_ms=float(trial.p99_ms),
            meets_goals=bool(trial.meets_goals),
            trial_number=trial.number,
            config_path=config_path,
            p99_n=samples,
            p99_low_sample=None if samples is None else samples < LOW_SAMPLE_P99,
            p99_note=p99_sample_note(samples),
            gpus=None if gpus is None else tuple(gpus),
            validated_throughput_rps=validated_throughput_rps,
            search_throughput_rps=search_throughput_rps,
            source=trial.source,
            tokens=trial.token_figures() or None,
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "config": self.config.to_dict(),
            "throughput_rps": self.throughput_rps,
            "p50_ms": self.p50_ms,
            "p99_ms": self.p99_ms,
            "p99_n": self.p99_n,
            "p99_low_sample": self.p99_low_sample,
            "p99_note": self.p99_note,
            "meets_goals": self.meets_goals,
            "trial_number": self.trial_number,
            "gpus": None if self.gpus is None else [dict(g) for g in self.gpus],
            "config_path": self.config_path,
            "validated_throughput_rps": self.validated_throughput_rps,
            "search_throughput_rps": self.search_throughput_rps,
            "source": self.source,
            **({"tokens": dict(self.tokens)} if self.tokens is not None else {}),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ConfigEntry:
        gpus = d.get("gpus")
        return cls(
            config=parse_knobs(d["config"]),
            throughput_rps=float(d.get("throughput_rps") or 0.0),
            p50_ms=float(d.get("p50_ms") or 0.0),
            p99_ms=float(d.get("p99_ms") or 0.0),
            meets_goals=bool(d.get("meets_goals", False)),
            trial_number=int(d.get("trial_number", -1)),
            config_path=opt_str(d.get("config_path")),
            p99_n=opt_int(d.get("p99_n")),
            p99_low_sample=None if d.get("p99_low_sample") is None else bool(d["p99_low_sample"]),
            p99_note=opt_str(d.get("p99_note")),
            gpus=None if gpus is None else tuple(dict(g) for g in gpus),
            validated_throughput_rps=opt_float(d.get("validated_throughput_rps")),
            search_throughput_rps=opt_float(d.get("search_throughput_rps")),
            source=opt_str(d.get("source")),
            tokens=dict(d["tokens"]) if d.get("tokens") else None,
        )


def server_gpus(*entries: ConfigEntry | None) -> list[dict[str, Any]]:
    """summary.json's ``server_gpus``: the GPUs the server reported in the entries (uuid, name,
    memory_total_mb), once each."""
    seen: dict[str, dict[str, Any]] = {}
    for entry in entries:
        for g in (entry.gpus if entry is not None else None) or ():
            seen.setdefault(
                g["uuid"],
                {
                    "uuid": g["uuid"],
                    "name": g.get("name"),
                    "memory_total_mb": g.get("memory_total_mb"),
                },
            )
    return list(seen.values())


@dataclass(frozen=True)
class ParetoEntry:
    """One config on the front (objective ``pareto``), ranked by throughput."""

    rank: int
    trial_number: int
    config: TrialKnobs
    throughput_rps: float
    p99_ms: float
    reference_p99_ms: float | None
    config_path: str | None

    def to_dict(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "trial_number": self.trial_number,
            "config": self.config.to_dict(),
            "throughput_rps": self.throughput_rps,
            "p99_ms": self.p99_ms,
            "reference_p99_ms": self.reference_p99_ms,
            "config_path": self.config_path,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ParetoEntry:
        return cls(
            rank=int(d["rank"]),
            trial_number=int(d["trial_number"]),
            config=parse_knobs(d["config"]),
            throughput_rps=float(d["throughput_rps"]),
            p99_ms=float(d["p99_ms"]),
            reference_p99_ms=opt_float(d.get("reference_p99_ms")),
            config_path=opt_str(d.get("config_path")),
        )


@dataclass(frozen=True)
class RunSummary:
    """summary.json: what a sweep produced, where, and in which environment.

    Build it with keyword arguments (``sweep._finish``: :meth:`ConfigEntry.from_trial` for the
    two entries, :meth:`ValidationCandidate.from_dict` for the candidates it wrote), or from the
    JSON with :meth:`from_dict`. Free-form parts (goals, environment, scenario, study, files,
    left_on_server, devices, server_gpus) stay mappings: they are the scenario's and the
    target's own dicts, shown, not computed with.
    """

    run_id: str
    model: str
    device: str
    objective: str
    #: ``scenario.goals`` as a dict (``p99_ms``, ``min_throughput_rps``, ``max_error_rate``, ...).
    goals: dict[str, Any]
    baseline: ConfigEntry | None
    best: ConfigEntry | None
    #: Best over baseline (latency: baseline p99 over best p99); None when not stated.
    gain: float | None
    #: Trial counts by state, and ``total``.
    trials: dict[str, int]
    stop_reason: StopReason
    target_url: str | None = None
    device_requested: str | None = None
    devices: tuple[dict[str, Any], ...] = ()
    server_gpus: tuple[dict[str, Any], ...] = ()
    #: The gain's 95 % interval (low, high); None at an open end (a censored side: one-sided).
    gain_ci: tuple[float | None, float | None] | None = None
    gain_significant: bool | None = None
    #: Repeats behind (best, baseline).
    gain_repeats: tuple[int, ...] | None = None
    gain_text: str | None = None
    goal_text: str | None = None
    tie_break: str | None = None
    left_on_server: dict[str, Any] | None = None
    pareto: tuple[ParetoEntry, ...] = ()
    validation: tuple[ValidationCandidate, ...] = ()
    environment: dict[str, Any] = field(default_factory=dict)
    scenario: dict[str, Any] = field(default_factory=dict)
    study: dict[str, Any] = field(default_factory=dict)
    files: dict[str, Any] = field(default_factory=dict)
    started_at: str | None = None
    finished_at: str | None = None
    duration_s: float | None = None
    #: ``predict``, ``tpe``, ``random`` or ``grid``: the search that ran (None: not recorded).
    search_strategy: str | None = None
    #: Why the search that ran is not the one asked for (e.g. predict fell back to tpe).
    search_note: str | None = None
    #: Batch formation (:class:`analyzer.rundir.batching.BatchFormation`): per trial the mean
    #: batch and histogram beside its max batch size, whether the batching knobs were inert and
    #: why; None: no trial that could batch reported the server's statistics.
    batching: dict[str, Any] | None = None
    #: Seconds per phase (``baseline``, ``profile``, ``predict``, ``search``, ``validation``);
    #: a phase that did not run is absent; empty: not recorded.
    phases: dict[str, float] = field(default_factory=dict)
    #: What best/config.pbtxt holds (``sweep._recommend``, the one rule): ``{"config": "best" |
    #: "original" | null, "detail": "...", "candidate_config": path of a winner not
    #: recommended (its gain is not significant) | null}``; None: not recorded.
    recommendation: dict[str, Any] | None = None
    #: What happened to the server under test during the run: each death (``died``), each
    #: config that killed it twice (``crashed the server``), with the trial and the time.
    server_events: tuple[dict[str, Any], ...] = ()
    #: Restarts of a managed server during the run.
    server_restarts: int = 0
    #: A ``--url`` server's outages: when, seconds waited, whether it returned.
    outages: tuple[dict[str, Any], ...] = ()

    @property
    def chosen(self) -> ConfigEntry | None:
        """The config a user would deploy: ``best``, else the baseline (nothing met the goals)."""
        return self.best or self.baseline

    def candidate(self, trial_number: int) -> ValidationCandidate | None:
        """The validation candidate of a trial (None: it was not validated)."""
        return next((c for c in self.validation if c.trial_number == trial_number), None)

    def to_dict(self) -> dict[str, Any]:
        """The file's JSON, version header first, keys in the documented order."""
        return {
            **header(SUMMARY_KIND),
            "run_id": self.run_id,
            "model": self.model,
            "device": self.device,
            "device_requested": self.device_requested,
            "devices": [dict(d) for d in self.devices],
            "server_gpus": [dict(g) for g in self.server_gpus],
            "target_url": self.target_url,
            "goals": dict(self.goals),
            "objective": self.objective,
            "baseline": self.baseline.to_dict() if self.baseline else None,
            "best": self.best.to_dict() if self.best else None,
            "gain": self.gain,
            "gain_ci": None if self.gain_ci is None else list(self.gain_ci),
            "gain_significant": self.gain_significant,
            "gain_repeats": None if self.gain_repeats is None else list(self.gain_repeats),
            "gain_text": self.gain_text,
            "goal_text": self.goal_text,
            "tie_break": self.tie_break,
            "trials": dict(self.trials),
            "stop_reason": StopReason(self.stop_reason).value,
            "left_on_server": None if self.left_on_server is None else dict(self.left_on_server),
            "pareto": [p.to_dict() for p in self.pareto],
            "validation": [c.to_dict() for c in self.validation],
            "environment": dict(self.environment),
            "scenario": dict(self.scenario),
            "study": dict(self.study),
            "files": dict(self.files),
            "started_at": self.started_at,
            "finished_at": self.finished_at,
            "duration_s": self.duration_s,
            "search_strategy": self.search_strategy,
            "search_note": self.search_note,
            "batching": self.batching,
            "phases": dict(self.phases),
            "recommendation": None if self.recommendation is None else dict(self.recommendation),
            "server_events": [dict(e) for e in self.server_events],
            "server_restarts": self.server_restarts,
            "outages": [dict(o) for o in self.outages],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RunSummary:
        """Inverse of :meth:`to_dict`; reads every version in the format history."""
        return parse_guarded(SUMMARY_KIND, lambda: cls._from_dict(migrate(SUMMARY_KIND, data)))

    @classmethod
    def _from_dict(cls, d: Mapping[str, Any]) -> RunSummary:
        ci = d.get("gain_ci")
        repeats = d.get("gain_repeats")
        significant = d.get("gain_significant")
        left = d.get("left_on_server")
        duration = d.get("duration_s")
        return cls(
            run_id=str(d["run_id"]),
            model=str(d["model"]),
            device=str(d.get("device", "")),
            objective=str(d.get("objective", "throughput")),
            goals=dict(d.get("goals") or {}),
            baseline=ConfigEntry.from_dict(d["baseline"]) if d.get("baseline") else None,
            best=ConfigEntry.from_dict(d["best"]) if d.get("best") else None,
            gain=opt_float(d.get("gain")),
            trials={str(k): int(v) for k, v in (d.get("trials") or {}).items()},
            stop_reason=StopReason(str(d.get("stop_reason", ""))),
            target_url=opt_str(d.get("target_url")),
            device_requested=opt_str(d.get("device_requested")),
            devices=tuple(dict(x) for x in d.get("devices") or ()),
            server_gpus=tuple(dict(x) for x in d.get("server_gpus") or ()),
            gain_ci=(opt_float(ci[0]), opt_float(ci[1]))
            if isinstance(ci, list) and len(ci) == 2
            else None,
            gain_significant=None if significant is None else bool(significant),
            gain_repeats=None if repeats is None else tuple(int(r) for r in repeats),
            gain_text=opt_str(d.get("gain_text")),
            goal_text=opt_str(d.get("goal_text")),
            tie_break=opt_str(d.get("tie_break")),
            left_on_server=None if left is None else dict(left),
            pareto=tuple(ParetoEntry.from_dict(p) for p in d.get("pareto") or ()),
            validation=tuple(ValidationCandidate.from_dict(c) for c in d.get("validation") or ()),
            environment=dict(d.get("environment") or {}),
            scenario=dict(d.get("scenario") or {}),
            study=dict(d.get("study") or {}),
            files=dict(d.get("files") or {}),
            started_at=opt_str(d.get("started_at")),
            finished_at=opt_str(d.get("finished_at")),
            duration_s=None if duration is None else float(duration),
            search_strategy=opt_str(d.get("search_strategy")),
            search_note=opt_str(d.get("search_note")),
            batching=d.get("batching") or None,
            phases={str(k): float(v) for k, v in (d.get("phases") or {}).items()},
            recommendation=dict(d["recommendation"]) if d.get("recommendation") else None,
            server_events=tuple(dict(e) for e in d.get("server_events") or ()),
            server_restarts=int(d.get("server_restarts") or 0),
            outages=tuple(dict(o) for o in d.get("outages") or ()),
        )
