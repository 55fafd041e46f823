"""Generative requests, pure: length distributions, the JSONL dataset and trace readers, and the
token-stream figures (TTFT, ITL, tokens/s, goodput) from planted timestamps."""

from __future__ import annotations

import math
import statistics
import time
from pathlib import Path

import pytest

from analyzer.config.traces import read_trace
from analyzer.errors import InputError
from analyzer.measure.arrivals import Arrival, ArrivalProcess
from analyzer.measure.goals import meets_goals
from analyzer.measure.lengths import (
    GenRequest,
    Lengths,
    parse_dataset,
    parse_length,
    prompt_ids,
    prompt_words,
)
from analyzer.measure.measurement import Measurement, goals_dict
from analyzer.measure.specs import Goals, LoadMode
from analyzer.measure.tokens import StreamRecord, TokenTally

# ---- lengths ------------------------------------------------------------------------------------


def test_fixed_length_is_exact_and_round_trips() -> None:
    dist = parse_length("512")
    lengths = Lengths(dist, parse_length("64", "--output-tokens"))
    drawn = lengths.draw(seed=3, count=50)
    assert {r.input_tokens for r in drawn} == {512}
    assert {r.output_tokens for r in drawn} == {64}
    assert Lengths.from_dict(lengths.to_dict()) == lengths


def test_uniform_stays_within_its_ends_and_reaches_both() -> None:
    lengths = Lengths(parse_length("uniform:10,20"), parse_length("uniform:1,3"))
    drawn = lengths.draw(seed=1, count=2000)
    inputs = {r.input_tokens for r in drawn}
    assert min(inputs) == 10 and max(inputs) == 20
    assert {r.output_tokens for r in drawn} == {1, 2, 3}


def test_lognormal_has_the_asked_mean_and_spread() -> None:
    lengths = Lengths(parse_length("lognormal:mean=512,sd=256"))
    values = [r.input_tokens for r in lengths.draw(seed=7, count=4096)]
    assert statistics.fmean(values) == pytest.approx(512, rel=0.05)
    assert statistics.stdev(values) == pytest.approx(256, rel=0.1)
    assert min(values) >= 1


def test_draws_are_seeded() -> None:
    lengths = Lengths(parse_length("lognormal:mean=100,sd=50"), parse_length("uniform:1,100"))
    assert lengths.draw(5) == lengths.draw(5)
    assert lengths.draw(5) != lengths.draw(6)


@pytest.mark.parametrize(
    "text", ["0", "1.5", "uniform:5", "uniform:9,3", "lognormal:mean=5", "gauss:1,2", "many"]
)
def test_bad_lengths_name_the_forms(text: str) -> None:
    with pytest.raises(InputError, match="--input-tokens"):
        parse_length(text)


def test_prompts_have_their_lengths_and_differ() -> None:
    assert len(prompt_words(37, salt=1).split()) == 37
    assert prompt_words(5, 1) != prompt_words(5, 2)
    ids = prompt_ids(9, salt=4)
    assert len(ids) == 9 and all(100 <= i < 1000 for i in ids)


# ---- the dataset --------------------------------------------------------------------------------


def test_dataset_takes_prompts_or_input_tokens() -> None:
    text = (
        '{"prompt": "one two three", "output_tokens": 4}\n'
        "\n"
        '{"input_tokens": 300, "output_tokens": 20}\n'
    )
    assert parse_dataset(text, "d.jsonl") == (
        GenRequest(3, 4, "one two three"),
        GenRequest(300, 20, None),
    )
    lengths = Lengths(dataset=parse_dataset(text, "d.jsonl"), source="d.jsonl")
    assert lengths.draw(seed=0) == list(lengths.dataset)
    assert Lengths.from_dict(lengths.to_dict()) == lengths


@pytest.mark.parametrize(
    ("line", "match"),
    [
        ('{"output_tokens": 4}', r"d\.jsonl:2: no input length"),
        ('{"prompt": "a b"}', r"d\.jsonl:2: no 'output_tokens'"),
        ('{"input_tokens": 0, "output_tokens": 4}', r"d\.jsonl:2: 'input_tokens' must be >= 1"),
        ('{"input_tokens": 5, "output_tokens": "x"}', r"d\.jsonl:2: 'output_tokens' must be"),
        ("[1, 2]", r"d\.jsonl:2: each line must be a JSON object"),
        ("{nope", r"d\.jsonl:2: not JSON"),
    ],
)
def test_a_dataset_line_without_lengths_is_named(line: str, match: str) -> None:
    text = '{"input_tokens": 5, "output_tokens": 5}\n' + line + "\n"
    with pytest.raises(InputError, match=match):
        parse_dataset(text, "d.jsonl")


