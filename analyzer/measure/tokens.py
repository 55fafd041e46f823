"""Token streams measured: time to first token, inter-token latency, tokens/s, goodput. Pure.

A streaming client fills one :class:`StreamRecord` per generative request: the intended send
time, the actual send, each chunk's arrival and its tokens, the end, the server's own count of
generated tokens when it gave one, and whether the stream failed (a stream closed early or an
error response: a failed request, whose tokens are kept). :class:`TokenTally` adds records into
exact HDR histograms (microseconds, as the request latencies) and counts, crosses processes as
plain data (``encode``/``merge``), and :meth:`TokenTally.summary` gives a level's
:class:`TokenStats`.

Definitions (AIPerf's and vLLM's benchmark's):

* TTFT: first token's arrival - intended send time (open loop: no coordinated omission; closed
  loop the intended time is the actual send). Beside it, from the actual send (AIPerf's
  definition): the two differ by how late the generator sent.
* ITL over tokens: the gaps between consecutive token arrivals; a chunk of ``k`` tokens after a
  gap ``g`` counts as ``k`` gaps of ``g / k``. p50/p99 are over every gap of every request.
* Per-request mean ITL: ``(last token - first token) / (tokens - 1)``, for requests with two
  or more tokens.
* Output tokens/s: generated tokens (the server's count when given, else those received),
  failed requests' included, over the measured time.
* Goodput: requests per second that succeeded and met every goal given: TTFT <= the TTFT goal,
  the request's mean ITL <= the ITL goal, its end-to-end latency <= the p99 goal (the goals are
  p99 goals of the level; goodput applies each to every request, as AIPerf's ``--goodput`` does).
"""

from __future__ import annotations

import dataclasses
import math
from array import array
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from hdrh.histogram import HdrHistogram

from analyzer.measure.histograms import (
    LatencySummary,
    merge_encoded,
    new_histogram,
    record_us,
)

#: Values per request in ``TokenTally.rows``: TTFT ms, mean ITL ms, end-to-end ms, succeeded.
ROW = 4


@dataclass
class StreamRecord:
    """One generative request as its client saw it (times: ``time.perf_counter`` seconds)."""

    intended: float
    sent: float
    input_tokens: int = 0
    #: Each chunk with tokens: (arrival, tokens in it).
    chunks: list[tuple[float, int]] = field(default_factory=list)
    end: float = 0.0
    #: The server's count of generated tokens (OpenAI ``usage``); None: not given.
    usage_tokens: int | None = None
    failed: bool = False

    def token(self, at: float, count: int = 1) -> None:
        """A chunk of ``count`` tokens arrived at ``at``."""
        if count > 0:
            self.chunks.append((at, count))

    @property
    def received(self) -> int:
        """Tokens received in chunks."""
        return sum(n for _, n in self.chunks)

    @property
    def output_tokens(self) -> int:
        """Generated tokens: the server's count when it gave one, else those received."""
        return self.usage_tokens if self.usage_tokens is not None else self.received

    @property
    def ttft_s(self) -> float | None:
        """First token - intended send (None: no token came)."""
        return self.chunks[0][0] - self.intended if self.chunks else None

    @property
    def ttft_from_send_s(self) -> float | None:
        """First token - actual send (None: no token came)."""
        return self.chunks[0][0] - self.sent if self.chunks else None

    def gaps_s(self) -> list[float]:
        """Inter-token gaps: a chunk of ``k`` tokens after a gap ``g`` gives ``k`` gaps ``g/k``
        (the first chunk's extra tokens arrived with it: gaps of 0)."""
        out: list[float] = []
        if not self.chunks:
            return out
        out.extend([0.0] * (self.chunks[0][1] - 1))
        for (before, _), (at, n) in zip(self.chunks, self.chunks[1:], strict=False):
            out.extend([(at - before) / n] * n)
        return out

    @property
    def mean_itl_s(self) -> float | None:
        """(last token - first token) / (tokens - 1); None below two tokens."""
        tokens = self.output_tokens
        if len(self.chunks) < 1 or tokens < 2:
            return None
        return (self.chunks[-1][0] - self.chunks[0][0]) / (tokens - 1)


