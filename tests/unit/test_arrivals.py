"""Arrival processes: each one's rate and gap statistics over a seeded run, the shared stream,
the short form, trace files, and the fit printed for a trace."""

from __future__ import annotations

import itertools
import json
import math
import random
import statistics
from pathlib import Path

import pytest

from analyzer.config.traces import read_trace
from analyzer.config.traffic import TrafficSection
from analyzer.errors import InputError
from analyzer.measure.arrivals import (
    CONSTANT,
    POISSON,
    Arrival,
    ArrivalProcess,
    Trace,
    fit_gaps,
    parse_arrival,
)
from analyzer.measure.goals import GeneratorLimits, generator_problems

RATE = 200.0
N = 40_000


def _gaps(text: str, seed: int = 1, n: int = N) -> list[float]:
    return list(itertools.islice(parse_arrival(text).gaps(RATE, seed), n))


def _cv(gaps: list[float]) -> float:
    return statistics.stdev(gaps) / statistics.fmean(gaps)


@pytest.mark.parametrize(
    ("text", "cv"),
    [("constant", 0.0), ("poisson", 1.0), ("gamma:cv=0.5", 0.5), ("gamma:cv=2", 2.0)],
)
def test_renewal_processes_have_their_rate_and_cv(text: str, cv: float) -> None:
    gaps = _gaps(text)
    # Sampling error of a mean of N gaps with this CV: cv / sqrt(N) (0.5 % at cv 1); 4 sigma.
    assert len(gaps) / sum(gaps) == pytest.approx(RATE, rel=4 * max(cv, 0.01) / math.sqrt(N))
    # The CV's own sampling error grows with the tail (gamma cv 2: ~2 %); 10 % holds easily.
    assert _cv(gaps) == pytest.approx(cv, abs=0.1 * max(cv, 0.01))
    assert parse_arrival(text).gap_cv == pytest.approx(cv)


def _rate_over(process: ArrivalProcess, seconds: float, seed: int) -> float:
    for count, now in enumerate(itertools.accumulate(process.gaps(RATE, seed))):
        if now > seconds:
            return count / seconds
    raise AssertionError("unreachable: the stream is endless")


@pytest.mark.parametrize(
    "text",
    [
        "mmpp:4@0.5,0.25@2",
        "mmpp:3@1,0@1",  # on/off: nothing is sent in the off state
        "ramp:start=0.5,end=1.5,period_s=10",
        "diurnal:amplitude=0.8,period_s=10",
    ],
)
def test_modulated_processes_keep_the_mean_rate(text: str) -> None:
    process = parse_arrival(text)
    # 500 s a seed (50 periods, 200 mmpp cycles), 8 seeds: the mean of the 8 rates is within
    # 3 % of the asked rate (its standard error here is below 1 %).
    rates = [_rate_over(process, 500.0, seed) for seed in range(8)]
    assert statistics.fmean(rates) == pytest.approx(RATE, rel=0.03)


def test_mmpp_sends_in_bursts() -> None:
    gaps = _gaps("mmpp:4@0.5,0.25@2")
    fit = fit_gaps(gaps)
    # Poisson's counts per second have dispersion 1; these bursts last half a second at 4x.
    assert fit.cv > 1.5
    assert fit.dispersion_1s is not None and fit.dispersion_1s > 50
    assert "mmpp" in fit.describe()
    # The off state of an on/off process sends nothing: no send falls in it.
    times = list(itertools.accumulate(_gaps("mmpp:3@1,0@1", n=2000)))
    longest = max(b - a for a, b in itertools.pairwise(times))
    assert longest > 1.0  # a whole off period (mean 1 s) without a send


def test_ramp_and_diurnal_follow_their_rate_over_the_period() -> None:
    times = list(itertools.accumulate(_gaps("ramp:start=0.5,end=1.5,period_s=10", n=20_000)))
    first = sum(1 for t in times if (t % 10) < 5)
    second = len(times) - first
    # The rate climbs from 0.5x to 1.5x: the second half of each period has 1.25 / 0.75 the sends.
    assert second / first == pytest.approx(1.25 / 0.75, rel=0.05)
    times = list(itertools.accumulate(_gaps("diurnal:amplitude=0.5,period_s=10", n=20_000)))
    top = sum(1 for t in times if (t % 10) < 5)  # sin > 0 in the first half
    # Mean of 1 + 0.5 sin over each half: 1 +/- 1/pi.
    assert top / (len(times) - top) == pytest.approx(
        (1 + 1 / math.pi) / (1 - 1 / math.pi), rel=0.05
    )


