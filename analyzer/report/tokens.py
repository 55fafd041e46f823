"""The report's token streams: a generative model's configs by TTFT, ITL and tokens/s.

For each measured config (an engine's knobs), every level its capacity search offered:
tokens/s, TTFT p50/p99 and ITL p50/p99 against the offered rate, and whether the level met the
goals (:class:`TokenStory`, built by :func:`token_story`); drawn by :func:`tokens_figure`:
tokens/s, TTFT p99 and ITL p99 against the rate, one line per config, the goals as lines.
A sweep of a model answered once per request has none (None).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from analyzer.measure.goals import meets_goals
from analyzer.report.svg import Figure, new_figure, styled, to_svg
from analyzer.rundir.trial_record import TrialRecord


@dataclass(frozen=True)
class TokenLevel:
    """One level of a config's capacity search, as its token streams saw it."""

    offered_rps: float
    throughput_rps: float
    output_tokens_per_s: float
    ttft_p50_ms: float
    ttft_p99_ms: float
    itl_p50_ms: float
    itl_p99_ms: float
    goodput_rps: float | None
    meets_goals: bool


@dataclass(frozen=True)
class TokenConfig:
    """A measured config: its label, capacity and levels (by offered rate)."""

    trial_number: int
    label: str
    capacity_rps: float
    levels: tuple[TokenLevel, ...]


@dataclass(frozen=True)
class TokenStory:
    """Every measured config of a generative sweep, and the token goals."""

    configs: tuple[TokenConfig, ...]
    ttft_goal_ms: float | None
    itl_goal_ms: float | None


def token_story(trials: Sequence[TrialRecord]) -> TokenStory | None:
    """The token streams of every complete trial with a capacity search (None: no trial
    measured token streams)."""
    configs: list[TokenConfig] = []
    ttft_goal = itl_goal = None
    for r in trials:
        capacity = r.measurement.capacity if r.measurement is not None else None
        if not r.complete or capacity is None:
            continue
        levels = [
            TokenLevel(
                offered_rps=float(p.target),
                throughput_rps=float(p.throughput_rps),
                output_tokens_per_s=p.tokens.output_tokens_per_s,
                ttft_p50_ms=p.tokens.ttft_p50_ms,
                ttft_p99_ms=p.tokens.ttft_p99_ms,
                itl_p50_ms=p.tokens.itl_p50_ms,
                itl_p99_ms=p.tokens.itl_p99_ms,
                goodput_rps=p.tokens.goodput_rps,
                meets_goals=meets_goals(p, capacity.goals)[0],
            )
            for p in capacity.points
            if p.tokens is not None
        ]
        if not levels:
            continue
        ttft_goal = ttft_goal or capacity.goals.ttft_p99_ms
        itl_goal = itl_goal or capacity.goals.itl_p99_ms
        configs.append(
            TokenConfig(
                trial_number=r.number,
                label=r.config.label(),
                capacity_rps=capacity.capacity_rps,
                levels=tuple(sorted(levels, key=lambda level: level.offered_rps)),
            )
        )
    if not configs:
        return None
    return TokenStory(tuple(configs), ttft_goal, itl_goal)


def tokens_figure(story: TokenStory | None) -> Figure | None:
    """Tokens/s, TTFT p99 and ITL p99 against the offered rate, one line per config (the
    baseline dashed), goals as horizontal lines, missed levels crossed."""
    if story is None:
        return None
    return styled(lambda: _draw(story))


def _draw(story: TokenStory) -> Figure:
    fig, axes = new_figure(11.0, 3.4, ncols=3)
    panels = (
        ("output tokens/s", lambda level: level.output_tokens_per_s, None),
        ("TTFT p99 (ms)", lambda level: level.ttft_p99_ms, story.ttft_goal_ms),
        ("ITL p99 (ms)", lambda level: level.itl_p99_ms, story.itl_goal_ms),
    )
    for ax, (title, value, goal) in zip(axes, panels, strict=True):
        for c in story.configs:
            xs = [level.offered_rps for level in c.levels]
            style = "--" if c.trial_number < 0 else "-"
            name = "baseline" if c.trial_number < 0 else f"#{c.trial_number} {c.label}"
            ax.plot(xs, [value(level) for level in c.levels], style, marker="o", ms=3, label=name)
            bad = [level for level in c.levels if not level.meets_goals]
            ax.scatter(
                [level.offered_rps for level in bad],
                [value(level) for level in bad],
                marker="x",
                color="#c0392b",
                s=25,
                zorder=5,
            )
        if goal is not None:
            ax.axhline(goal, color="#c0392b", linewidth=0.8, linestyle=":")
        ax.set_title(title)
        ax.set_xlabel("offered req/s")
    axes[0].legend(fontsize=7)
    alt = "Token streams per config against the offered rate: " + "; ".join(
        f"{c.label}: capacity {c.capacity_rps:.1f} req/s" for c in story.configs
    )
    return Figure("tokens", to_svg(fig, "tokens"), alt)
