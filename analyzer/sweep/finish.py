"""Finishing a sweep: the winner, the recommendation, the Pareto front, the gain, the report.

What ``best/config.pbtxt`` holds (``_recommend``, the one recommendation rule), the summary,
the shared server left on a known config (``leave_server``), and ``report.html``.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from tritonclient.grpc import model_config_pb2 as mc

from analyzer.config.knobs import EngineKnobs
from analyzer.config.pipeline import Tuned
from analyzer.documents import write_json
from analyzer.errors import TargetError
from analyzer.evaluation.plan import LoadPlan
from analyzer.measure.gain import GainEstimate, GainSample, gain_estimate, gain_sentence
from analyzer.predict.profile import Profile, RequestMix
from analyzer.rundir.batching import batch_formation
from analyzer.rundir.results import RunDirectory, environment, utc_now, write_configs
from analyzer.rundir.summary import ConfigEntry, ParetoEntry, RunSummary, StopReason, server_gpus
from analyzer.rundir.trial_record import TrialRecord
from analyzer.rundir.validation import ValidationCandidate
from analyzer.search.study import FinishedTrial
from analyzer.sweep.state import SweepOutcome, SweepState
from analyzer.target.protocol import load_configs, observed_device

_LOG = logging.getLogger(__name__)


def leave_server(state: SweepState, chosen: TrialRecord | None) -> dict[str, Any]:
    """Put a shared server back on a known config (``run.leave``) and say which; once.

    The config is sent explicitly in the load override: an empty load means "the on-disk
    config" on one server and "keep the override" on another (Triton).
    """
    if state.left is not None:
        return state.left
    target, tuned = state.target, state.tuned
    left: dict[str, Any] = {"config": None, "knobs": None, "detail": ""}
    if tuned.pipeline:
        left["models"] = list(tuned.names)
    state.left = left  # decided: a second Ctrl-C during the load does not retry it
    if not target.shared:
        left["detail"] = "the managed server is stopped at the end of the run: nothing is left"
    elif state.dead:
        left["detail"] = (
            "the server died and did not return: nothing was restored (once back it holds "
            "the config it started with)"
        )
    elif not state.touched:
        left.update(config="original", knobs=tuned.knobs().to_dict())
        left["detail"] = f"the {_whose(tuned)} original config (the run never changed it)"
    else:
        which, configs, files = "original", tuned.originals(), {}
        detail = f"restored the {_whose(tuned)} original config"
        if state.scenario.run.leave == "best":
            if chosen is None:
                detail = f"no config met the goals, so restored the {_whose(tuned)} original config"
            elif chosen.number < 0:
                which, detail = (
                    "best",
                    f"the best config is the {_whose(tuned)} original config: restored it",
                )
            else:
                which, configs = "best", tuned.configs(chosen.config)
                files = tuned.files(chosen.config)
                detail = f"loaded the best config (trial {chosen.number})"
        try:
            load_configs(target, configs, files)
        except (TargetError, OSError) as exc:
            left["detail"] = (
                f"could not load the {which} config back ({exc}); the server may still hold the "
                "last trial's config"
            )
        else:
            left.update(config=which, knobs=tuned.knobs_of(configs).to_dict(), detail=detail)
    state.observer.on_server_left(left)
    return left


def _whose(tuned: Tuned) -> str:
    """``model's`` or, for a pipeline, ``composing models' (a, b, c)``."""
    if not tuned.pipeline:
        return "model's"
    return f"composing models' ({', '.join(tuned.names)})"


def _choose(
    state: SweepState, validation: list[ValidationCandidate]
) -> tuple[TrialRecord | None, float | None]:
    """The best worst case among validated configs, else the best search trial."""
    passing = [c for c in validation if c.all_meet_goals]
    if passing:
        chosen, why = state.objective.choose(passing, state.scenario.budget.capacity_resolution)
        number = chosen.trial_number
        # A tie validation decided by cost (one check of the cheaper config) left its sentence:
        # it stands when that config, the one searched config then validated, is chosen.
        if why is not None or number < 0:
            state.tie_break = why
        if number < 0 and state.baseline is not None:
            return state.baseline, chosen.worst_rps
        return state.results[number], chosen.worst_rps
    best = state.objective.best(state.results.values())
    if best is None and _baseline_only(state):
        # No searched config met the goals (or none ran): the model's own config did.
        return state.baseline, None
    return best, None


def _baseline_only(state: SweepState) -> bool:
    """The baseline met the goals and no searched config did (or none was measured)."""
    return (
        state.baseline is not None
        and state.baseline.meets_goals
        and not any(r.state == "complete" and r.meets_goals for r in state.results.values())
    )


def _headline(state: SweepState, result: TrialRecord | None) -> TrialRecord | None:
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


def finish_run(
    state: SweepState,
    stop_reason: StopReason,
    validation: list[ValidationCandidate],
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
        if recommendation.trial is not None and state.tuned.engine is not None:
            write_engine_answer(state, recommendation.trial, best_path.parent)
    if recommendation.withheld is not None:
        candidate_path = write_configs(
            directory.root / "candidate", recommendation.withheld, directory.tree
        )
    left = leave_server(state, recommendation.trial)
    goals = LoadPlan(scenario).goals
    goal_text = (
        f"goal {goals.describe()}" if goals.token_goals else f"goal p99 <= {goals.p99_ms:g} ms"
    ) + (f": {scenario.goals.note}" if scenario.goals.note else "")
    counts: dict[str, int] = {"complete": 0, "failed": 0, "interrupted": 0}
    for r in state.results.values():
        counts[r.state] = counts.get(r.state, 0) + 1
    counts["total"] = sum(counts.values())
    best_entry = None
    if best and chosen:
        entry_path = candidate_path or best_path
        best_entry = ConfigEntry.from_trial(
            best,
            config_path=directory.relative(entry_path) if entry_path else None,
            search_throughput_rps=chosen.throughput_rps,
            validated_throughput_rps=validated_rps,
        )
    baseline_entry = None
    if baseline and state.baseline:
        baseline_entry = ConfigEntry.from_trial(
            baseline,
            config_path=directory.relative(directory.configs_at(directory.trial_dir(-1))),
            search_throughput_rps=state.baseline.throughput_rps,
        )
    target_info = state.target.describe()
    devices = target_info.get("devices") or []
    restarts = state.earlier_restarts + int(target_info.get("restarts") or 0)
    outages = [*state.earlier_outages, *(target_info.get("outages") or ())]
    summary = RunSummary(
        run_id=run_state["run_id"],
        model=scenario.model.name,
        # The device that actually ran (the server's own report), not only the one asked for.
        device=observed_device(devices, state.target.device),
        device_requested=state.target.device,
        devices=tuple(devices),
        # The GPUs the server reported on /metrics (not the client host's: environment.gpu).
        server_gpus=tuple(server_gpus(baseline_entry, best_entry)),
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
            "report": "report.html" if scenario.run.report else None,
            "study": "study.journal" if scenario.run.storage is None else None,
        },
        started_at=started_at,
        finished_at=utc_now(),
        duration_s=round(duration_s, 1),
        search_strategy=state.strategy,
        search_note="; ".join(state.notes) or None,
        batching=_batching(state),
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
    if scenario.run.report:
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
    config: tuple[mc.ModelConfig, ...] | None = None
    #: The trial the config is (what a shared server is left on with ``--leave best``).
    trial: TrialRecord | None = None
    #: A winner not written as best/config.pbtxt (its gain is not significant).
    withheld: tuple[mc.ModelConfig, ...] | None = None

    def to_dict(self, candidate_path: str | None) -> dict[str, Any]:
        return {"config": self.which, "detail": self.detail, "candidate_config": candidate_path}


def request_mix(state: SweepState) -> RequestMix | None:
    """The requests the load sends as the probe sized them (one model's profile under
    ``--search predict``); None when no profile was taken or it is a pipeline's or a mix's."""
    profile = getattr(state.guide.predictor, "profile", None) if state.guide else None
    return profile.mix if isinstance(profile, Profile) else None


def _batching(state: SweepState) -> dict[str, Any] | None:
    """summary.json's ``batching``: the batches the trials formed, and why none did."""
    records = [*state.results.values(), *([state.baseline] if state.baseline else [])]
    mix = request_mix(state)
    share = mix.same_shape_share() if mix is not None else None
    found = batch_formation(records, share)
    return found.to_dict() if found is not None else None


