"""``LocustLoadGenerator``: one load level (warm-up, windows, stability, self-checks) and capacity search.

The controller loop runs in the calling process (gevent-patched, since it imports locust). It
drives generator processes through a ``_Backend`` (:mod:`analyzer.load.backends`; the windows it
builds from their ticks are :mod:`analyzer.load.windows`'s):

* ``LocalBackend``: Locust's ``LocalRunner`` in this process (``workers=1``);
* ``DistributedBackend``: Locust's ``MasterRunner`` here plus N ``python -m analyzer.load.worker``
  subprocesses on loopback (``workers=N``), or remote workers that connect to ``--master``.

Every ``tick_s`` the controller collects each process's ``Recorder`` delta (exact HDR histograms,
counts, CPU) and adds it to the current window. A window closes by time or by request count; the
server is scraped at each window boundary. A level ends when the last ``stable_windows`` windows
agree (stable), at ``max_windows`` (unstable, marked), or early when a capacity step clearly fails.

A sequential level (``LoadSpec.sequential``) is fed to its ``SequentialRule`` every tick and ends
as soon as the rule decides PASS or FAIL, at its request cap or at ``max_windows`` (BOUNDARY), or
when the backlog or error guard of ``clearly_fails`` trips (FAIL). Its result merges every window
(the rule used every request), and stability is checked and recorded, not waited for.
"""

from __future__ import annotations

from analyzer.load._gevent import freeze_heap  # (isort: skip) patch first
import logging
import math
import time
from dataclasses import replace

import gevent

from analyzer.config.urls import metrics_url_of
from analyzer.load.backends import DistributedBackend, LocalBackend, _Backend
from analyzer.load.classes import RequestClass, level_classes
from analyzer.load.clients import fetch_model_documents, stats_source
from analyzer.load.context import EngineConfig
from analyzer.load.engine import EngineOptions
from analyzer.load.level_messages import LevelFacts, level_messages
from analyzer.load.recorder import Tick, send_gap_cv
from analyzer.load.users import ClosedLoopUser, OpenLoopUser
from analyzer.load.windows import _equal_parts, _feed, _TickSample, _Window
from analyzer.measure.capacity import CapacityResult, find_capacity
from analyzer.measure.goals import (
    GeneratorLimits,
    clearly_fails,
    generator_problems,
    is_stable,
)
from analyzer.measure.histograms import (
    LatencySummary,
    count_above_us,
    merge_histograms,
    new_histogram,
    percentiles_us,
)
from analyzer.measure.measurement import ClassStats, Measurement, WindowStats
from analyzer.measure.specs import CapacitySpec, LoadMode, LoadSpec
from analyzer.measure.stepping import SequentialRule, StepRecord, StepVerdict
from analyzer.measure.tokens import TokenStats, TokenTally
from analyzer.target.liveness import check_step
from analyzer.target.server_stats import (
    ServerScraper,
    ServerSnapshot,
    combine_views,
    http_stats_source,
    server_view,
)
from analyzer.target.transport import UrllibTransport

log = logging.getLogger(__name__)

#: A count window that has not reached its request count by then closes anyway.
MAX_COUNT_WINDOW_S = 30.0
#: An open-loop level's stream starts this long after its processes are configured, so that
#: they share one epoch (a process that starts later joins the stream where it then is).
STREAM_LEAD_S = 0.1