def test_bursts_keep_their_seconds_and_scale_their_counts() -> None:
    """Common random numbers: at twice the rate the same bursts carry twice the requests."""
    process = parse_arrival("mmpp:4@0.5,0.25@2")
    for seed in range(3):
        slow = list(itertools.accumulate(itertools.islice(process.gaps(100, seed), 2000)))
        fast = list(itertools.accumulate(itertools.islice(process.gaps(200, seed), 4000)))
        horizon = min(slow[-1], fast[-1])
        in_slow = [sum(1 for t in slow if s <= t < s + 1) for s in range(int(horizon))]
        in_fast = [sum(1 for t in fast if s <= t < s + 1) for s in range(int(horizon))]
        # Second by second the counts rise and fall together.
        assert statistics.correlation(in_slow, in_fast) > 0.9


def test_processes_share_one_stream() -> None:
    """n dispatchers each send every n-th request of the one stream: together, the stream."""
    for text in ("poisson", "mmpp:4@0.5,0.25@2", "constant"):
        process = parse_arrival(text)
        whole = list(itertools.islice(process.send_times(RATE, 7), 3000))
        parts = [list(itertools.islice(process.send_times(RATE, 7, k, 3), 1000)) for k in range(3)]
        assert sorted(itertools.chain(*parts)) == pytest.approx(whole)
    with pytest.raises(InputError, match="process 3 of 3"):
        POISSON.send_times(RATE, 0, 3, 3)


def test_the_same_seed_gives_the_same_stream() -> None:
    for text in ("poisson", "gamma:cv=2", "mmpp:4@0.5,0.25@2", "diurnal:amplitude=0.5,period_s=5"):
        assert _gaps(text, seed=3, n=500) == _gaps(text, seed=3, n=500)
        assert _gaps(text, seed=3, n=500) != _gaps(text, seed=4, n=500)


@pytest.mark.parametrize(
    "text",
    [
        "poisson",
        "constant",
        "gamma:cv=2",
        "mmpp:4@0.5,0.25@2",
        "mmpp:3@1,0@1,1@0.5",
        "ramp:start=0.5,end=1.5,period_s=60",
        "diurnal:amplitude=0.5,period_s=60",
    ],
)
def test_the_short_form_round_trips(text: str) -> None:
    process = parse_arrival(text)
    assert parse_arrival(process.to_text()) == process
    assert ArrivalProcess.from_dict(process.to_dict()) == process
    assert ArrivalProcess.from_dict(json.loads(json.dumps(process.to_dict()))) == process
    assert process.describe()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("bursty", "unknown arrival process 'bursty'"),
        ("gamma", "gamma needs its cv"),
        ("gamma:cv=0", "cv > 0"),
        ("gamma:shape=2", "its parameters: cv"),
        ("poisson:cv=2", "takes no parameters"),
        ("mmpp:4@0.5", "at least two states"),
        ("mmpp:4,1", "rate@sojourn_s"),
        ("mmpp:0@1,0@2", "positive rate"),
        ("mmpp:4@0,1@1", "sojourn positive"),
        ("diurnal:amplitude=1", "amplitude < 1"),
        ("ramp:period_s=0", "positive period_s"),
        ("gamma:cv=abc", "'abc' is not a number"),
        ("gamma:cv=nan", "not a finite number"),
        ("trace", "--trace FILE"),
    ],
)
def test_bad_arrivals_are_refused_with_what_to_write(text: str, message: str) -> None:
    with pytest.raises(InputError, match=message):
        parse_arrival(text)


def test_a_trace_is_replayed_in_shape_at_any_rate() -> None:
    gaps = (0.01, 0.03, 0.0, 0.06)  # 4 gaps over 0.1 s: 40 req/s recorded
    process = parse_arrival("trace", Trace(gaps, "t.csv"))
    assert process.trace is not None and process.trace.rate_rps == pytest.approx(40.0)
    assert list(itertools.islice(process.gaps(40.0, 0), 8)) == pytest.approx(gaps * 2)  # looped
    # At twice the rate: the same shape in half the time.
    assert list(itertools.islice(process.gaps(80.0, 0), 4)) == pytest.approx([g / 2 for g in gaps])
    assert process.describe() == "trace t.csv (4 requests over 0.1 s, 40 req/s recorded)"
    assert ArrivalProcess.from_dict(process.to_dict()) == process


