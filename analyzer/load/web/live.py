"""The live numbers behind the dashboard's Server tab (pure: no sockets, no gevent).

Two rolling views, both fed once a second by the collector in ``extension.py``:

* :class:`ClientWindow`: the exact latencies perfsweep's ``Recorder`` measured (one merged
  ``Tick`` per second from every generator process). p50/p99 come from HDR histograms, not from
  Locust's rounded buckets. A generative model's token streams add time to first token,
  inter-token latency (over tokens), output tokens/s and, under goals, goodput
  (:class:`~analyzer.measure.tokens.TokenTally`, as ``perfsweep load`` reports them).
* :class:`ServerWindow`: the target's statistics and Prometheus metrics, one snapshot per
  second; deltas give average batch size, the batch-size histogram, queue vs compute time per
  request, pending requests and failures by reason. A model reload (a config change) restarts
  the server's counters at zero, so a snapshot smaller than its predecessor starts a new series.

:func:`dashboard` assembles both into the JSON the ``/perfsweep/server`` route serves, and
:func:`parse_config_request` validates what the config form posts.
"""

from __future__ import annotations

import collections
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from analyzer.errors import InputError
from analyzer.load.recorder import Tick
from analyzer.measure.histograms import LatencySummary, merge_histograms, percentiles_us
from analyzer.measure.measurement import ServerView
from analyzer.measure.tokens import TokenTally
from analyzer.target.server_stats import MetricsSnapshot, ServerSnapshot, StatsSnapshot, server_view

#: Seconds the headline numbers (throughput, exact p50/p99, server deltas) cover.
WINDOW_S = 10
#: Per-second points kept for the charts.
HISTORY_POINTS = 300


