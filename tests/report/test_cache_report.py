"""A run measured with response-cache hits says so beside every throughput figure.

The planted run's records are given server views with cache counts (the best config 90 % hits,
every other config 0 %), then the report is built and rendered: labels, the verdict's warning,
the HTML. A run without cache lookups looks exactly as before.
"""

from __future__ import annotations

import dataclasses
import html
import json
import re
from pathlib import Path

import pytest

from analyzer.measure.measurement import Measurement, ServerView
from analyzer.report import build_record, load_run
from analyzer.report.points import cache_warning, with_hits
from analyzer.report.render import render_report
from analyzer.rundir.measurements import CapacityMeasurement
from analyzer.rundir.trial_record import TrialRecord
from analyzer.target.server_stats import cache_hits_text


def _cached(m: Measurement | None, hits: int, misses: int) -> Measurement | None:
    if m is None:
        return None
    base = m.server or ServerView()
    return dataclasses.replace(
        m, server=dataclasses.replace(base, cache_hit_count=hits, cache_miss_count=misses)
    )


def _with_cache(record: TrialRecord, hits: int, misses: int) -> TrialRecord:
    if not isinstance(record.measurement, CapacityMeasurement):
        return record
    result = record.measurement.result
    result = dataclasses.replace(
        result,
        best=_cached(result.best, hits, misses),
        points=tuple(_cached(p, hits, misses) for p in result.points),  # type: ignore[misc]
    )
    return dataclasses.replace(record, measurement=CapacityMeasurement(result))


@pytest.fixture(scope="module")
def cached_run(planted_run: Path):  # type: ignore[no-untyped-def]
    run = load_run(planted_run)
    best = run.summary.best
    assert best is not None
    trials = tuple(
        _with_cache(r, 900, 100) if r.number == best.trial_number else _with_cache(r, 0, 1000)
        for r in run.trials
    )
    return dataclasses.replace(run, trials=trials), best.trial_number


def test_hit_ratio_text() -> None:
    assert cache_hits_text(0.9) == "90 % cache hits"
    assert cache_hits_text(0.0) == "0 % cache hits"
    assert cache_hits_text(0.001) == "<1 % cache hits"
    assert cache_hits_text(0.999) == ">99 % cache hits"
    assert cache_hits_text(None) == ""
    assert with_hits("mbs=8", None) == "mbs=8"
    assert with_hits("mbs=8", 0.5) == "mbs=8 · 50 % cache hits"


def test_every_throughput_label_carries_its_hit_ratio(cached_run) -> None:  # type: ignore[no-untyped-def]
    run, best_number = cached_run
    record = build_record(run)
    assert record.verdict.best is not None
    assert record.verdict.best.label.endswith(" · 90 % cache hits")
    assert record.verdict.baseline is not None
    assert record.verdict.baseline.label.endswith(" · 0 % cache hits")
    for t in record.trials:
        if t.state == "complete":
            wanted = "90 %" if t.number == best_number else "0 %"
            assert t.label.endswith(f" · {wanted} cache hits"), t.label
    for s in record.time_series:
        if s.source == "search":
            assert "cache hits" in s.label, s.label
    for row in record.validation:
        assert "cache hits" in row.label, row.label
    warning = [w for w in record.verdict.warnings if "response-cache hits" in w]
    assert warning == [
        "Throughputs include response-cache hits (0-90 % cache hits): a hit is answered "
        "without running the model, so a figure holds only for traffic that repeats as this "
        "run's did; each config's label gives its hit ratio."
    ]


def test_the_page_shows_the_ratio_beside_the_best_throughput(cached_run) -> None:  # type: ignore[no-untyped-def]
    run, _ = cached_run
    page = render_report(build_record(run))
    data = json.loads(
        re.search(r'id="perfsweep-data">(.*?)</script>', page, re.S).group(1)  # type: ignore[union-attr]
    )
    assert data["verdict"]["best"]["label"].endswith("90 % cache hits")
    text = html.unescape(re.sub(r"<[^>]+>", " ", page))
    words = " ".join(text.split())
    # The Best card: the figure, its latencies, then the config with its hit ratio.
    assert re.search(
        r"Best [\d.]+ req/s p50 [^·]{0,80}· p99 [^·]{0,80}trial \d+: [^·]*· 90 % cache hits", words
    )


def test_a_run_without_cache_lookups_is_unchanged(planted_run: Path) -> None:
    record = build_record(load_run(planted_run))
    assert not any("cache hits" in t.label for t in record.trials)
    assert not any("cache" in w for w in record.verdict.warnings)
    assert cache_warning(load_run(planted_run).trials) is None


def test_the_console_prints_the_ratio_beside_a_cached_throughput(cached_run) -> None:  # type: ignore[no-untyped-def]
    from analyzer.commands.run_view import _rps

    run, best_number = cached_run
    by_number = {r.number: r for r in run.trials}
    best = by_number[best_number]
    assert _rps(best) == f"{best.throughput_rps:.1f} (90 % cache hits)"
    other = next(r for r in run.trials if r.number != best_number and r.complete)
    assert _rps(other, " req/s") == f"{other.throughput_rps:.1f} req/s (0 % cache hits)"
    plain = dataclasses.replace(best, measurement=None)
    assert _rps(plain) == f"{best.throughput_rps:.1f}"  # no lookups recorded: no ratio
