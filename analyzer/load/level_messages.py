"""The sentences a measured load level carries (``Measurement.messages``): whether the generator
kept up, whether the windows agreed, what a shaped stream actually sent, errors and pool waits.

Pure: :class:`LevelFacts` holds what the runner counted, :func:`level_messages` words it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from analyzer.measure.arrivals import Arrival
from analyzer.measure.specs import LoadMode, LoadSpec

#: Arrival processes whose sends need no note beside the level (what was asked is what a
#: generator that kept up sent).
PLAIN_ARRIVALS = (Arrival.POISSON, Arrival.CONSTANT)


@dataclass(frozen=True)
class LevelFacts:
    """What one measured level counted, as far as its messages need it.

    Attributes:
        problems: why the generator's numbers are invalid (``generator_problems``; empty: valid).
        send_lag_p99_ms: open loop: p99 of how late requests left.
        stable: the windows (or the step's equal parts) agreed.
        checked_windows: the stability check read the step's equal parts, this many (None: the
            windows themselves).
        windows: windows measured.
        stopped_early: why the level ended before its windows (None: it did not).
        step_reason: the sequential test's decision (None: no sequential step).
        offered_rps, gap_cv, late_share: open loop: what was sent, the CV of its gaps and the
            share of requests sent over 1 ms late.
        pool_size, backlog_max: in-flight slots per process, and the most requests that waited
            for one.
        errors, error_kinds: failed requests, by kind.
        scraper_errors: why server statistics could not be read, per source.
    """

    problems: list[str]
    send_lag_p99_ms: float
    stable: bool
    checked_windows: int | None
    windows: int
    stopped_early: str | None
    step_reason: str | None
    offered_rps: float
    gap_cv: float | None
    late_share: float
    pool_size: int
    backlog_max: int
    errors: int
    error_kinds: dict[str, int] = field(default_factory=dict)
    scraper_errors: dict[str, str] = field(default_factory=dict)


def level_messages(spec: LoadSpec, facts: LevelFacts) -> list[str]:
    """The level's messages, most important first (an INVALID or UNSTABLE verdict leads)."""
    open_loop = spec.mode is LoadMode.REQUEST_RATE
    messages: list[str] = []
    if facts.problems:
        problems = list(facts.problems)
        if open_loop:
            problems.append(f"send-lag p99 {facts.send_lag_p99_ms:.1f} ms")
        messages.append(
            "INVALID: the load generator was saturated ("
            + "; ".join(problems)
            + "), so these numbers describe the generator, not the server. Fix: add generator "
            "processes (--workers N, one per free core) or offer less load per process "
            "(fewer users / a lower rate)."
        )
    if facts.step_reason is not None:
        messages.append(f"sequential step: {facts.step_reason}")
    unstable = not facts.stable and facts.stopped_early is None
    if unstable and facts.step_reason is not None:
        which = (
            f"the last {spec.stable_windows} of {facts.windows} windows"
            if facts.checked_windows is None
            else f"the step's {spec.stable_windows} equal parts (decided within "
            f"{facts.windows} window{'s' if facts.windows != 1 else ''})"
        )
        messages.append(
            f"unstable (a check, not the stopping rule): {which} did not agree within "
            f"{spec.stability_pct:g}% on throughput and p99"
        )
    elif unstable:
        messages.append(
            f"UNSTABLE: the last {spec.stable_windows} of {facts.windows} windows did not agree "
            f"within {spec.stability_pct:g}% on throughput and p99; use longer windows "
            "(--window-s / --window-requests) or a lower load."
        )
    if open_loop and spec.arrival.kind not in PLAIN_ARRIVALS and facts.gap_cv is not None:
        # A shaped stream: say what was sent beside what was asked.
        messages.append(
            f"arrivals {spec.arrival.describe()}: sent {facts.offered_rps:.4g} req/s, gap CV "
            f"{facts.gap_cv:.2f}, {facts.late_share:.1%} sent over 1 ms late"
        )
    if facts.stopped_early is not None:
        messages.append(f"stopped early: {facts.stopped_early}")
    if not open_loop:
        messages.append(
            "closed loop: latency is timed from the actual send, so a server stall delays the "
            "next request instead of showing in the tail (coordinated omission); use "
            "--rate-rps for trustworthy tail latency."
        )
    if facts.backlog_max > 0:
        messages.append(
            f"the open-loop pool ({facts.pool_size} in flight per process) was full: up to "
            f"{facts.backlog_max} requests waited for a slot (their wait counts in latency)."
        )
    if facts.errors:
        top = sorted(facts.error_kinds.items(), key=lambda kv: -kv[1])[:3]
        kinds = ", ".join(f"{k} x{n}" for k, n in top)
        messages.append(f"{facts.errors} failed requests: {kinds}")
    if facts.scraper_errors:
        messages.append(
            "server statistics unavailable: "
            + "; ".join(f"{k}: {v}" for k, v in facts.scraper_errors.items())
        )
    return messages