@dataclass(frozen=True)
class Point:
    """One second of the dashboard's time series."""

    t: float
    throughput_rps: float
    error_rps: float
    p50_ms: float
    p99_ms: float
    avg_batch_size: float | None = None
    queue_us: float | None = None
    compute_us: float | None = None
    pending: int | None = None
    #: Token streams finished in the second (None: no stream; requests answered once).
    ttft_p99_ms: float | None = None
    itl_p99_ms: float | None = None
    tokens_per_s: float | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (rounded: these are chart points)."""
        return {
            "ttft_p99_ms": _round(self.ttft_p99_ms, 3),
            "itl_p99_ms": _round(self.itl_p99_ms, 3),
            "tokens_per_s": _round(self.tokens_per_s, 1),
            "t": round(self.t, 3),
            "throughput_rps": round(self.throughput_rps, 2),
            "error_rps": round(self.error_rps, 2),
            "p50_ms": round(self.p50_ms, 3),
            "p99_ms": round(self.p99_ms, 3),
            "avg_batch_size": None
            if self.avg_batch_size is None
            else round(self.avg_batch_size, 3),
            "queue_us": None if self.queue_us is None else round(self.queue_us, 1),
            "compute_us": None if self.compute_us is None else round(self.compute_us, 1),
            "pending": self.pending,
        }


def _round(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


class ClientWindow:
    """Exact client-side latencies: a rolling window of per-second ticks, and a running total."""

    def __init__(self, window_s: int = WINDOW_S) -> None:
        self.window_s = window_s
        self.reset()

    def reset(self) -> None:
        """Forget everything (a new test started, or the user pressed "reset stats")."""
        self._ticks: collections.deque[tuple[float, Tick]] = collections.deque()
        self.total = Tick()
        self.started: float | None = None
        self.last: Tick = Tick()

    def add(self, now: float, tick: Tick) -> None:
        """Append the second that ended at ``now`` (monotonic seconds)."""
        if self.started is None:
            self.started = now - 1.0
        self._ticks.append((now, tick))
        while self._ticks and self._ticks[0][0] <= now - self.window_s:
            self._ticks.popleft()
        self.total.add(tick)
        self.last = tick

    def summary(self, now: float, goals: TokenGoals | None = None) -> dict[str, Any]:
        """Window and since-start numbers (milliseconds, requests/second); with token streams
        each also has ``tokens`` (:func:`token_summary`, goodput under ``goals``)."""
        ticks = [t for _, t in self._ticks]
        span = min(float(self.window_s), now - self.started) if self.started is not None else 0.0
        window = _tick_summary(ticks, span, goals)
        total_span = now - self.started if self.started is not None else 0.0
        return {
            "window_s": round(span, 2),
            "window": window,
            "since_start": _tick_summary([self.total], total_span, goals),
            "in_flight": self.last.in_flight,
            "generator_cpu_pct": round(self.last.cpu_pct, 1),
        }


@dataclass(frozen=True)
class TokenGoals:
    """What goodput counts on the dashboard: the TTFT goal and each request's mean-ITL goal, ms
    (None: not judged; both None: no goodput)."""

    ttft_p99_ms: float | None = None
    itl_p99_ms: float | None = None

    def __bool__(self) -> bool:
        return self.ttft_p99_ms is not None or self.itl_p99_ms is not None


def token_summary(
    ticks: list[Tick], span_s: float, goals: TokenGoals | None = None
) -> dict[str, Any] | None:
    """The token streams of ``ticks`` over ``span_s`` seconds: TTFT and ITL p50/p99 (ms), each
    request's mean ITL at p99, output tokens/s, streams and failed streams, goodput (requests/s
    that met ``goals``; None without goals). None when no stream finished."""
    tallies = [t.tokens for t in ticks if t.tokens is not None and t.tokens.streams]
    if not tallies:
        return None
    total = tallies[0]
    if len(tallies) > 1:  # a window's seconds added up (the running total is one tally already)
        total = TokenTally()
        for tally in tallies:
            total.add(tally)
    g = goals or TokenGoals()
    stats = total.summary(span_s, g.ttft_p99_ms, g.itl_p99_ms) if span_s > 0 else None
    if stats is None:
        return None
    return {
        "streams": stats.streams,
        "failed_streams": stats.failed_streams,
        "ttft_p50_ms": round(stats.ttft_p50_ms, 3),
        "ttft_p99_ms": round(stats.ttft_p99_ms, 3),
        "itl_p50_ms": round(stats.itl_p50_ms, 3),
        "itl_p99_ms": round(stats.itl_p99_ms, 3),
        "mean_itl_p99_ms": round(stats.mean_itl_p99_ms, 3),
        "output_tokens": stats.output_tokens,
        "output_tokens_per_s": round(stats.output_tokens_per_s, 1),
        "goodput_rps": _round(stats.goodput_rps, 2),
        "goals": {"ttft_p99_ms": g.ttft_p99_ms, "itl_p99_ms": g.itl_p99_ms} if g else None,
    }


def _tick_summary(
    ticks: list[Tick], span_s: float, goals: TokenGoals | None = None
) -> dict[str, Any]:
    completed = sum(t.completed for t in ticks)
    errors = sum(t.errors for t in ticks)
    kinds: dict[str, int] = {}
    for t in ticks:
        for kind, n in t.error_kinds.items():
            kinds[kind] = kinds.get(kind, 0) + n
    lat = LatencySummary.from_histogram(merge_histograms(t.latency for t in ticks))
    return {
        "requests": completed,
        "errors": errors,
        "throughput_rps": round((completed - errors) / span_s, 2) if span_s > 0 else 0.0,
        "p50_ms": round(lat.p50_ms, 3),
        "p90_ms": round(lat.p90_ms, 3),
        "p99_ms": round(lat.p99_ms, 3),
        "max_ms": round(lat.max_ms, 3),
        "mean_ms": round(lat.mean_ms, 3),
        "error_kinds": dict(sorted(kinds.items(), key=lambda kv: -kv[1])[:10]),
        "tokens": token_summary(ticks, span_s, goals),
    }


def tick_point(now: float, tick: Tick, view: ServerView | None) -> Point:
    """The chart point of one second: its exact p50/p99, the token streams' TTFT and ITL p99 and
    tokens/s, and the server's delta over it."""
    pct = percentiles_us(tick.latency, [50, 99])
    streams = tick.tokens if tick.tokens is not None and tick.tokens.streams else None
    return Point(
        t=now,
        throughput_rps=float(tick.completed - tick.errors),
        error_rps=float(tick.errors),
        p50_ms=pct[50] / 1000.0,
        p99_ms=pct[99] / 1000.0,
        avg_batch_size=view.avg_batch_size if view and view.execution_count else None,
        queue_us=view.queue_us if view and view.success_count else None,
        compute_us=_compute_us(view) if view and view.success_count else None,
        pending=view.pending_requests if view else None,
        ttft_p99_ms=percentiles_us(streams.ttft, [99])[99] / 1000.0 if streams else None,
        itl_p99_ms=percentiles_us(streams.itl, [99])[99] / 1000.0 if streams else None,
        tokens_per_s=float(streams.output_tokens) if streams else None,
    )


