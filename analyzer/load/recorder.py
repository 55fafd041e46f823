"""Per-process exact recording of every request, shipped as deltas ("ticks") to the controller.

Each generator process owns one ``Recorder``. Request greenlets call ``sent``/``done``; the
controller (in-process for one worker, over Locust's messages for many) calls ``take_tick()``,
which returns everything recorded since the previous call as a plain, msgpack-able dict with
HDR histograms encoded, and starts afresh. ``Tick.merge`` adds ticks from many processes exactly.

Three latency distributions are kept, in microseconds:

* ``latency``: what the result reports. Open loop: completion - intended send time (coordinated
  omission free). Closed loop: completion - actual send.
* ``service``: completion - actual send.
* ``lag``: scheduler dispatch - intended send time (how late the generator itself was; a large
  lag means the generator is saturated, not the server).

With traffic classes (a priority mix, ``analyzer.load.classes``) the reported latency of each
request is recorded a second time in its class's histogram, with the class's completed and
failed counts (``ClassTally``); without classes there are none.

Beside the histograms, ``sequence`` keeps the reported latencies in completion order (float32
milliseconds, 4 bytes a request): the sequential step rule (``analyzer.measure.stepping``) estimates
the latencies' autocorrelation from their order, which a histogram has lost. Ticks of several
processes are concatenated process after process; within one tick interval (0.1 s) that is
completion order up to the interleaving of the processes. ``sends`` keeps each request's send
time (wall clock, float64 seconds, 8 bytes a request) so that the gaps of all processes'
sends together can be measured (:func:`send_gap_cv`): what the arrival process actually sent.
"""

from __future__ import annotations

import time
from array import array
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from hdrh.histogram import HdrHistogram

from analyzer.measure.histograms import merge_encoded, new_histogram, record_us
from analyzer.measure.tokens import StreamRecord, TokenTally

#: Error kinds are truncated to this many characters so a flood of unique messages stays small.
ERROR_KIND_CHARS = 120


@dataclass
class ClassTally:
    """One traffic class's requests in a tick: reported latencies (µs), completed and failed."""

    latency: HdrHistogram = field(default_factory=new_histogram)
    completed: int = 0
    errors: int = 0

    def encode(self) -> dict[str, Any]:
        """The wire form (msgpack-able)."""
        return {
            "latency": self.latency.encode() if self.latency.get_total_count() else "",
            "completed": self.completed,
            "errors": self.errors,
        }

    def add(self, other: ClassTally) -> None:
        """Add ``other``'s requests to these."""
        self.latency.add(other.latency)
        self.completed += other.completed
        self.errors += other.errors


