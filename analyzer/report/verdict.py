"""The verdict: headline, goals met, gain, and the warnings that say how far to trust them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from analyzer.config.objective import Objective
from analyzer.measure.gain import gain_sentence
from analyzer.report.record import (
    ConfigResult,
    LoadCurve,
    ServerBreakdown,
    TrialPoint,
    ValidationRow,
    Verdict,
    as_float,
)
from analyzer.rundir.summary import RunSummary, StopReason

#: Search and validation throughput that differ by more than this fraction earn a warning.
VALIDATION_DRIFT = 0.10


def ceiling_warning(
    summary: RunSummary, best: ConfigResult | None, curves: Sequence[LoadCurve]
) -> str | None:
    """A best config that never failed below the rate ceiling has an unknown true capacity."""
    curve = next((c for c in curves if c.role == "best"), None)
    if best is None or curve is None or curve.first_failing_rps is not None:
        return None
    traffic = summary.scenario.get("traffic") or {}
    ceiling = traffic.get("max_rate_rps")
    where = f"traffic.max_rate_rps ({ceiling:g} req/s)" if ceiling else "the highest rate tried"
    return (
        f"The best config met the goals at every load tried, up to {where}: its real capacity "
        "may be higher. Raise traffic.max_rate_rps (within what this load generator can send)."
    )


def explain(breakdown: Sequence[ServerBreakdown]) -> tuple[str, ...]:
    """Why the best config serves more: batching, compute per request, queueing, instances.

    Triton charges every request of a batch the whole execution's compute time, so compute per
    request divided by the mean batch size is what one request really costs the device.
    """
    views = {b.role: b for b in breakdown}
    base, best = views.get("baseline"), views.get("best")
    if base is None or best is None:
        return ()
    out = [
        f"Measured at each config's own operating point: {best.measured_at_rps:.0f} req/s for the "
        f"best, {base.measured_at_rps:.0f} req/s for the baseline."
    ]
    if best.stages:
        return (*out, *_stages_explained(best, base))
    out.append(
        f"Batching: {best.avg_batch_size:.2f} requests per execution vs "
        f"{base.avg_batch_size:.2f} for the baseline."
    )
    if best.avg_batch_size > 0 and base.avg_batch_size > 0:
        cost_best = best.compute_infer_us / best.avg_batch_size / 1000
        cost_base = base.compute_infer_us / base.avg_batch_size / 1000
        out.append(
            f"Device time per request (compute infer / mean batch): {cost_best:.3f} ms vs "
            f"{cost_base:.3f} ms."
        )
    out.append(
        f"Time queued per request: {best.queue_us / 1000:.3f} ms vs {base.queue_us / 1000:.3f} ms."
    )
    if best.instance_busy_pct is not None and base.instance_busy_pct is not None:
        out.append(
            f"Instances busy: {best.instance_busy_pct:.0f} % vs {base.instance_busy_pct:.0f} % "
            "of the measurement."
        )
    return tuple(out)


def _stages_explained(best: ServerBreakdown, base: ServerBreakdown) -> list[str]:
    """A pipeline's stages, best vs baseline (an ensemble's own execution is one request)."""
    before = {s.name: s for s in base.stages}
    out = []
    for stage in best.stages:
        was = before.get(stage.name)
        then = (
            f" vs {was.avg_batch_size:.2f}, {was.queue_us / 1000:.2f} ms"
            + ("" if was.busy_pct is None else f", {was.busy_pct:.0f} %")
            if was is not None
            else ""
        )
        out.append(
            f"Stage {stage.name} (batch, queue per request, instances busy): "
            f"{stage.avg_batch_size:.2f}, {stage.queue_us / 1000:.2f} ms"
            + ("" if stage.busy_pct is None else f", {stage.busy_pct:.0f} %")
            + then
            + "."
        )
    if best.limiting_stage:
        out.append(
            f"The stage that limits the pipeline's capacity at the best config: "
            f"{best.limiting_stage} (its instances were the busiest)."
        )
    return out


def _machine(env: Mapping[str, Any]) -> str:
    gpus = env.get("gpu") or []
    gpu = ", ".join(str(g) for g in gpus) if gpus else "no GPU"
    return f"{env.get('host', '?')}: {env.get('cpu', '?')} x{env.get('cpu_count', '?')}, {gpu}"


def build_verdict(
    summary: RunSummary,
    run_state: Mapping[str, Any] | None,
    objective: Objective,
    baseline: ConfigResult | None,
    best: ConfigResult | None,
    trials: Sequence[TrialPoint],
    validation: Sequence[ValidationRow],
) -> Verdict:
    goals = dict(summary.goals)
    env = summary.environment
    counts = dict(summary.trials)
    status = str((run_state or {}).get("status") or "unknown")
    stop_reason = summary.stop_reason
    gain = as_float(summary.gain)
    # The baseline is a config too: a run whose search found nothing better still has one
    # config that meets the goals, the model's own.
    goals_met = (best is not None and best.meets_goals) or (
        best is None and baseline is not None and baseline.meets_goals
    )
    p99_goal = goals.get("p99_ms")
    gain_ci = summary.gain_ci
    significant = summary.gain_significant
    gain_text = summary.gain_text or ""
    if not gain_text and gain is not None:  # a summary written before gains had intervals
        gain_text = gain_sentence(gain, gain_ci, significant, summary.gain_repeats)
    goal_text = summary.goal_text or f"goal p99 <= {p99_goal} ms"

    searched_met = any(t.number >= 0 and t.state == "complete" and t.meets_goals for t in trials)
    if best is None or (best.trial_number < 0 and not searched_met):
        # The baseline is the answer only because no searched config met the goals: say so.
        headline = f"No config met the goals (p99 ≤ {p99_goal} ms)."
        if baseline is not None and baseline.meets_goals:
            searched = (
                "The time budget ran out before trial 0"
                if stop_reason is StopReason.TIME_BUDGET and not any(t.number >= 0 for t in trials)
                else f"No searched config met the goals (p99 ≤ {p99_goal} ms)"
            )
            headline = (
                f"{searched}; the baseline does, at {baseline.throughput_rps:.1f} req/s: keep "
                "the model's own config."
            )
    else:
        headline = objective.headline(
            best, baseline, gain_text if gain is not None else None, p99_goal
        )

    warnings: list[str] = []
    if status not in ("completed", "unknown"):
        warnings.append(f"The run is {status}: the results cover only the trials that finished.")
    if stop_reason is StopReason.INTERRUPTED:
        warnings.append("The sweep was interrupted; resume it with `perfsweep run --resume`.")
    recommendation = summary.recommendation or {}
    if recommendation.get("candidate_config"):
        warnings.append(
            "No searched config is significantly better than the model's own: best/config.pbtxt "
            f"holds the original config; {recommendation.get('detail')}."
        )
    if stop_reason is StopReason.SERVER_DIED:
        warnings.append(
            "The server died and did not return: the run stopped, nothing was measured against "
            "the dead server, and the best config so far is NOT VALIDATED (no best config was "
            "written). Resume it with `perfsweep run --resume` once the server answers."
        )
    crashed = [e for e in summary.server_events if e.get("event") == "crashed the server"]
    if crashed:
        warnings.append(
            f"{len(crashed)} config(s) crashed the server twice (trials "
            f"{_numbers_text([int(e['trial']) for e in crashed])}): they were not measured; "
            "see the trials' failure column."
        )
    if summary.server_restarts or summary.outages:
        back = sum(1 for o in summary.outages if o.get("returned"))
        warnings.append(
            f"The server died during the run: {summary.server_restarts} restart(s) of the "
            f"managed server, {len(summary.outages)} outage(s) of the --url server "
            f"({back} back within the wait). A trial it died in is measured again on the "
            "server that returned, never counted as a measurement."
        )
    if summary.device == "sim":
        warnings.append(
            "Measured on the simulated device: latencies come from a latency profile, not real "
            "hardware. Use them to compare configs, not as the accelerator's real capacity."
        )
    if baseline is not None and not baseline.meets_goals:
        warnings.append("The baseline config missed the goals, so no gain over it is stated.")
    failed = [t for t in trials if t.state != "complete"]
    if failed:
        reasons = "; ".join(dict.fromkeys((t.failure or "unknown")[:120] for t in failed[:3]))
        warnings.append(f"{len(failed)} trial(s) failed: {reasons}")
    invalid = [t.number for t in trials if t.valid is False]
    if invalid:
        warnings.append(
            f"{len(invalid)} measurement(s) were generator-saturated (trials "
            f"{_numbers_text(invalid)}): their numbers describe the load generator."
        )
    unstable = [t.number for t in trials if t.stable is False]
    if unstable:
        warnings.append(
            f"{len(unstable)} measurement(s) did not stabilise (trials "
            f"{_numbers_text(unstable)}): treat their numbers as rough."
        )
    for row in validation:
        name = "The baseline" if row.trial_number < 0 else f"Trial {row.trial_number}"
        if not row.all_meet_goals:
            warnings.append(f"{name} missed the goals when re-measured in validation.")
        elif row.search_throughput_rps and row.worst_rps is not None:
            drift = abs(row.worst_rps - row.search_throughput_rps) / row.search_throughput_rps
            if drift > VALIDATION_DRIFT:
                warnings.append(
                    f"{name}: validation measured {row.worst_rps:.1f} req/s "
                    f"(worst case) vs {row.search_throughput_rps:.1f} req/s in the search "
                    f"({drift:.0%} apart): measurements on this machine are noisy."
                )
    footnotes = tuple(
        dict.fromkeys(
            f"{c.role}: {c.p99_note}" for c in (best, baseline) if c is not None and c.p99_note
        )
    )
    return Verdict(
        model=summary.model,
        objective=objective.name,
        goals=goals,
        goals_met=goals_met,
        headline=headline,
        baseline=baseline,
        best=best,
        gain=gain,
        device=summary.device,
        machine=_machine(env),
        status=status,
        stop_reason=str(stop_reason),
        trials=counts,
        warnings=tuple(warnings),
        gain_ci=gain_ci,
        gain_significant=significant,
        gain_text=gain_text,
        goal_text=goal_text,
        footnotes=footnotes,
        gain_label=objective.gain_label,
    )


def _numbers_text(numbers: Sequence[int], limit: int = 8) -> str:
    shown = ", ".join("baseline" if n < 0 else str(n) for n in numbers[:limit])
    return shown + (f" and {len(numbers) - limit} more" if len(numbers) > limit else "")