def _compute_us(view: ServerView) -> float:
    return view.compute_input_us + view.compute_infer_us + view.compute_output_us


def restarted(before: StatsSnapshot | None, after: StatsSnapshot | None) -> bool:
    """Whether the server's cumulative statistics went backwards (the model was reloaded)."""
    if before is None or after is None:
        return False
    if after.inference_count < before.inference_count:
        return True
    if after.execution_count < before.execution_count:
        return True
    return any(after.batch_executions.get(k, 0) < n for k, n in before.batch_executions.items())


class ServerWindow:
    """The target's own view: rolling snapshots, deltas over the window and over the last second."""

    def __init__(self, window_s: int = WINDOW_S) -> None:
        self.window_s = window_s
        self._snaps: collections.deque[tuple[float, ServerSnapshot]] = collections.deque()
        self.latest: ServerSnapshot | None = None
        self.reloads = 0

    def add(self, now: float, snap: ServerSnapshot) -> ServerView | None:
        """Record a snapshot; return the delta since the previous one (None without a source)."""
        prev = self._snaps[-1][1] if self._snaps else None
        if prev is not None and restarted(prev.stats, snap.stats):
            # Counters restarted at 0: deltas across the reload would be negative nonsense.
            self._snaps.clear()
            self.reloads += 1
            prev = ServerSnapshot(stats=StatsSnapshot(), metrics=_zero_failures(snap))
        self._snaps.append((now, snap))
        while len(self._snaps) > 1 and self._snaps[0][0] < now - self.window_s:
            self._snaps.popleft()
        self.latest = snap
        if prev is None:
            return None
        return server_view(prev, snap)

    def window_view(self) -> ServerView | None:
        """The delta over the window (oldest snapshot kept to the newest)."""
        if len(self._snaps) < 2:
            return None
        return server_view(self._snaps[0][1], self._snaps[-1][1])


def _zero_failures(snap: ServerSnapshot) -> MetricsSnapshot | None:
    if snap.metrics is None:
        return None
    return MetricsSnapshot(failures_by_reason={r: 0 for r in snap.metrics.failures_by_reason})


def server_summary(view: ServerView | None, latest: ServerSnapshot | None) -> dict[str, Any] | None:
    """The window's server numbers plus the cumulative counters (since the model was loaded)."""
    if view is None and latest is None:
        return None
    out: dict[str, Any] = {}
    if view is not None:
        batches = sum(view.batch_sizes.values())
        out["window"] = {
            "success_count": view.success_count,
            "failure_count": view.failure_count,
            "execution_count": view.execution_count,
            "inference_count": view.inference_count,
            "avg_batch_size": round(view.avg_batch_size, 3),
            "batch_sizes": {str(k): v for k, v in sorted(view.batch_sizes.items())},
            "batch_share": {
                str(k): round(v / batches, 4) for k, v in sorted(view.batch_sizes.items())
            }
            if batches
            else {},
            "queue_us": round(view.queue_us, 1),
            "compute_input_us": round(view.compute_input_us, 1),
            "compute_infer_us": round(view.compute_infer_us, 1),
            "compute_output_us": round(view.compute_output_us, 1),
            "compute_us": round(_compute_us(view), 1),
            "failures_by_reason": dict(view.failures_by_reason),
        }
    if latest is not None:
        totals: dict[str, Any] = {}
        if latest.stats is not None:
            s = latest.stats
            totals.update(
                inference_count=s.inference_count,
                execution_count=s.execution_count,
                success_count=s.durations.get("success", (0, 0))[0],
                failure_count=s.durations.get("fail", (0, 0))[0],
                batch_executions={str(k): v for k, v in sorted(s.batch_executions.items())},
                avg_batch_size=round(s.inference_count / s.execution_count, 3)
                if s.execution_count
                else 0.0,
            )
        if latest.metrics is not None:
            totals["failures_by_reason"] = dict(latest.metrics.failures_by_reason)
            totals["pending_requests"] = latest.metrics.pending_requests
        out["totals"] = totals
        out["pending_requests"] = latest.metrics.pending_requests if latest.metrics else None
    return out


