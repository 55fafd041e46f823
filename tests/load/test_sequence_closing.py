"""``SequenceStreams.closing``: a level's end ends every live sequence with one more request (pure)."""

from __future__ import annotations

from analyzer.load.sequences import SequenceStreams


def test_closing_ends_the_idle_live_sequences_and_waits_for_the_busy_one() -> None:
    streams = SequenceStreams(length=10, variation_pct=0.0, sequences=3)
    a, b = streams.next(), streams.next()
    assert a is not None and b is not None
    streams.done(a)  # a is idle mid-sequence, b has a request in flight, slot 2 never started
    closing = streams.closing()
    assert [(s.correlation_id, s.index, s.start, s.end) for s in closing] == [
        (a.correlation_id, 1, False, True)
    ]
    assert streams.in_flight == 2  # the END and b's request; slot 2 never started: no END
    streams.done(closing[0])
    streams.done(b)
    assert streams.live_ids() == [b.correlation_id]
    (last,) = streams.closing()
    assert (last.correlation_id, last.index, last.end) == (b.correlation_id, 1, True)
    streams.done(last)
    assert streams.live_ids() == [] and streams.finished == 2