def _recommend(
    state: SweepState, chosen: TrialRecord | None, gain: _Gain, died: bool
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
    config = state.tuned.configs(chosen.config)
    if chosen.number < 0:
        return _Recommendation(
            "original",
            "the model's own config: it meets the goals and no searched config did"
            + (" (none was measured)" if not state.results else "")
            if _baseline_only(state)
            else "the model's own config: no searched config did better",
            state.tuned.originals(),
            chosen,
        )
    if gain.significant is False and state.baseline is not None:
        return _Recommendation(
            "original",
            f"the model's own config: trial {chosen.number} ({gain.gain:.2f}x) is not "
            "significantly better; it is in "
            f"{state.run_dir.relative(state.run_dir.configs_at(state.run_dir.root / 'candidate'))}",
            state.tuned.originals(),
            state.baseline,
            withheld=config,
        )
    detail = f"trial {chosen.number}"
    if getattr(chosen.config, "ragged_batch", None):
        detail += (
            ": it sets allow_ragged_batch on the inputs with a variable dimension, so requests "
            "of different shapes share a batch; the model's backend must accept ragged batches"
        )
    if (traffic := _padding(state)) is not None:
        detail += f"; {traffic}"
    return _Recommendation("best", detail, config, chosen)


def write_engine_answer(state: SweepState, trial: TrialRecord, folder: Path) -> list[Path]:
    """What a generative engine's user deploys, beside ``config.pbtxt`` in ``folder``: the
    vLLM engine's ``model.json`` (Triton's vLLM backend, the reference engine); the command
    line of a server started from ``model.serve_command`` (``command.txt``); and
    ``measured.json``: the TTFT, ITL, tokens/s and goodput it was measured at (a TensorRT-LLM
    model's knobs are in ``config.pbtxt`` itself)."""
    written: list[Path] = []
    files = state.tuned.files(trial.config) if trial.number >= 0 else {}
    for key, data in files.items():
        path = folder / key.removeprefix("file:").split("/", 1)[-1]
        path.write_bytes(data)
        written.append(path)
    command = getattr(state.target, "command_line", None)
    if callable(command) and isinstance(trial.config, EngineKnobs):
        path = folder / "command.txt"
        path.write_text(command(trial.config) + "\n", encoding="utf-8")
        written.append(path)
    measured = {
        "trial": trial.number,
        "config": trial.config.to_dict(),
        "throughput_rps": trial.throughput_rps,
        **trial.token_figures(),
    }
    path = folder / "measured.json"
    write_json(path, measured)
    written.append(path)
    return written


def _padding(state: SweepState) -> str | None:
    """The client-side padding the measurements rest on, as the recommendation states it (None:
    requests went at their own lengths)."""
    section = state.scenario.input
    if section.pad_buckets is None:
        return None
    buckets = section.pad_buckets
    if buckets == "auto" and (mix := request_mix(state)) is not None:
        buckets = mix.sizes
    named = buckets if isinstance(buckets, str) else ",".join(str(b) for b in buckets)
    values = ", ".join(f"{k}={v:g}" for k, v in sorted((section.pad_values or {}).items()))
    return (
        f"measured with requests padded to length buckets {named} (pad values {values}): the "
        "client must pad its requests the same way"
    )


def _front(state: SweepState) -> tuple[list[TrialRecord], tuple[ParetoEntry, ...]]:
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
    paths = directory.write_pareto(state.tuned.configs(r.config) for r in pareto)
    entries = tuple(
        ParetoEntry(
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
    state: SweepState,
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
    if chosen is not None and chosen.number < 0 and _baseline_only(state):
        measured = "no searched config met the goals" if state.results else "no trial ran"
        return _Gain(1.0, f"gain over baseline: 1.00x (the baseline is the answer: {measured})")
    gain = round(objective.gain(objective.value(baseline), objective.value(best)), 3)
    if chosen is None or state.baseline is None:
        return _Gain(gain, gain_sentence(gain, None, None, None))
    estimate = gain_interval(state, chosen, state.baseline)
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


def gain_interval(
    state: SweepState, chosen: TrialRecord, baseline: TrialRecord
) -> GainEstimate | None:
    """The gain of ``chosen`` over ``baseline`` with its interval: a seeded bootstrap over each
    side's validation repeats (each within its capacity-search bracket), the search
    measurement where a side was not validated. The recommendation's rule
    (:func:`_recommend`) and validation's "nothing could change it" read the same one."""
    objective = state.objective

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

    return gain_estimate(
        side(chosen),
        side(baseline),
        higher_is_better=objective.higher_is_better,
        seed=state.scenario.run.seed,
    )


def _write_report(directory: RunDirectory, summary: RunSummary) -> None:
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