def dashboard(
    *,
    now: float,
    model: str,
    target: str,
    state: str,
    users: int,
    client: ClientWindow,
    server: ServerWindow,
    history: list[Point],
    config: Mapping[str, Any] | None,
    errors: Mapping[str, str],
    goals: TokenGoals | None = None,
) -> dict[str, Any]:
    """The ``/perfsweep/server`` document (``goals``: what a token stream's goodput counts)."""
    return {
        "model": model,
        "target": target,
        "state": state,
        "users": users,
        "window_s": client.window_s,
        "client": client.summary(now, goals),
        "server": server_summary(server.window_view(), server.latest),
        "server_reloads": server.reloads,
        "config": dict(config) if config is not None else None,
        "history": [p.to_dict() for p in history],
        "errors": dict(errors),
    }


def table_rows(doc: Mapping[str, Any]) -> list[dict[str, str]]:
    """The Server tab's native Locust table: one row per number (works without the panel script)."""
    rows: list[tuple[str, str]] = []
    window = doc["client"]["window"]
    span = doc["client"]["window_s"]
    rows.append((f"exact p50 (client, last {span:.0f} s)", f"{window['p50_ms']:.2f} ms"))
    rows.append(("exact p99 (client)", f"{window['p99_ms']:.2f} ms"))
    rows.append(("throughput (client)", f"{window['throughput_rps']:.1f} req/s"))
    rows.append(("failed requests (client)", str(window["errors"])))
    tokens = window.get("tokens")
    if tokens:
        rows.append(
            (
                "TTFT p50 / p99 (client)",
                f"{tokens['ttft_p50_ms']:.2f} / {tokens['ttft_p99_ms']:.2f} ms",
            )
        )
        rows.append(
            (
                "ITL p50 / p99 (client)",
                f"{tokens['itl_p50_ms']:.2f} / {tokens['itl_p99_ms']:.2f} ms",
            )
        )
        rows.append(("output tokens/s (client)", f"{tokens['output_tokens_per_s']:.1f}"))
        if tokens["goodput_rps"] is not None:
            rows.append(("goodput (client)", f"{tokens['goodput_rps']:.2f} req/s"))
        rows.append(("failed streams (client)", str(tokens["failed_streams"])))
    server = doc.get("server") or {}
    sw = server.get("window")
    config = doc.get("config")
    # A generative engine batches per step, inside one "execution" per stream: Triton's batch
    # statistics say nothing of it (its token figures above do).
    engine = bool(config and config.get("engine"))
    if sw:
        if not engine:
            rows.append(("average batch size", f"{sw['avg_batch_size']:.2f}"))
            hist = " ".join(f"{k}:{v}" for k, v in sw["batch_sizes"].items()) or "-"
            rows.append(("executions by batch size", hist))
            rows.append(("queue time / request", f"{sw['queue_us']:.0f} us"))
            rows.append(("compute time / request", f"{sw['compute_us']:.0f} us"))
        fails = ", ".join(f"{k} {v}" for k, v in sw["failures_by_reason"].items()) or "none"
        rows.append(("failures by reason (server)", fails))
    pending = server.get("pending_requests")
    rows.append(("pending requests", "-" if pending is None else str(pending)))
    if config and engine:
        chunked = "on" if config["enable_chunked_prefill"] else "off"
        memory = config.get("gpu_memory_utilization")
        rows.append(
            (
                f"engine settings ({config['engine_name']})",
                f"max_num_seqs {config['max_num_seqs']}, max_num_batched_tokens "
                f"{config['max_num_batched_tokens']}, chunked prefill {chunked}, "
                f"gpu_memory_utilization {'-' if memory is None else f'{memory:g}'}, "
                f"instances {config['instance_count']}"
                + ("" if config.get("settings_known") else " (defaults: not read from the server)"),
            )
        )
    elif config:
        pref = ",".join(str(s) for s in config.get("preferred_batch_size", [])) or "-"
        rows.append(
            (
                "model config",
                f"max_batch_size {config['max_batch_size']}, delay {config['max_queue_delay_us']} us, "
                f"preferred [{pref}], instances {config['instance_count']}",
            )
        )
    return [{"metric": k, "value": v} for k, v in rows]


# --------------------------------------------------------------------------------------------------
# The config form

#: Form fields and the bounds a human could sensibly mean (the server validates the rest).
_INT_FIELDS = {
    "max_batch_size": (1, 1 << 16),
    "max_queue_delay_us": (0, 60_000_000),
    "instance_count": (1, 64),
}