def test_trace_files_in_every_format(tmp_path: Path) -> None:
    rng = random.Random(5)
    stamps = list(itertools.accumulate(rng.expovariate(100.0) for _ in range(500)))
    expected = [b - a for a, b in itertools.pairwise(sorted(stamps))]

    csv = tmp_path / "a.csv"
    csv.write_text("timestamp_ms,model\n" + "".join(f"{t * 1e3:.6f},m\n" for t in stamps))
    jsonl = tmp_path / "a.jsonl"
    jsonl.write_text(
        "".join(json.dumps({"ts": 1.7e9 + t, "id": i}) + "\n" for i, t in enumerate(stamps))
    )
    bare = tmp_path / "b.csv"  # no header: the first column, seconds
    bare.write_text("".join(f"{t:.9f}\n" for t in reversed(stamps)))  # unsorted: sorted on read
    intervals = tmp_path / "intervals.txt"  # perf_analyzer: one gap a line, microseconds
    intervals.write_text("".join(f"{g * 1e6:.3f}\n" for g in expected))
    for path in (csv, jsonl, bare, intervals):
        trace = read_trace(path)
        assert trace.gaps_s == pytest.approx(expected, abs=2e-6), path.name
        assert trace.source == path.name
    # --trace-unit overrides the format's unit.
    assert read_trace(bare, "ms").gaps_s == pytest.approx([g / 1e3 for g in expected], abs=1e-9)


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("e.csv", "", "is empty"),
        ("h.csv", "when,model\n1,m\n", "no time column"),
        ("x.csv", "t\n1\nabc\n", "x.csv:3: no number"),
        ("j.jsonl", '{"t": 1}\n[1]\n', "j.jsonl:2: each line must be a JSON object"),
        ("k.jsonl", '{"t": 1}\n{"t": "2"}\n', "'t' must be a number"),
        ("one.csv", "t\n1\n", "at least 2 requests"),
        ("same.csv", "t\n1\n1\n", "all its requests are at one instant"),
        ("i.txt", "100\nfast\n", "i.txt:2: 'fast' is not a number"),
        ("p.csv", "t,payload\n0,1\n1,-2\n", "p.csv:3: payload must be the index"),
        ("q.jsonl", '{"t": 0, "payload": 0}\n{"t": 1}\n', "q.jsonl:2: payload must be"),
    ],
)
def test_bad_trace_files_say_where(tmp_path: Path, name: str, content: str, message: str) -> None:
    path = tmp_path / name
    path.write_text(content)
    with pytest.raises(InputError, match=message):
        read_trace(path)


def test_a_trace_may_say_which_payload_each_request_sent(tmp_path: Path) -> None:
    # Written out of order (two servers' logs): each payload stays with its request's time.
    csv = tmp_path / "p.csv"
    csv.write_text("t,payload\n0.3,7\n0.0,4\n0.1,5\n0.2,6\n")
    jsonl = tmp_path / "p.jsonl"
    jsonl.write_text("".join(json.dumps({"t": t, "payload": p}) + "\n" for t, p in
                             ((0.0, 4), (0.1, 5), (0.2, 6), (0.3, 7))))  # fmt: skip
    for path in (csv, jsonl):
        trace = read_trace(path)
        # The replay's k-th send falls at request k + 1's time and carries its payload.
        assert trace.gaps_s == pytest.approx((0.1, 0.1, 0.1)) and trace.payloads == (5, 6, 7)
        assert [trace.payload(k) for k in range(5)] == [5, 6, 7, 5, 6]  # looped
        process = parse_arrival("trace", trace)
        assert ArrivalProcess.from_dict(process.to_dict()) == process
    # Each process of a shared stream knows its sends' places in it.
    process = parse_arrival("trace", read_trace(csv))
    assert [i for i, _ in itertools.islice(process.indexed_send_times(10.0, 0, 1, 2), 3)] == [
        1,
        3,
        5,
    ]
    assert read_trace(tmp_path / "p.csv").payload(0) == 5
    without = tmp_path / "plain.csv"
    without.write_text("t\n0\n1\n2\n")
    assert read_trace(without).payload(0) is None