@dataclass(frozen=True)
class TokenStats:
    """A load level's token figures (milliseconds; rates per second)."""

    ttft_p50_ms: float
    ttft_p99_ms: float
    itl_p50_ms: float
    itl_p99_ms: float
    #: Percentiles over requests of each request's mean ITL.
    mean_itl_p50_ms: float
    mean_itl_p99_ms: float
    streams: int
    failed_streams: int
    input_tokens: int
    output_tokens: int
    output_tokens_per_s: float
    #: Requests/s that succeeded and met every goal (None: no goal given).
    goodput_rps: float | None = None
    good_count: int | None = None
    ttft_mean_ms: float = 0.0
    itl_mean_ms: float = 0.0
    #: TTFT from the actual send (AIPerf's definition), beside the intended send's above.
    ttft_from_send_p50_ms: float | None = None
    ttft_from_send_p99_ms: float | None = None
    #: Streams without a first token when the level ended, in the TTFT percentiles at their
    #: wait so far (a lower bound): they are not in ``streams``, which finished.
    ttft_waiting: int = 0
    #: Streams the level sent still in flight when its windows closed: in the TTFT
    #: distribution (and, those that finished, ITL), not in the counts and rates, which are the
    #: windows'.
    tail_streams: int = 0

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return dataclasses.asdict(self)

    def with_distributions_of(self, seen: TokenStats, tail_streams: int) -> TokenStats:
        """These counts and rates with ``seen``'s distributions (a level's streams, those that
        finished after its windows included)."""
        return dataclasses.replace(
            self,
            **{name: getattr(seen, name) for name in _DISTRIBUTIONS},
            tail_streams=tail_streams,
        )

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TokenStats:
        """Inverse of :meth:`to_dict`."""
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


#: The :class:`TokenStats` fields that describe how requests fared (not how many).
_DISTRIBUTIONS = (
    "ttft_p50_ms",
    "ttft_p99_ms",
    "itl_p50_ms",
    "itl_p99_ms",
    "mean_itl_p50_ms",
    "mean_itl_p99_ms",
    "ttft_mean_ms",
    "itl_mean_ms",
    "ttft_from_send_p50_ms",
    "ttft_from_send_p99_ms",
    "ttft_waiting",
)