def parse_config_request(data: Any, current: Mapping[str, Any]) -> dict[str, Any]:
    """Merge a posted config change into ``current`` knobs (``Knobs.to_dict`` shape).

    Fields not posted keep their current value. ``preferred_batch_size`` may be a list of integers
    or a comma/space separated string ("" = none).

    Raises:
        InputError: a field is unknown, not an integer, or out of range.
    """
    if not isinstance(data, Mapping):
        raise InputError('post a JSON object such as {"max_queue_delay_us": 500}')
    unknown = set(data) - set(_INT_FIELDS) - {"preferred_batch_size"}
    if unknown:
        raise InputError(
            f"unknown config field(s) {sorted(unknown)}; use "
            f"{sorted([*_INT_FIELDS, 'preferred_batch_size'])}"
        )
    out = dict(current)
    for name, (low, high) in _INT_FIELDS.items():
        if name not in data or data[name] in ("", None):
            continue
        value = _as_int(data[name], name)
        if not low <= value <= high:
            raise InputError(f"{name} must be between {low} and {high}, got {value}")
        out[name] = value
    if "preferred_batch_size" in data and data["preferred_batch_size"] is not None:
        raw = data["preferred_batch_size"]
        items = raw.replace(",", " ").split() if isinstance(raw, str) else list(raw)
        sizes = sorted({_as_int(v, "preferred_batch_size") for v in items}, reverse=True)
        if any(s < 1 for s in sizes):
            raise InputError("preferred_batch_size entries must be positive")
        out["preferred_batch_size"] = sizes
    too_big = [s for s in out.get("preferred_batch_size", []) if s > out["max_batch_size"]]
    if too_big:
        raise InputError(
            f"preferred_batch_size {too_big} exceed max_batch_size {out['max_batch_size']}; "
            "lower them or raise max_batch_size"
        )
    if "instance_count" in data:
        # One posted count: on the first instance group, as before per-group counts existed.
        out.pop("group_counts", None)
    # A posted delay or preferred size means "use the dynamic batcher".
    if out.get("dynamic_batching") is False and (
        "max_queue_delay_us" in data or "preferred_batch_size" in data
    ):
        out.pop("dynamic_batching")
    return out


#: A generative engine's form fields (vLLM's names) and their bounds.
_ENGINE_INT_FIELDS = {
    "max_num_seqs": (1, 1 << 16),
    "max_num_batched_tokens": (1, 1 << 24),
    "instance_count": (1, 64),
}
_ENGINE_FIELDS = (*_ENGINE_INT_FIELDS, "enable_chunked_prefill", "gpu_memory_utilization")


def parse_engine_request(data: Any, current: Mapping[str, Any]) -> dict[str, Any]:
    """Merge a posted engine change into ``current`` (``EngineKnobs.to_dict`` shape).

    Fields not posted keep their current value; ``enable_chunked_prefill`` takes true/false
    (or on/off, 1/0); ``gpu_memory_utilization`` a share in (0, 1] ("" keeps the engine's own).

    Raises:
        InputError: a field is unknown or out of range.
    """
    if not isinstance(data, Mapping):
        raise InputError('post a JSON object such as {"max_num_seqs": 16}')
    unknown = set(data) - set(_ENGINE_FIELDS)
    if unknown:
        raise InputError(
            f"unknown engine field(s) {sorted(unknown)}; a generative model's form takes "
            f"{sorted(_ENGINE_FIELDS)}"
        )
    out = dict(current)
    for name, (low, high) in _ENGINE_INT_FIELDS.items():
        if name not in data or data[name] in ("", None):
            continue
        value = _as_int(data[name], name)
        if not low <= value <= high:
            raise InputError(f"{name} must be between {low} and {high}, got {value}")
        out[name] = value
    chunked = data.get("enable_chunked_prefill")
    if chunked not in ("", None):
        text = str(chunked).strip().lower()
        if text not in ("true", "false", "on", "off", "1", "0"):
            raise InputError(f"enable_chunked_prefill must be true or false, got {chunked!r}")
        out["enable_chunked_prefill"] = text in ("true", "on", "1")
    memory = data.get("gpu_memory_utilization")
    if memory not in ("", None):
        try:
            share = float(memory)
        except (TypeError, ValueError):
            share = math.nan
        if not 0 < share <= 1:
            raise InputError(f"gpu_memory_utilization is a share in (0, 1], got {memory!r}")
        out["gpu_memory_utilization"] = share
    return out


def _as_int(value: Any, name: str) -> int:
    if isinstance(value, bool):
        raise InputError(f"{name} must be an integer, got {value!r}")
    if isinstance(value, float) and math.isfinite(value) and value == int(value):
        return int(value)
    try:
        return int(str(value).strip())
    except ValueError as exc:
        raise InputError(f"{name} must be an integer, got {value!r}") from exc
