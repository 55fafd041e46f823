"""Correlated request streams (analyzer.load.sequences): perf_analyzer's sequence semantics."""

from __future__ import annotations

import random
import subprocess
import sys

import pytest

from analyzer.load.sequences import SequenceStep, SequenceStreams, sequence_length


def _drain(streams: SequenceStreams, requests: int) -> list[SequenceStep]:
    """Send ``requests`` requests, completing each at once (one in flight at a time)."""
    sent = []
    for _ in range(requests):
        step = streams.next()
        assert step is not None
        sent.append(step)
        streams.done(step)
    return sent


def _by_sequence(steps: list[SequenceStep]) -> dict[int, list[SequenceStep]]:
    out: dict[int, list[SequenceStep]] = {}
    for step in steps:
        out.setdefault(step.correlation_id, []).append(step)
    return out


def test_every_sequence_starts_once_ends_once_and_counts_up() -> None:
    streams = SequenceStreams(length=5, variation_pct=40, sequences=3, seed=1)
    steps = _drain(streams, 200)
    for cid, seq in _by_sequence(steps).items():
        assert cid >= 1
        assert [s.index for s in seq] == list(range(len(seq)))
        assert seq[0].start and not any(s.start for s in seq[1:])
        assert not any(s.end for s in seq[:-1])
        if seq[-1].end:  # the sequences still live at the end have not ended yet
            assert 3 <= len(seq) <= 7  # 5 +- 40 %
    assert len(streams.live_ids()) == 3
    assert streams.started == streams.finished + 3


def test_one_request_in_flight_per_sequence() -> None:
    streams = SequenceStreams(length=4, sequences=2, seed=0)
    first, second = streams.next(), streams.next()
    assert first is not None and second is not None
    assert first.correlation_id != second.correlation_id
    assert streams.next() is None  # both sequences wait for their replies
    assert streams.in_flight == 2
    streams.done(second)
    again = streams.next()
    assert again is not None and again.correlation_id == second.correlation_id
    assert again.index == 1 and not again.start
    with pytest.raises(ValueError, match="not the request in flight"):
        streams.done(second)  # already taken back
    streams.done(first)
    streams.done(again)


def test_the_idle_longest_sequence_goes_next() -> None:
    streams = SequenceStreams(length=10, variation_pct=0, sequences=3, seed=0)
    a, b, c = (streams.next() for _ in range(3))
    assert a is not None and b is not None and c is not None
    streams.done(c)
    streams.done(a)
    nxt = streams.next()
    assert nxt is not None and nxt.correlation_id == c.correlation_id


def test_lengths_follow_perf_analyzer_variation() -> None:
    rng = random.Random(3)
    lengths = [sequence_length(rng, 20, 20) for _ in range(2000)]
    assert min(lengths) >= 16 and max(lengths) <= 24
    assert set(lengths) >= {17, 20, 23}  # spread over the band, not fixed
    assert sum(lengths) / len(lengths) == pytest.approx(20, abs=0.3)
    assert {sequence_length(rng, 20, 0) for _ in range(50)} == {20}
    assert min(sequence_length(rng, 2, 500) for _ in range(200)) == 1  # never below 1


def test_fixed_length_streams_and_the_seed() -> None:
    streams = SequenceStreams(length=3, variation_pct=0, sequences=2, seed=9)
    steps = _drain(streams, 12)
    ended = [seq for seq in _by_sequence(steps).values() if seq[-1].end]
    assert ended and all(len(seq) == 3 for seq in ended)
    one = [s.correlation_id for s in _drain(SequenceStreams(7, 50, 3, seed=5), 100)]
    two = [s.correlation_id for s in _drain(SequenceStreams(7, 50, 3, seed=5), 100)]
    other = [s.correlation_id for s in _drain(SequenceStreams(7, 50, 3, seed=6), 100)]
    assert one == two and one != other


def test_a_failed_request_ends_its_sequence() -> None:
    streams = SequenceStreams(length=10, variation_pct=0, sequences=1, seed=0)
    start = streams.next()
    assert start is not None and start.start
    streams.done(start, ok=False)
    fresh = streams.next()
    assert fresh is not None and fresh.start and fresh.correlation_id != start.correlation_id
    assert streams.finished == 1


def test_ids_wrap_within_the_range_and_never_onto_a_live_id() -> None:
    streams = SequenceStreams(length=1, sequences=2, seed=0, first_id=100, id_range=3)
    long_lived = SequenceStreams(length=50, variation_pct=0, sequences=2, first_id=1, id_range=2)
    steps = _drain(streams, 9)
    assert [s.correlation_id for s in steps] == [100, 101, 102, 100, 101, 102, 100, 101, 102]
    assert all(s.start and s.end for s in steps)  # length 1: START and END together
    a, b = long_lived.next(), long_lived.next()
    assert a is not None and b is not None and {a.correlation_id, b.correlation_id} == {1, 2}
    with pytest.raises(ValueError, match="id_range"):
        SequenceStreams(sequences=4, id_range=3)


def test_parameters_are_what_tritonclient_and_the_http_body_send() -> None:
    step = SequenceStep(correlation_id=7, start=True, end=False, slot=0, index=0)
    assert step.parameters() == {"sequence_id": 7, "sequence_start": True, "sequence_end": False}


@pytest.mark.parametrize(
    "kwargs",
    [{"length": 0}, {"sequences": 0}, {"first_id": 0}, {"variation_pct": -1.0}],
)
def test_bad_settings_are_refused(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        SequenceStreams(**kwargs)  # type: ignore[arg-type]


@pytest.mark.usefixtures("spawns")
def test_importing_it_imports_no_gevent() -> None:
    code = "import sys, analyzer.load.sequences; print('gevent' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"