class LocustLoadGenerator:
    """The real ``LoadGenerator``: Locust traffic, exact latencies, stability windows, self-checks.

    Use as a context manager (it owns Locust runners and possibly worker processes)::

        with LocustLoadGenerator(EngineOptions(url="127.0.0.1:8000", model="m")) as gen:
            m = gen.measure(LoadSpec(LoadMode.REQUEST_RATE, 200))
    """

    def __init__(self, options: EngineOptions) -> None:
        self.options = options
        self._backend: _Backend | None = None
        #: Local generator processes (``traffic.workers = "auto"`` grows it: :meth:`_grow`).
        self._processes = max(1, options.workers)
        #: The current sequential step's ticks (seconds since its start, tick): its stability check.
        self._step_ticks: list[_TickSample] = []
        warm = new_histogram()
        warm.record_value(1)
        percentiles_us(warm, [50])  # builds the bucket tables now, not in the first window
        freeze_heap()
        self._scraper = self._make_scraper() if options.scrape_server else None

    def _make_scraper(self) -> ServerScraper:
        o = self.options
        transport = UrllibTransport(o.access)
        # A pipeline's stages are read from the same document: every model's statistics.
        which = "" if o.stage_models else o.model
        if o.protocol == "grpc" and o.stats_url is None:
            source = stats_source("grpc", o.url, which, o.access)
        else:
            address = o.http_base(o.stats_url or o.url)
            source = http_stats_source(address, which, transport=transport)
        metrics_url = o.metrics_url
        optional = False
        if metrics_url is None and o.protocol == "http":
            # A guess by Triton's port layout (HTTP port + 2), dropped if it does not answer.
            metrics_url, optional = metrics_url_of(o.http_base(o.url)), True
        return ServerScraper(
            o.model,
            source,
            metrics_url,
            metrics_optional=optional,
            transport=transport,
            stages=o.stage_models,
        )

    def __enter__(self) -> LocustLoadGenerator:
        if self.options.protocol == "grpc":
            # The gRPC channel is checked before any level: TLS files the server does not
            # accept, or a restricted metadata protocol, stop here rather than fail every
            # request of a trial (HTTP targets are checked by their Target, or by the first
            # level's own documents).
            o = self.options
            try:
                fetch_model_documents("grpc", o.url, o.model, o.access)
            except BaseException:
                self.close()  # the statistics channel too: an open one keeps the process up
                raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop Locust and any worker processes; close the statistics connection."""
        if self._backend is not None:
            backend, self._backend = self._backend, None
            backend.close()
        if self._scraper is not None:
            self._scraper.close()

    def _ensure_backend(self) -> _Backend:
        if self._backend is None:
            o = self.options
            if o.expect_remote_workers > 0:
                self._backend = DistributedBackend(
                    0, o.expect_remote_workers, o.master_bind_host, o.master_port
                )
            elif self._processes > 1:
                self._backend = DistributedBackend(self._processes, 0, "127.0.0.1", o.master_port)
            else:
                self._backend = LocalBackend()
        return self._backend

    # ---- one level --------------------------------------------------------------------------------

    def measure(self, spec: LoadSpec) -> Measurement:
        """Measure one load level: warm-up, windows until stable (or the limit), self-checks.

        A sequential level (``spec.sequential``) runs until its test decides instead. With
        ``traffic.workers = "auto"`` a level the generator could not offer is measured again
        with more generator processes (:meth:`_grow`), which later levels keep.
        """
        m = self._checked(spec)
        grown_from = self._processes
        while self._grow(m):
            # Fresh processes open their connections first: a warm-up even for a later step.
            m = self._checked(replace(spec, warmup_s=max(spec.warmup_s, 0.5)))
        if self._processes != grown_from:
            note = (
                f"generator grown from {grown_from} to {self._processes} processes "
                f'(traffic.workers = "auto": the generator was saturated)'
            )
            m = replace(m, messages=(*m.messages, note))
        return m

    def _checked(self, spec: LoadSpec) -> Measurement:
        """One level, then the dead-server rule (:func:`analyzer.target.liveness.check_step`): a
        step that a dead or hung server failed raises :class:`~analyzer.errors.TargetDiedError`
        instead of reading as a config that missed its goals."""
        m = self._measure_once(spec)
        if (address := self.options.http_address) is not None:
            check_step(m, self.options.http_base(address), UrllibTransport(self.options.access))
        return m

    def _grow(self, m: Measurement) -> bool:
        """After a level whose generator was saturated, double the local generator processes
        (up to ``max_workers``, one per core) and say so; False when auto is off, the level
        was valid, or the processes are at their bound."""
        o = self.options
        if m.valid or o.max_workers <= self._processes or o.expect_remote_workers:
            return False
        before, self._processes = self._processes, min(o.max_workers, 2 * self._processes)
        log.warning(
            "the load generator was saturated with %d process%s at %s %g; measuring again "
            "with %d (traffic.workers = auto, at most %d)",
            before,
            "" if before == 1 else "es",
            m.mode.value,
            m.target,
            self._processes,
            o.max_workers,
        )
        if self._backend is not None:
            backend, self._backend = self._backend, None
            backend.close()
        return True

    def _measure_once(self, spec: LoadSpec) -> Measurement:
        backend = self._ensure_backend()
        o = self.options
        open_loop = spec.mode is LoadMode.REQUEST_RATE
        users = backend.processes if open_loop else int(spec.target)
        config = EngineConfig(
            protocol=o.protocol,
            url=o.url,
            model=o.model,
            mode=spec.mode,
            rate_per_user=spec.target / users if open_loop else 0.0,
            arrival=spec.arrival,
            shared_stream=users if open_loop else 0,
            # Far enough ahead that the processes' dispatchers start before it, as a rule.
            stream_epoch=time.time() + STREAM_LEAD_S if open_loop else 0.0,
            seed=spec.seed,
            pool_size=o.pool_size,
            inputs=o.inputs,
            http_client=o.http_client,
            precise_timer=o.precise_timer,
            classes=[c.to_dict() for c in self._level_classes(spec)] or None,
            sequence_length=o.sequence_length,
            sequence_length_variation_pct=o.sequence_length_variation_pct,
            sequences=o.sequences,
            shared_memory=o.shared_memory,
            access=o.access,
            http_tls=o.http_tls,
            stream=o.stream,
            lengths=o.lengths.to_dict() if o.stream else None,
        )
        backend.configure(config)
        backend.start(OpenLoopUser if open_loop else ClosedLoopUser, users)
        try:
            windows, merged, stopped_early, step = self._run_windows(
                backend, spec, config.stream_epoch
            )
            tail = None
            if o.stream and open_loop and stopped_early is None:
                tail = self._finish_streams(backend, windows)
        finally:
            backend.stop()
        return self._result(spec, windows, merged, stopped_early, backend.processes, step, tail)

    def _finish_streams(self, backend: _Backend, windows: list[WindowStats]) -> Tick:
        """End a generative level's sending and collect its streams still in flight until
        each has its first token (or none is left), at most as long again as the level's
        windows ran (at least two request lifetimes; at most :data:`MAX_COUNT_WINDOW_S`).

        A generative request lasts seconds, and a level's last ones are those that waited
        longest behind a queue the level built: cut off at the level's end (as a level of
        requests answered at once is), an engine above its capacity read only the streams that
        got through ahead of the queue, and a few seconds' level passed goals it fails at any
        length (the sweep measured 21.5 req/s for a config that meets the TTFT goal up to 14).
        Their TTFT counts in the level's distribution (those that finished here, their ITL
        too), not in its rates; those still without a first token at the bound count at their
        wait so far. The streams mid-decode are not waited for: their first token was the
        evidence.
        """
        backend.stop_sending()
        level_s = sum(w.duration_s for w in windows)
        lifetime_s = max((w.mean_ms for w in windows), default=0.0) / 1000.0
        deadline = time.monotonic() + min(MAX_COUNT_WINDOW_S, max(level_s, 2 * lifetime_s))
        tail = Tick()
        while True:
            gevent.sleep(self.options.tick_s)
            tail.add(backend.collect())
            # Every request still in flight is a stream with its first token (the backlog
            # and the queued have none).
            first_tokens_in = tail.in_flight <= len(tail.streaming) // 2
            if first_tokens_in or time.monotonic() >= deadline:
                return tail

    def _snapshot(self) -> ServerSnapshot | None:
        return self._scraper.snapshot() if self._scraper else None

    def _run_windows(
        self, backend: _Backend, spec: LoadSpec, stream_epoch: float = 0.0
    ) -> tuple[list[WindowStats], list[Tick], str | None, StepRecord | None]:
        o = self.options
        # The warm-up starts with the open-loop stream, not before it: a step without one (a
        # capacity search's later steps) measured the epoch's lead too, 0.1 s in which nothing
        # was sent, and read its offered rate and throughput short by it (12 % of a 0.8 s step).
        gevent.sleep(max(0.0, stream_epoch - time.time()) + spec.warmup_s)
        warm = backend.collect()  # warm-up samples are dropped, never mixed with measured ones
        if o.stream and spec.mode is LoadMode.REQUEST_RATE:
            # A generative request lasts its whole stream (a second or more), and a level starts
            # with an engine that holds none of its requests: until the first of them has ended
            # the running set is still filling, every TTFT short, every completion missing. The
            # warm-up lasts at least that one request lifetime, so the windows see the steady
            # state (the running set of the rate, or the queue it builds).
            deadline = time.monotonic() + MAX_COUNT_WINDOW_S
            while not warm.completed and time.monotonic() < deadline:
                gevent.sleep(o.tick_s)
                warm = backend.collect()
        rule = SequentialRule.for_test(spec.sequential) if spec.sequential is not None else None
        # A window spans from one collect to another, so no request falls between windows.
        current = _Window(time.monotonic(), server_before=self._snapshot())
        windows: list[WindowStats] = []
        ticks: list[Tick] = []
        bound = spec.in_flight_bound()
        record: StepRecord | None = None
        self._step_ticks = []
        started = current.started
        while True:
            gevent.sleep(o.tick_s)
            tick = backend.collect()
            current.tick.add(tick)
            collected_at = time.monotonic()
            elapsed = collected_at - current.started
            if rule is not None:
                self._step_ticks.append(
                    _TickSample(collected_at - started, tick.completed, tick.errors, tick.sequence)
                )
                record = _feed(rule, tick) or record
            if spec.fail_fast is not None:
                t = current.tick
                reason = clearly_fails(
                    percentiles_us(t.latency, [90])[90] / 1000.0,
                    t.completed,
                    t.errors,
                    t.in_flight,
                    spec.fail_fast,
                    bound,
                    latency_rule=rule is None,
                    ttft_p90_ms=percentiles_us(t.tokens.ttft, [90])[90] / 1000.0
                    if t.tokens is not None and t.tokens.streams
                    else None,
                )
                if reason is not None:
                    stats, _ = self._close_window(len(windows), current, elapsed, spec)
                    windows.append(stats)
                    ticks.append(current.tick)
                    if rule is not None:
                        record = rule.stop(StepVerdict.FAIL, f"stopped early: {reason}")
                    return windows, ticks, reason, record
            decided = record is not None and record.verdict.final
            done = spec.window_closes(current.tick.completed, elapsed, MAX_COUNT_WINDOW_S)
            if not done and not decided:
                continue
            # A decided step closes its window where it stands (the last window is short).
            stats, after = self._close_window(len(windows), current, elapsed, spec)
            windows.append(stats)
            ticks.append(current.tick)
            if o.on_window is not None:
                o.on_window(spec, stats)
            if rule is not None:
                if decided:
                    break
                if len(windows) >= spec.max_windows:
                    record = rule.stop(
                        StepVerdict.BOUNDARY,
                        f"undecided at the step's cap of {spec.max_windows} windows",
                    )
                    break
            else:
                if is_stable(windows, spec.stability_pct, spec.stable_windows):
                    break
                if len(windows) >= spec.max_windows:
                    break
            current = _Window(collected_at, server_before=after)
        if rule is not None:  # the test used every request: so does the result
            return windows, ticks, None, record
        return windows, ticks[-spec.stable_windows :], None, None

    def _close_window(
        self, index: int, w: _Window, elapsed: float, spec: LoadSpec
    ) -> tuple[WindowStats, ServerSnapshot | None]:
        """The window's record, and the server snapshot that closes it (the next one's start)."""
        after = self._snapshot()
        view = server_view(w.server_before, after) if w.server_before and after else None
        t = w.tick
        lat = LatencySummary.from_histogram(t.latency)
        lag = LatencySummary.from_histogram(t.lag)
        stats = WindowStats(
            index=index,
            duration_s=elapsed,
            request_count=t.completed,
            error_count=t.errors,
            throughput_rps=(t.completed - t.errors) / elapsed if elapsed > 0 else 0.0,
            p50_ms=lat.p50_ms,
            p99_ms=lat.p99_ms,
            mean_ms=lat.mean_ms,
            send_lag_p99_ms=lag.p99_ms if spec.mode is LoadMode.REQUEST_RATE else 0.0,
            offered_rps=t.dispatched / elapsed if elapsed > 0 else 0.0,
            generator_cpu_pct=t.cpu_pct,
            max_in_flight=t.max_in_flight,
            server=view,
        )
        if t.tokens is not None and t.tokens.streams:
            stats = replace(
                stats,
                ttft_p99_ms=percentiles_us(t.tokens.ttft, [99])[99] / 1000.0,
                itl_p99_ms=percentiles_us(t.tokens.itl, [99])[99] / 1000.0,
            )
        return stats, after

    def _result(
        self,
        spec: LoadSpec,
        windows: list[WindowStats],
        ticks: list[Tick],
        stopped_early: str | None,
        processes: int,
        step: StepRecord | None = None,
        tail: Tick | None = None,
    ) -> Measurement:
        """The level's measurement: rates and counts over its windows; latency distributions
        over its windows and ``tail``, what its streams still in flight at their end did next
        (:meth:`_finish_streams`)."""
        o = self.options
        open_loop = spec.mode is LoadMode.REQUEST_RATE
        used = windows[-len(ticks) :] if ticks else []
        duration = sum(w.duration_s for w in used)
        total = Tick()
        for t in ticks:
            total.add(t)
        seen = total
        if tail is not None:
            seen = Tick()
            seen.add(total)
            seen.add(tail)
        lat = LatencySummary.from_histogram(seen.latency)
        service = LatencySummary.from_histogram(merge_histograms([seen.service]))
        lag = LatencySummary.from_histogram(total.lag)
        ok = total.completed - total.errors
        throughput = ok / duration if duration > 0 else 0.0
        offered = total.dispatched / duration if duration > 0 else 0.0
        cpu = max((w.generator_cpu_pct for w in used), default=0.0)
        checked = windows
        if step is not None and len(windows) < spec.stable_windows:
            # Decided within fewer windows than the check needs: check the step's equal parts.
            checked = _equal_parts(self._step_ticks, spec.stable_windows)
        stable = stopped_early is None and is_stable(
            checked, spec.stability_pct, spec.stable_windows
        )

        problems = generator_problems(
            GeneratorLimits(
                o.max_cpu_pct, o.max_send_lag_ms, min_offered_ratio=o.min_offered_ratio
            ),
            open_loop,
            cpu,
            total.dispatched,
            count_above_us(total.lag, o.max_send_lag_ms * 1000.0),
            spec.target * duration if open_loop and stopped_early is None else 0.0,
            spec.arrival,
        )
        gap_cv = send_gap_cv(total.sends) if open_loop else None
        late_share = (
            count_above_us(total.lag, 1000.0) / total.dispatched if total.dispatched else 0.0
        )
        messages = level_messages(
            spec,
            LevelFacts(
                problems=problems,
                send_lag_p99_ms=lag.p99_ms,
                stable=stable,
                checked_windows=None if checked is windows else len(checked),
                windows=len(windows),
                stopped_early=stopped_early,
                step_reason=step.reason if step is not None else None,
                offered_rps=offered,
                gap_cv=gap_cv,
                late_share=late_share,
                pool_size=o.pool_size,
                backlog_max=total.backlog_max,
                errors=total.errors,
                error_kinds=dict(total.error_kinds),
                scraper_errors=dict(self._scraper.errors) if self._scraper is not None else {},
            ),
        )
        return Measurement(
            mode=spec.mode,
            target=spec.target,
            throughput_rps=throughput,
            p50_ms=lat.p50_ms,
            p90_ms=lat.p90_ms,
            p95_ms=lat.p95_ms,
            p99_ms=lat.p99_ms,
            request_count=total.completed,
            error_count=total.errors,
            stable=stable,
            valid=not problems,
            send_lag_p99_ms=lag.p99_ms if open_loop else 0.0,
            server=combine_views([w.server for w in used]),
            arrival=spec.arrival.to_text() if open_loop else None,
            send_gap_cv=gap_cv,
            late_share_1ms=late_share if open_loop and total.dispatched else None,
            p999_ms=lat.p999_ms,
            mean_ms=lat.mean_ms,
            max_ms=lat.max_ms,
            latency_basis="intended_send" if open_loop else "actual_send",
            service_p50_ms=service.p50_ms,
            service_p99_ms=service.p99_ms,
            duration_s=duration,
            offered_rps=offered,
            generator_cpu_pct=cpu,
            max_in_flight=total.max_in_flight,
            errors=dict(total.error_kinds),
            messages=tuple(messages),
            stopped_early=stopped_early,
            windows=tuple(windows),
            protocol=o.protocol,
            workers=processes,
            step=step,
            classes=self._class_stats(spec, total),
            tokens=self._token_stats(spec, seen, duration, total),
        )

    def _token_stats(
        self, spec: LoadSpec, seen: Tick, duration: float, windows: Tick
    ) -> TokenStats | None:
        """A generative level's token figures: counts and rates (tokens/s, goodput against the
        step's goals, a capacity step, or the load's) of the streams the ``windows`` completed
        over ``duration``; distributions (TTFT, ITL) of every stream ``seen``, the streams
        still waiting for a first token at the end at their wait so far (None without
        streams)."""
        tally = TokenTally()
        if seen.tokens is not None:
            tally.add(seen.tokens)
        tally.add_waiting(seen.waiting)
        tally.add_first_tokens(seen.streaming)
        if not (tally.streams or tally.waiting):
            return None
        goals = spec.fail_fast or self.options.goals
        targets = (
            (
                goals.ttft_p99_ms,
                goals.itl_p99_ms,
                goals.p99_ms if math.isfinite(goals.p99_ms) else None,
            )
            if goals is not None
            else ()
        )
        dist = tally.summary(duration, *targets)
        if seen is windows:
            return dist
        counted = windows.tokens or TokenTally()
        tail = tally.streams - counted.streams + len(seen.streaming) // 2 + tally.waiting
        return counted.summary(duration, *targets).with_distributions_of(dist, tail)

    def _level_classes(self, spec: LoadSpec) -> tuple[RequestClass, ...]:
        """The traffic classes of ``spec``'s level, each share its part of the level's requests
        (classes at rates of their own: :func:`~analyzer.load.classes.level_classes`)."""
        if spec.mode is LoadMode.REQUEST_RATE:
            return level_classes(self.options.classes, spec.target)
        return tuple(self.options.classes)

    def _class_stats(self, spec: LoadSpec, total: Tick) -> tuple[ClassStats, ...]:
        """Each traffic class's requests and latencies (empty without a priority mix)."""
        out = []
        for index, klass in enumerate(self._level_classes(spec)):
            tally = total.classes[index] if index < len(total.classes) else None
            lat = LatencySummary.from_histogram(tally.latency) if tally else LatencySummary()
            out.append(
                ClassStats(
                    name=klass.name,
                    priority=klass.priority,
                    share=klass.share,
                    timeout_us=klass.timeout_us,
                    request_count=tally.completed if tally else 0,
                    error_count=tally.errors if tally else 0,
                    p50_ms=lat.p50_ms,
                    p90_ms=lat.p90_ms,
                    p99_ms=lat.p99_ms,
                    model=klass.model,
                )
            )
        return tuple(out)

    # ---- capacity ---------------------------------------------------------------------------------

    def drain(self, timeout_s: float) -> bool:
        """Wait until the server has nothing pending (True) or ``timeout_s`` passed (False)."""
        if self._scraper is None:
            gevent.sleep(min(timeout_s, 1.0))
            return True
        return self._scraper.wait_drained(timeout_s, sleep=gevent.sleep)

    def find_capacity(self, spec: CapacitySpec) -> CapacityResult:
        """Bracket, then bisect, the highest open-loop rate meeting ``spec.goals``
        (:func:`analyzer.measure.capacity.find_capacity`), draining the server between steps."""
        return find_capacity(spec, self.measure, lambda: self.drain(spec.drain_timeout_s))