def test_a_missing_trace_file_and_a_bad_unit(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="cannot read trace"):
        read_trace(tmp_path / "none.csv")
    with pytest.raises(InputError, match="--trace-unit must be"):
        read_trace(tmp_path / "none.csv", "minutes")


def test_the_fit_names_the_nearest_process() -> None:
    assert fit_gaps(_gaps("poisson")).closest() == "poisson"
    assert fit_gaps(_gaps("constant")).closest() == "constant"
    assert fit_gaps(_gaps("gamma:cv=2")).closest() == "gamma:cv=2"
    poisson = fit_gaps(_gaps("poisson"))
    assert poisson.burstiness == pytest.approx(1.0, abs=0.05)
    assert "(its rate swings" not in poisson.describe()


def test_the_scenario_takes_a_process_or_a_trace(tmp_path: Path) -> None:
    assert TrafficSection().arrival_process() == POISSON
    assert TrafficSection(arrival="gamma:cv=2").arrival_process() == parse_arrival("gamma:cv=2")
    with pytest.raises(ValueError, match=r"traffic\.arrival: unknown arrival process"):
        TrafficSection(arrival="bursty")
    with pytest.raises(ValueError, match=r"set traffic\.trace"):
        TrafficSection(arrival="trace")
    path = tmp_path / "t.csv"
    path.write_text("t\n0\n0.5\n0.75\n1\n")
    section = TrafficSection(trace=path)
    assert section.arrival == "trace" and section.trace_sha256
    process = section.arrival_process()
    assert process.kind is Arrival.TRACE and process.trace is not None
    assert process.trace.gaps_s == pytest.approx((0.5, 0.25, 0.25))
    with pytest.raises(ValueError, match="cannot be shaped as 'gamma:cv=2' too"):
        TrafficSection(trace=path, arrival="gamma:cv=2")
    # A recorded scenario whose trace changed since is refused.
    recorded = section.trace_sha256
    path.write_text("t\n0\n1\n")
    with pytest.raises(ValueError, match="changed since this scenario was recorded"):
        TrafficSection(trace=path, trace_sha256=recorded)
    with pytest.raises(ValueError, match="no such file"):
        TrafficSection(trace=tmp_path / "gone.csv")


def test_the_scenario_may_list_several_shapes(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text("t\n0\n0.5\n0.75\n1\n")
    both = TrafficSection(arrival=["poisson", "trace"], trace=path)
    assert both.shapes == ("poisson", "trace")
    poisson, trace = both.arrival_processes()
    assert poisson == POISSON and trace.kind is Arrival.TRACE
    # One command measures one shape, and says so.
    with pytest.raises(InputError, match=r"lists 2 shapes .* only perfsweep run measures each"):
        both.arrival_process()
    assert TrafficSection(arrival=["gamma:cv=2"]).arrival == "gamma:cv=2"  # a list of one
    with pytest.raises(ValueError, match="each shape once"):
        TrafficSection(arrival=["poisson", "poisson"])
    with pytest.raises(ValueError, match=r"set traffic\.trace"):
        TrafficSection(arrival=["poisson", "trace"])
    with pytest.raises(ValueError, match="or list 'trace' among its shapes"):
        TrafficSection(arrival=["poisson", "constant"], trace=path)
    with pytest.raises(ValueError, match=r"several shapes need traffic\.mode = 'rate'"):
        TrafficSection(arrival=["poisson", "constant"], mode="concurrency")


def test_the_offered_count_rule_knows_each_process() -> None:
    limits = GeneratorLimits()
    # gamma cv 3: counts vary 3x as much as Poisson's; a 12 % shortfall of 1,000 is 3.8 sigma
    # of Poisson but 1.3 sigma of this process.
    assert generator_problems(limits, True, 10.0, 880, 0, 1000.0, POISSON) != []
    assert generator_problems(limits, True, 10.0, 880, 0, 1000.0, parse_arrival("gamma:cv=3")) == []
    # A burst shape's count in a window swings with its bursts: only the lag rule judges it.
    bursty = parse_arrival("mmpp:4@0.5,0.25@2")
    assert generator_problems(limits, True, 10.0, 500, 0, 1000.0, bursty) == []
    assert generator_problems(limits, True, 10.0, 500, 50, 1000.0, bursty) != []
    assert generator_problems(limits, True, 10.0, 992, 0, 1000.0, CONSTANT) == []