@dataclass
class TokenTally:
    """Token streams added together: histograms (µs), counts, one row per request."""

    ttft: HdrHistogram = field(default_factory=new_histogram)
    itl: HdrHistogram = field(default_factory=new_histogram)
    mean_itl: HdrHistogram = field(default_factory=new_histogram)
    #: TTFT from the actual send.
    ttft_sent: HdrHistogram = field(default_factory=new_histogram)
    streams: int = 0
    failed: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    #: Streams still without a first token when the level ended (:meth:`add_waiting`).
    waiting: int = 0
    #: Per request, ``ROW`` float32 values: TTFT ms (NaN: none), mean ITL ms (NaN: under two
    #: tokens), end-to-end ms, 1.0 if it succeeded.
    rows: array[float] = field(default_factory=lambda: array("f"))

    def add_record(self, record: StreamRecord, latency_s: float) -> None:
        """One finished request; ``latency_s`` is its end-to-end latency as reported."""
        self.streams += 1
        self.failed += record.failed
        self.input_tokens += record.input_tokens
        self.output_tokens += record.output_tokens
        ttft = record.ttft_s
        if ttft is not None:
            record_us(self.ttft, ttft * 1e6)
            record_us(self.ttft_sent, (record.ttft_from_send_s or 0.0) * 1e6)
        for gap in record.gaps_s():
            record_us(self.itl, gap * 1e6)
        mean = record.mean_itl_s
        if mean is not None:
            record_us(self.mean_itl, mean * 1e6)
        nan = math.nan
        self.rows.extend(
            (
                ttft * 1e3 if ttft is not None else nan,
                mean * 1e3 if mean is not None else nan,
                latency_s * 1e3,
                0.0 if record.failed else 1.0,
            )
        )

    def add_waiting(self, pairs: Sequence[float]) -> None:
        """The level's streams still without a first token at its end (flat (since intended
        send, since actual send) pairs, seconds), into the TTFT histograms at their wait so far:
        a lower bound of each TTFT. Left out, a level above capacity read only the requests that
        got through, and its TTFT as if the queue behind them were not there."""
        self.waiting += self.add_first_tokens(pairs)

    def add_first_tokens(self, pairs: Sequence[float]) -> int:
        """Streams still in flight at the level's end that had their first token (flat (from
        intended send, from actual send) pairs, seconds), into the TTFT histograms; how many."""
        for i in range(0, len(pairs) - 1, 2):
            record_us(self.ttft, pairs[i] * 1e6)
            record_us(self.ttft_sent, pairs[i + 1] * 1e6)
        return len(pairs) // 2

    def add(self, other: TokenTally) -> None:
        """Add ``other``'s requests to these."""
        self.ttft.add(other.ttft)
        self.itl.add(other.itl)
        self.mean_itl.add(other.mean_itl)
        self.ttft_sent.add(other.ttft_sent)
        self.streams += other.streams
        self.failed += other.failed
        self.input_tokens += other.input_tokens
        self.output_tokens += other.output_tokens
        self.waiting += other.waiting
        self.rows.extend(other.rows)

    def encode(self) -> dict[str, Any]:
        """The wire form (msgpack-able)."""

        def enc(h: HdrHistogram) -> str | bytes:
            return h.encode() if h.get_total_count() else ""

        return {
            "ttft": enc(self.ttft),
            "itl": enc(self.itl),
            "mean_itl": enc(self.mean_itl),
            "ttft_sent": enc(self.ttft_sent),
            "streams": self.streams,
            "failed": self.failed,
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "rows": self.rows.tobytes(),
        }

    @classmethod
    def merge(cls, raw: Iterable[Mapping[str, Any]]) -> TokenTally:
        """Add the wire forms of several processes."""
        items = [r for r in raw if r]
        out = cls(
            ttft=merge_encoded(r["ttft"] for r in items),
            itl=merge_encoded(r["itl"] for r in items),
            mean_itl=merge_encoded(r["mean_itl"] for r in items),
            ttft_sent=merge_encoded(r["ttft_sent"] for r in items),
        )
        for r in items:
            out.streams += r["streams"]
            out.failed += r["failed"]
            out.input_tokens += r["input_tokens"]
            out.output_tokens += r["output_tokens"]
            out.rows.frombytes(r["rows"])
        return out

    def good_count(
        self,
        ttft_ms: float | None = None,
        itl_ms: float | None = None,
        latency_ms: float | None = None,
    ) -> int:
        """Requests that succeeded and met every goal given (a goal on a figure a request
        lacks, a TTFT without a token, is missed; a mean ITL of one token is met)."""
        good = 0
        rows = self.rows
        for i in range(0, len(rows), ROW):
            ttft, mean, e2e, ok = rows[i], rows[i + 1], rows[i + 2], rows[i + 3]
            if ok < 0.5:
                continue
            if ttft_ms is not None and not ttft <= ttft_ms:  # NaN: no token, missed
                continue
            if itl_ms is not None and mean > itl_ms:  # NaN compares False: met
                continue
            if latency_ms is not None and e2e > latency_ms:
                continue
            good += 1
        return good

    def summary(
        self,
        duration_s: float,
        ttft_ms: float | None = None,
        itl_ms: float | None = None,
        latency_ms: float | None = None,
    ) -> TokenStats:
        """The level's figures over ``duration_s``; goodput against the goals given (all
        None: no goodput)."""
        ttft = LatencySummary.from_histogram(self.ttft)
        itl = LatencySummary.from_histogram(self.itl)
        mean = LatencySummary.from_histogram(self.mean_itl)
        sent = LatencySummary.from_histogram(self.ttft_sent)
        goals = (ttft_ms, itl_ms, latency_ms)
        good = self.good_count(*goals) if any(g is not None for g in goals) else None
        return TokenStats(
            ttft_p50_ms=ttft.p50_ms,
            ttft_p99_ms=ttft.p99_ms,
            itl_p50_ms=itl.p50_ms,
            itl_p99_ms=itl.p99_ms,
            mean_itl_p50_ms=mean.p50_ms,
            mean_itl_p99_ms=mean.p99_ms,
            streams=self.streams,
            failed_streams=self.failed,
            input_tokens=self.input_tokens,
            output_tokens=self.output_tokens,
            output_tokens_per_s=self.output_tokens / duration_s if duration_s > 0 else 0.0,
            goodput_rps=(good / duration_s if duration_s > 0 else 0.0)
            if good is not None
            else None,
            good_count=good,
            ttft_mean_ms=ttft.mean_ms,
            itl_mean_ms=itl.mean_ms,
            ttft_from_send_p50_ms=sent.p50_ms,
            ttft_from_send_p99_ms=sent.p99_ms,
            ttft_waiting=self.waiting,
        )