# ---- traces with lengths -----------------------------------------------------------------------


def test_mooncake_trace_gives_each_send_its_lengths(tmp_path: Path) -> None:
    path = tmp_path / "mooncake.csv"
    # Out of order on purpose: the replay sorts by time and keeps each row's lengths.
    path.write_text("timestamp,input_length,output_length\n0,100,10\n2000,300,30\n1000,200,20\n")
    trace = read_trace(path, unit="ms")
    assert trace.gaps_s == (1.0, 1.0)
    assert trace.lengths == ((200, 20), (300, 30))
    assert trace.length(0) == (200, 20) and trace.length(3) == (300, 30)
    # The lengths travel with the arrival process to the generator processes.
    process = ArrivalProcess.from_dict(ArrivalProcess(Arrival.TRACE, trace=trace).to_dict())
    assert process.trace is not None and process.trace.lengths == trace.lengths


def test_jsonl_trace_with_token_columns(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text(
        '{"timestamp": 0, "input_tokens": 7, "output_tokens": 3}\n'
        '{"timestamp": 0.5, "input_tokens": 8, "output_tokens": 4}\n'
    )
    trace = read_trace(path)
    assert trace.lengths == ((8, 4),)


def test_trace_with_one_length_column_or_a_bad_length_is_refused(tmp_path: Path) -> None:
    half = tmp_path / "half.csv"
    half.write_text("timestamp,input_length\n0,5\n1,6\n")
    with pytest.raises(InputError, match="give both columns"):
        read_trace(half)
    bad = tmp_path / "bad.csv"
    bad.write_text("timestamp,input_length,output_length\n0,5,5\n1,6,0\n")
    with pytest.raises(InputError, match=r"bad\.csv:3: output_length must be"):
        read_trace(bad)


# ---- token streams from planted timestamps -----------------------------------------------------


def _record(intended: float, first: float, gap: float, tokens: int, *, failed=False):
    record = StreamRecord(intended, intended + 0.001, input_tokens=10)
    for i in range(tokens):
        record.token(first + i * gap)
    record.end = first + (tokens - 1) * gap + 0.001
    record.failed = failed
    return record


def test_ttft_is_timed_from_the_intended_send_and_itl_from_token_gaps() -> None:
    record = _record(intended=10.0, first=10.25, gap=0.02, tokens=5)
    assert record.ttft_s == pytest.approx(0.25)
    assert record.gaps_s() == pytest.approx([0.02] * 4)
    assert record.mean_itl_s == pytest.approx(0.02)
    assert record.output_tokens == 5


def test_a_chunk_of_several_tokens_spreads_its_gap() -> None:
    record = StreamRecord(0.0, 0.0)
    record.token(1.0, 2)  # the first chunk brings two tokens
    record.token(1.3, 3)
    assert record.gaps_s() == pytest.approx([0.0, 0.1, 0.1, 0.1])
    assert record.mean_itl_s == pytest.approx(0.3 / 4)


def test_server_usage_corrects_the_token_count() -> None:
    record = _record(0.0, 0.1, 0.01, tokens=3)
    record.usage_tokens = 7
    assert record.output_tokens == 7
    assert record.mean_itl_s == pytest.approx(0.02 / 6)


def test_tally_percentiles_tokens_per_second_and_goodput() -> None:
    tally = TokenTally()
    # 90 fast requests (TTFT 50 ms, ITL 10 ms), 10 slow ones (TTFT 400 ms, ITL 40 ms), 8 tokens.
    for i in range(90):
        r = _record(i, i + 0.05, 0.010, 8)
        tally.add_record(r, r.end - r.intended)
    for i in range(10):
        r = _record(100 + i, 100 + i + 0.4, 0.040, 8)
        tally.add_record(r, r.end - r.intended)
    # One failed request: its tokens count, it is never good.
    r = _record(200, 200.05, 0.010, 3, failed=True)
    tally.add_record(r, r.end - r.intended)
    stats = tally.summary(duration_s=10.0, ttft_ms=100.0, itl_ms=20.0)
    assert stats.ttft_p50_ms == pytest.approx(50, rel=0.01)
    assert stats.ttft_p99_ms == pytest.approx(400, rel=0.01)
    assert stats.itl_p50_ms == pytest.approx(10, rel=0.01)
    assert stats.itl_p99_ms == pytest.approx(40, rel=0.01)
    assert stats.output_tokens == 100 * 8 + 3
    assert stats.output_tokens_per_s == pytest.approx(80.3)
    assert stats.streams == 101 and stats.failed_streams == 1
    assert stats.good_count == 90 and stats.goodput_rps == pytest.approx(9.0)
    assert tally.summary(10.0).goodput_rps is None  # no goal, no goodput


def test_tally_crosses_processes_exactly() -> None:
    a, b = TokenTally(), TokenTally()
    for i, tally in enumerate((a, b, a)):
        r = _record(i, i + 0.1 * (i + 1), 0.01, 4)
        tally.add_record(r, 1.0)
    merged = TokenTally.merge([a.encode(), b.encode(), {}])
    whole = TokenTally()
    whole.add(a)
    whole.add(b)
    for t in (merged, whole):
        assert t.streams == 3 and t.output_tokens == 12
        assert t.ttft.get_total_count() == 3 and t.itl.get_total_count() == 9
        assert t.good_count(ttft_ms=150.0) == 1
        assert t.good_count(ttft_ms=250.0) == 2


def test_streams_still_waiting_for_a_first_token_count_at_their_wait_so_far() -> None:
    from analyzer.load.recorder import Recorder, Tick

    recorder = Recorder()
    now = time.perf_counter()
    queued = StreamRecord(now - 2.0, now - 1.5)  # sent 2 s ago (1.5 s after its schedule)
    started = StreamRecord(now - 3.0, now - 3.0)
    started.token(now - 2.9)  # its TTFT is known: 100 ms; it counts when it finishes
    for r in (queued, started):
        recorder.stream_started(r)
    tick = Tick.merge([recorder.take_tick()])
    assert len(tick.waiting) == 2  # one stream: (since intended, since sent)
    assert tick.waiting[0] >= 2.0 and 1.5 <= tick.waiting[1] < 2.0
    # A later tick's gauge replaces an earlier one's: a level ends with its last tick's.
    recorder.stream_done(queued, 2.5, 2.0, None)
    level = Tick()
    level.add(tick)
    level.add(recorder.take_local_tick())
    assert len(level.waiting) == 0
    # The level's tally: the waiting stream in the TTFT percentiles at its wait so far.
    tally = TokenTally()
    r = _record(0, 0.05, 0.01, 4)
    tally.add_record(r, 0.1)
    tally.add_waiting(tick.waiting)
    stats = tally.summary(1.0, ttft_ms=1000.0)
    assert stats.streams == 1 and stats.ttft_waiting == 1
    assert stats.ttft_p99_ms >= 2000.0  # over the goal: the queue behind the one that finished
    assert stats.good_count == 1  # goodput counts finished requests only


# ---- goals -------------------------------------------------------------------------------------


def _measurement(ttft_p99: float, itl_p99: float) -> Measurement:
    tally = TokenTally()
    r = _record(0, ttft_p99 / 1000, itl_p99 / 1000, 3)
    tally.add_record(r, 0.5)
    return Measurement(
        mode=LoadMode.REQUEST_RATE,
        target=1.0,
        throughput_rps=1.0,
        p50_ms=500,
        p90_ms=500,
        p95_ms=500,
        p99_ms=500,
        request_count=1,
        error_count=0,
        stable=True,
        valid=True,
        send_lag_p99_ms=0.0,
        server=None,
        tokens=tally.summary(1.0),
    )


def test_token_goals_judge_ttft_and_itl() -> None:
    goals = Goals(math.inf, ttft_p99_ms=100.0, itl_p99_ms=20.0)
    ok, why = meets_goals(_measurement(50, 10), goals)
    assert ok and "TTFT p99 <= 100 ms" in why
    ok, why = meets_goals(_measurement(150, 10), goals)
    assert not ok and why.startswith("TTFT p99 150")
    ok, why = meets_goals(_measurement(50, 30), goals)
    assert not ok and why.startswith("ITL p99 30")
    # An end-to-end goal still applies beside them.
    ok, why = meets_goals(_measurement(50, 10), Goals(100.0, ttft_p99_ms=100.0))
    assert not ok and "p99 500" in why


def test_token_goals_round_trip_and_old_goals_read_as_before() -> None:
    import json

    goals = Goals(math.inf, ttft_p99_ms=100.0, itl_p99_ms=20.0)
    assert Goals(**goals_dict(goals)) == goals
    # Strict JSON (no Infinity) and back.
    text = json.dumps(goals_dict(goals), allow_nan=False)
    assert Goals(**json.loads(text)) == goals
    assert "ttft_p99_ms" not in goals_dict(Goals(50.0))
    m = _measurement(50, 10)
    assert Measurement.from_dict(m.to_dict()) == m
    assert "tokens" not in Measurement.from_dict({**m.to_dict(), "tokens": None}).to_dict()


def test_bad_token_goal_is_refused() -> None:
    with pytest.raises(InputError, match="TTFT p99 goal must be positive"):
        Goals(math.inf, ttft_p99_ms=0.0)


def test_a_sweep_refuses_a_decoupled_model_and_names_perfsweep_load() -> None:
    from analyzer.target.protocol import untunable_reason
    from tests.support.stream_model import stream_model_config

    reason = untunable_reason(stream_model_config("llm"))
    assert reason is not None and "is decoupled" in reason and "perfsweep load" in reason
    assert untunable_reason(stream_model_config("llm", decoupled=False)) is None


def test_capacity_search_finds_the_highest_rate_meeting_ttft_and_itl() -> None:
    """A planted engine: TTFT p99 grows with the rate (queueing), ITL with the sequences
    running; the goals bind at 40 req/s (TTFT) and 60 req/s (ITL): the search finds ~40."""
    import dataclasses

    from analyzer.measure.capacity import find_capacity
    from analyzer.measure.specs import CapacitySpec, LoadSpec

    def measure(step: LoadSpec) -> Measurement:
        rate = step.target
        m = _measurement(ttft_p99=2.5 * rate, itl_p99=rate / 3)
        assert m.tokens is not None
        tokens = dataclasses.replace(m.tokens, ttft_p99_ms=2.5 * rate, itl_p99_ms=rate / 3)
        return dataclasses.replace(m, target=rate, tokens=tokens)

    goals = Goals(math.inf, ttft_p99_ms=100.0, itl_p99_ms=20.0)
    result = find_capacity(CapacitySpec(goals, start_rps=5, max_rps=1000, resolution=0.02), measure)
    assert 39.0 <= result.capacity_rps <= 40.0
    assert "TTFT p99 <= 100 ms, ITL p99 <= 20 ms" in result.message
    # With the ITL goal stricter, ITL binds instead.
    strict = Goals(math.inf, ttft_p99_ms=100.0, itl_p99_ms=10.0)
    result = find_capacity(
        CapacitySpec(strict, start_rps=5, max_rps=1000, resolution=0.02), measure
    )
    assert 29.0 <= result.capacity_rps <= 30.0


# ---- perfsweep load's usage errors (in process: they end before any load) ---------------------


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (
            ["--protocol", "openai", "--rate-rps", "1", "--input-tokens", "lognormal:mean=5"],
            "--input-tokens takes N, uniform:LO,HI or lognormal:mean=M,sd=S",
        ),
        (
            ["--protocol", "openai", "--find-capacity"],
            "--find-capacity needs a goal",
        ),
        (["--device", "sim", "--url", "127.0.0.1:9", "--rate-rps", "1"], "give one"),
    ],
)
def test_load_usage_errors_name_the_fix(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    args: list[str],
    match: str,
) -> None:
    from tests.support.cli import perfsweep_in_process

    done = perfsweep_in_process(monkeypatch, capsys, "load", "--model", "m", *args, columns=200)
    assert done.returncode == 2, done.stderr
    assert match in " ".join(done.stderr.split())


def test_a_dataset_line_without_lengths_stops_load_with_its_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    from tests.support.cli import perfsweep_in_process

    data = tmp_path / "d.jsonl"
    data.write_text('{"prompt": "a b", "output_tokens": 3}\n{"prompt": "c"}\n')
    done = perfsweep_in_process(
        monkeypatch,
        capsys,
        "load",
        "--model",
        "m",
        "--protocol",
        "openai",
        "--rate-rps",
        "1",
        "--dataset",
        str(data),
        columns=200,
    )
    assert done.returncode == 2
    assert "d.jsonl:2: no 'output_tokens'" in " ".join(done.stderr.split())


def test_a_step_whose_first_tokens_are_late_fails_fast() -> None:
    from analyzer.measure.goals import clearly_fails

    goals = Goals(math.inf, ttft_p99_ms=100.0)
    assert clearly_fails(0.0, 60, 0, 5, goals, 64, ttft_p90_ms=150.0) is not None
    assert clearly_fails(0.0, 60, 0, 5, goals, 64, ttft_p90_ms=90.0) is None
    assert clearly_fails(0.0, 10, 0, 5, goals, 64, ttft_p90_ms=150.0) is None  # too few yet