class Recorder:
    """Accumulates one process's requests between two ``take_tick`` calls (greenlet-safe: no yields).

    Args:
        classes: Traffic classes to tally apart (0: none, no per-class figures).
    """

    def __init__(self, classes: int = 0) -> None:
        self.class_count = classes
        self._reset()
        self.in_flight = 0
        #: Generative requests in flight, by id: those without a first token are censored TTFTs.
        self._streams: dict[int, StreamRecord] = {}
        self._cpu0 = time.process_time()
        self._wall0 = time.monotonic()

    def _reset(self) -> None:
        self.latency = new_histogram()
        self.service = new_histogram()
        self.lag = new_histogram()
        self.sequence = array("f")
        self.sends = array("d")
        self.dispatched = 0
        self.completed = 0
        self.errors = 0
        self.error_kinds: dict[str, int] = {}
        self.max_in_flight = 0
        self.backlog_max = 0
        self.classes = [ClassTally() for _ in range(self.class_count)]
        #: Generative requests' token streams; None until one is recorded (no histograms to
        #: build and add every tick for requests answered once).
        self.tokens: TokenTally | None = None

    def dispatched_one(self, lag_s: float, sent_at: float | None = None) -> None:
        """The scheduler handed one request to the pool ``lag_s`` after its intended time;
        ``sent_at`` (wall clock, open loop only) goes into ``sends``."""
        self.dispatched += 1
        if sent_at is not None:
            self.sends.append(sent_at)
        self.in_flight += 1
        if self.in_flight > self.max_in_flight:
            self.max_in_flight = self.in_flight
        record_us(self.lag, lag_s * 1e6)

    def done(
        self,
        latency_s: float,
        service_s: float,
        error: BaseException | str | None,
        klass: int = 0,
    ) -> None:
        """One request of traffic class ``klass`` finished (successfully or not); both times
        are in seconds."""
        self.in_flight -= 1
        self.completed += 1
        record_us(self.latency, latency_s * 1e6)
        self.sequence.append(latency_s * 1e3)
        record_us(self.service, service_s * 1e6)
        if self.classes:
            tally = self.classes[klass]
            tally.completed += 1
            record_us(tally.latency, latency_s * 1e6)
            if error is not None:
                tally.errors += 1
        if error is not None:
            self.errors += 1
            kind = error if isinstance(error, str) else f"{type(error).__name__}: {error}"
            kind = kind.splitlines()[0][:ERROR_KIND_CHARS] if kind else "error"
            self.error_kinds[kind] = self.error_kinds.get(kind, 0) + 1

    def stream_done(
        self,
        record: StreamRecord,
        latency_s: float,
        service_s: float,
        error: BaseException | str | None,
    ) -> None:
        """One generative request finished: its whole-request figures as :meth:`done`, its
        tokens (TTFT, gaps, counts) into ``tokens``."""
        self._streams.pop(id(record), None)
        self.done(latency_s, service_s, error)
        if self.tokens is None:
            self.tokens = TokenTally()
        self.tokens.add_record(record, latency_s)

    def stream_started(self, record: StreamRecord) -> None:
        """A generative request was sent: until its first token it is waiting
        (:meth:`in_flight_streams`)."""
        self._streams[id(record)] = record

    def in_flight_streams(self) -> tuple[array[float], array[float]]:
        """The generative requests in flight, in one pass, as flat pairs (seconds):

        * waiting, without a first token: (since the intended send, since the actual send).
          Each TTFT is at least that: a level that ends with streams queued past the TTFT goal
          has missed it, though none of them completed;
        * streaming, with one: (TTFT from the intended send, from the actual send). A level
          that ends before they do still has their TTFT.
        """
        now = time.perf_counter()
        waiting, streaming = array("d"), array("d")
        for r in self._streams.values():
            if r.chunks:
                streaming.extend((r.ttft_s or 0.0, r.ttft_from_send_s or 0.0))
            else:
                waiting.extend((now - r.intended, now - r.sent))
        return waiting, streaming

    def backlog(self, size: int) -> None:
        """The open-loop pool was full and ``size`` requests waited for a free slot."""
        self.backlog_max = max(self.backlog_max, size)

    def _counters(self) -> dict[str, Any]:
        """Counts and CPU since the last take (histograms excluded), and restart the CPU clock."""
        now_cpu, now_wall = time.process_time(), time.monotonic()
        out = {
            "dispatched": self.dispatched,
            "completed": self.completed,
            "errors": self.errors,
            "error_kinds": self.error_kinds,
            "in_flight": self.in_flight,
            "max_in_flight": self.max_in_flight,
            "backlog_max": self.backlog_max,
            "cpu_s": now_cpu - self._cpu0,
            "wall_s": now_wall - self._wall0,
        }
        self._cpu0, self._wall0 = now_cpu, now_wall
        return out

    def take_tick(self) -> dict[str, Any]:
        """Everything since the last call as a plain dict (the wire format), then reset."""
        waiting, streaming = self.in_flight_streams()
        tick = {
            "latency": self.latency.encode() if self.latency.get_total_count() else "",
            "service": self.service.encode() if self.service.get_total_count() else "",
            "lag": self.lag.encode() if self.lag.get_total_count() else "",
            "sequence": self.sequence.tobytes(),
            "sends": self.sends.tobytes(),
            "classes": [c.encode() for c in self.classes],
            "tokens": self.tokens.encode() if self.tokens is not None else {},
            "waiting": waiting.tobytes(),
            "streaming": streaming.tobytes(),
            **self._counters(),
        }
        self._reset()
        self.max_in_flight = self.in_flight
        return tick

    def take_local_tick(self) -> Tick:
        """The same as ``Tick.merge([take_tick()])`` without encoding the histograms.

        For a controller in the same process: encoding and decoding three HDR histograms took
        ~1 ms of the gevent hub per collection (ten per second), time in which no response is read
        and no request is sent.
        """
        c = self._counters()
        waiting, streaming = self.in_flight_streams()
        tick = Tick(
            latency=self.latency,
            service=self.service,
            lag=self.lag,
            sequence=self.sequence,
            sends=self.sends,
            dispatched=c["dispatched"],
            completed=c["completed"],
            errors=c["errors"],
            error_kinds=dict(c["error_kinds"]),
            in_flight=c["in_flight"],
            max_in_flight=c["max_in_flight"],
            backlog_max=c["backlog_max"],
            cpu_pct=100.0 * c["cpu_s"] / c["wall_s"] if c["wall_s"] > 0 else 0.0,
            intervals=1,
            classes=self.classes,
            tokens=self.tokens,
            waiting=waiting,
            streaming=streaming,
        )
        self._reset()
        self.max_in_flight = self.in_flight
        return tick


