"""Measuring the gate's targets: each ``repeats`` times, interleaved with a live baseline.

:func:`measure_targets` re-measures invalid repeats (up to ``INVALID_RETRIES``) and checks the
targets are alive; the load generator is behind :data:`GeneratorFactory` (tests pass fakes;
:func:`locust_generators` imports Locust only when measuring).
"""

from __future__ import annotations

import contextlib
import dataclasses
import socket
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager
from typing import Any, Protocol

from analyzer.config.scenario import Scenario
from analyzer.config.sections import STREAM_PROTOCOLS
from analyzer.errors import TargetError
from analyzer.gate.plan import INVALID_RETRIES, Echo, MeasurePlan, _quiet, measurement_hash
from analyzer.measure.measurement import Measurement
from analyzer.measure.specs import LoadSpec
from analyzer.target.managed import ManagedServer
from analyzer.target.protocol import Target


@contextlib.contextmanager
def _started(target: Target | None) -> Iterator[None]:
    if target is None:
        yield
        return
    target.start()
    try:
        yield
    finally:
        target.stop()


class GateGenerator(Protocol):
    """What measure-and-gate needs from a load generator (``LocustLoadGenerator`` has it)."""

    def measure(self, spec: LoadSpec) -> Measurement: ...

    def drain(self, timeout_s: float) -> bool: ...


#: Makes the load generator for one started target (a context manager that owns it).
GeneratorFactory = Callable[[Target], AbstractContextManager[GateGenerator]]


def metrics_url_for(target: Target, given: Mapping[str, str]) -> str | None:
    """Where a target's ``/metrics`` is (GPU utilisation, memory, power in each measurement):
    the managed server's own port, else the URL given for that target's URL (``--metrics-url``
    for ``--url``); None lets the engine try ``<url>/metrics``."""
    return getattr(target, "metrics_url", "") or given.get(target.url) or None


def locust_generators(
    scenario: Scenario, metrics_urls: Mapping[str, str] | None = None
) -> GeneratorFactory:
    """The real generator factory: one Locust engine per target (gevent is imported on first use).

    ``metrics_urls`` maps a target URL to its ``/metrics`` URL (see :func:`metrics_url_for`).
    """
    from analyzer.load.engine import engine_options  # pure: no gevent yet

    def make(target: Target) -> AbstractContextManager[GateGenerator]:
        from analyzer.load import LocustLoadGenerator  # gevent: only when measuring

        return LocustLoadGenerator(
            engine_options(
                scenario,
                target.url,
                target.model,
                metrics_url=metrics_url_for(target, metrics_urls or {}),
                # A managed server's gRPC port (its ports are free ones, not HTTP + 1).
                grpc_url=getattr(target, "grpc_url", "") or None,
                # The scenario's generator processes: local ones (a count or auto), or remote.
                distributed=True,
            )
        )

    return make


def check_alive(target: Target) -> None:
    """Raise :class:`TargetError` when the server under test stopped answering.

    A managed server is not restarted here (as a sweep would): a gate must report that the
    build under test died, not measure a fresh process and pass.
    """
    if isinstance(target, ManagedServer):
        if not target.alive():
            raise TargetError(
                f"{target.server_name} died during the measurement (log: {target.log_path})"
            )
    else:
        target.ensure_alive()


def measure_targets(
    plan: MeasurePlan,
    candidate: Target,
    baseline: Target | None,
    generators: GeneratorFactory,
    echo: Echo = _quiet,
) -> tuple[list[Measurement], list[Measurement]]:
    """Measure ``plan.repeats`` times each target; alternate the order with a live baseline.

    Rounds go (baseline, candidate), (candidate, baseline), ... so a slow drift of the machine
    adds about the same to both sides. A repeat whose generator missed its schedule (invalid) is
    measured again, at most ``INVALID_RETRIES`` times. After every measurement the target must
    still answer.

    Each progress line carries the seconds since the targets were up (a CI log reads as a
    timeline).

    Returns:
        (candidate measurements, baseline measurements) in the order taken.

    Raises:
        TargetError: A target failed to start or stopped answering.
    """
    t0 = time.monotonic()

    def say(text: str) -> None:
        echo(f"[{time.monotonic() - t0:5.0f} s] {text}")

    with _started(candidate), _started(baseline), contextlib.ExitStack() as stack:
        t0 = time.monotonic()
        targets = {"candidate": candidate}
        if baseline is not None:
            targets["baseline"] = baseline
        gens = {name: stack.enter_context(generators(t)) for name, t in targets.items()}
        results: dict[str, list[Measurement]] = {name: [] for name in gens}
        for i in range(plan.repeats):
            order = list(gens)
            if baseline is not None and i % 2 == 0:
                order.reverse()
            for name in order:
                # Same seed for both sides of a round (paired), a new one per round.
                spec = dataclasses.replace(plan.spec, seed=plan.spec.seed + i)
                for attempt in range(1 + INVALID_RETRIES):
                    m = gens[name].measure(spec)
                    check_alive(targets[name])
                    gens[name].drain(30.0)
                    if m.valid or attempt == INVALID_RETRIES:
                        break
                    say(
                        f"{name} repeat {i + 1}: the load generator could not keep its "
                        "schedule (numbers describe the generator); measuring again"
                    )
                results[name].append(m)
                gpus = m.server.gpus if m.server else ()
                gpu = "".join(
                    f", GPU {g.utilization_pct_mean:.0f} % busy"
                    + (f" {g.memory_used_peak_mb:.0f} MiB" if g.memory_used_peak_mb else "")
                    for g in gpus
                    if g.utilization_pct_mean is not None
                )
                t = m.tokens
                tokens = (
                    f", TTFT p99 {t.ttft_p99_ms:.2f} ms, ITL p99 {t.itl_p99_ms:.2f} ms, "
                    f"{t.output_tokens_per_s:.1f} tok/s"
                    if t is not None
                    else ""
                )
                say(
                    f"{name} repeat {i + 1}/{plan.repeats}: {m.throughput_rps:.1f} req/s, "
                    f"p99 {m.p99_ms:.2f} ms{tokens}, errors {m.error_count}/{m.request_count}{gpu}"
                )
    return results["candidate"], results.get("baseline", [])


def live_environment(
    scenario: Scenario, target: Target, plan: MeasurePlan, url: str | None
) -> dict[str, Any]:
    """The environment recorded with a measured result (and checked against a baseline)."""
    return {
        "host": socket.gethostname(),
        "model": target.model,
        "device": target.device,
        "scenario_hash": measurement_hash(scenario, plan, target.device),
        "target_url": url or "managed reference server",
        "level": f"{plan.spec.mode.value} {plan.spec.target:g}",
        "protocol": scenario.model.protocol,
        "generator_processes": scenario.traffic.workers,
        # What each request carried (a data file by its sha256 too).
        "input": scenario.to_dict()["input"],
        **_requests(scenario),
    }


def _requests(scenario: Scenario) -> dict[str, Any]:
    """A token stream's request lengths (as ``perfsweep load --output`` records them); empty
    for requests answered once."""
    if scenario.model.protocol not in STREAM_PROTOCOLS:
        return {}
    return {"requests": scenario.traffic.lengths().record()}


def _gate_environment(env: Mapping[str, Any], level: str) -> dict[str, str | None]:
    return {
        "model": env.get("model"),
        "device": env.get("device"),
        "scenario_hash": env.get("scenario_hash"),
        "measure": level,
        "host": env.get("host"),
    }