@dataclass
class Tick:
    """Ticks of several processes (and/or several intervals) added together."""

    latency: HdrHistogram = field(default_factory=new_histogram)
    service: HdrHistogram = field(default_factory=new_histogram)
    lag: HdrHistogram = field(default_factory=new_histogram)
    #: Reported latencies in completion order, milliseconds (float32).
    sequence: array[float] = field(default_factory=lambda: array("f"))
    #: Send times (wall clock, seconds), process after process.
    sends: array[float] = field(default_factory=lambda: array("d"))
    #: Streams without a first token at the tick's end (:meth:`Recorder.in_flight_streams`; a gauge:
    #: the latest tick's, every process's).
    waiting: array[float] = field(default_factory=lambda: array("d"))
    #: Streams with a first token, still in flight at the tick's end (:meth:`Recorder.in_flight_streams`;
    #: a gauge, as ``waiting``).
    streaming: array[float] = field(default_factory=lambda: array("d"))
    dispatched: int = 0
    completed: int = 0
    errors: int = 0
    error_kinds: dict[str, int] = field(default_factory=dict)
    #: In-flight now: summed over processes (latest tick of each).
    in_flight: int = 0
    max_in_flight: int = 0
    backlog_max: int = 0
    #: Busiest process's CPU share, in percent of one core (mean over the intervals added).
    cpu_pct: float = 0.0
    intervals: int = 0
    #: Per traffic class, by index (empty without classes).
    classes: list[ClassTally] = field(default_factory=list)
    #: Generative requests' token streams (None for requests answered once).
    tokens: TokenTally | None = None

    @classmethod
    def merge(cls, raw_ticks: Iterable[dict[str, Any]]) -> Tick:
        """Merge one interval's ticks from several processes."""
        ticks = list(raw_ticks)
        out = cls(
            latency=merge_encoded(t["latency"] for t in ticks),
            service=merge_encoded(t["service"] for t in ticks),
            lag=merge_encoded(t["lag"] for t in ticks),
            intervals=1,
        )
        if any(t.get("tokens") for t in ticks):
            out.tokens = TokenTally.merge(t.get("tokens") or {} for t in ticks)
        for t in ticks:
            for index, raw in enumerate(t.get("classes", ())):
                while len(out.classes) <= index:
                    out.classes.append(ClassTally())
                tally = out.classes[index]
                if raw["latency"]:
                    tally.latency.decode_and_add(raw["latency"])
                tally.completed += raw["completed"]
                tally.errors += raw["errors"]
            out.sequence.frombytes(t.get("sequence", b""))
            out.sends.frombytes(t.get("sends", b""))
            out.waiting.frombytes(t.get("waiting", b""))
            out.streaming.frombytes(t.get("streaming", b""))
            out.dispatched += t["dispatched"]
            out.completed += t["completed"]
            out.errors += t["errors"]
            for kind, n in t["error_kinds"].items():
                out.error_kinds[kind] = out.error_kinds.get(kind, 0) + n
            out.in_flight += t["in_flight"]
            out.max_in_flight += t["max_in_flight"]  # upper bound: peaks may not coincide
            out.backlog_max += t["backlog_max"]
            if t["wall_s"] > 0:
                out.cpu_pct = max(out.cpu_pct, 100.0 * t["cpu_s"] / t["wall_s"])
        return out

    def add(self, other: Tick) -> None:
        """Append a later interval to this one (histograms and counts add; gauges take the later)."""
        self.latency.add(other.latency)
        self.service.add(other.service)
        self.lag.add(other.lag)
        self.sequence.extend(other.sequence)
        self.sends.extend(other.sends)
        if other.tokens is not None:
            if self.tokens is None:
                self.tokens = TokenTally()
            self.tokens.add(other.tokens)
        for index, tally in enumerate(other.classes):
            while len(self.classes) <= index:
                self.classes.append(ClassTally())
            self.classes[index].add(tally)
        self.dispatched += other.dispatched
        self.completed += other.completed
        self.errors += other.errors
        for kind, n in other.error_kinds.items():
            self.error_kinds[kind] = self.error_kinds.get(kind, 0) + n
        self.in_flight = other.in_flight
        self.waiting = other.waiting
        self.streaming = other.streaming
        self.max_in_flight = max(self.max_in_flight, other.max_in_flight)
        self.backlog_max = max(self.backlog_max, other.backlog_max)
        n = self.intervals + other.intervals
        if n:
            self.cpu_pct = (self.cpu_pct * self.intervals + other.cpu_pct * other.intervals) / n
        self.intervals = n


def send_gap_cv(sends: array[float]) -> float | None:
    """Coefficient of variation of the gaps between ``sends`` (any order; None for fewer
    than three)."""
    if len(sends) < 3:
        return None
    gaps = np.diff(np.sort(np.frombuffer(sends, dtype=np.float64)))
    mean = float(gaps.mean())
    return float(gaps.std(ddof=1)) / mean if mean > 0 else None
