"""What a gate judges and what it measures: the criteria and the plan of one measurement.

Criteria come from flags > ``--scenario``'s ``[gate]`` > ``./perfsweep.toml``'s ``[gate]`` >
(measure mode only) the scenario's ``[goals]`` (:func:`resolve_criteria`); measure mode plans
one fixed load level (:func:`plan_measurement`) and fingerprints it (:func:`measurement_hash`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from analyzer.config.scenario import Scenario
from analyzer.config.sections import STREAM_PROTOCOLS, GateSection
from analyzer.config.traffic import TrafficMode
from analyzer.errors import InputError
from analyzer.gate.verdict import Criteria
from analyzer.measure.arrivals import CONSTANT, parse_arrival
from analyzer.measure.specs import LoadMode, LoadSpec

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


#: Offered rate relative to the throughput floor when no rate is given: an adequate server then
#: clears the floor even though a finite window never completes exactly the offered rate.
FLOOR_HEADROOM = 1.1

PROJECT_FILE = Path("perfsweep.toml")

#: An invalid repeat (the generator, not the server, missed its schedule) is measured again up to
#: this many times before it counts as it is (its note then says so).
INVALID_RETRIES = 2

#: Where progress lines go (the CLI passes ``typer.echo``).
Echo = Callable[[str], Any]


def _quiet(_: str) -> None:
    """The default echo of a library call: say nothing."""


def project_gate_table(path: Path = PROJECT_FILE) -> GateSection | None:
    """The ``[gate]`` table of ``perfsweep.toml`` (other tables belong to other tools)."""
    if not path.is_file():
        return None
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise InputError(f"{path} is not valid TOML: {exc}") from exc
    table = data.get("gate")
    if table is None:
        return None
    try:
        return GateSection.model_validate(table)
    except ValueError as exc:
        raise InputError(f"{path} [gate]: {exc}".splitlines()[0]) from exc


@dataclass(frozen=True)
class GateFlags:
    """The criteria flags as given (None = not given)."""

    p99_ms: float | None = None
    min_throughput_rps: float | None = None
    max_error_rate: float | None = None
    max_regression: float | None = None
    alpha: float | None = None
    ttft_p99_ms: float | None = None
    itl_p99_ms: float | None = None
    min_tokens_per_s: float | None = None


@dataclass(frozen=True)
class MeasureRequest:
    """Measure-and-gate flags as given (None = not given; the scenario or a default decides)."""

    scenario_file: Path | None = None
    model: str | None = None
    model_repository: Path | None = None
    device: str | None = None
    #: The candidate: a running server; None = the managed reference server.
    url: str | None = None
    #: A baseline result file, or ...
    baseline: Path | None = None
    #: ... a live baseline server, measured interleaved with the candidate.
    baseline_url: str | None = None
    repeats: int | None = None
    rate_rps: float | None = None
    concurrency: int | None = None
    #: The arrival process's short form (default: the scenario's when it sets one, else
    #: constant), or a trace to replay.
    arrival: str | None = None
    trace: str | None = None
    trace_unit: str | None = None
    warmup_s: float | None = None
    window_s: float | None = None
    windows: int | None = None
    #: Save the candidate's (and the live baseline's) measurements as a load document.
    output: Path | None = None
    baseline_output: Path | None = None
    #: Prometheus ``/metrics`` of the ``url`` server (GPU figures); the managed server's is found.
    metrics_url: str | None = None
    #: Request data (``analyzer.commands.input_flags``): ``[input]`` of the scenario.
    shape: list[str] | None = None
    input_data: str | None = None
    batch_size: int | None = None
    unique_payloads: int | None = None
    repeat_ratio: float | None = None
    shared_memory: str | None = None
    #: ``model.protocol`` (http or grpc), ``traffic.workers`` (local generator processes: a
    #: count or "auto") and remote workers (``traffic.expect_workers`` and the master's address).
    protocol: str | None = None
    workers: str | None = None
    expect_workers: int | None = None
    master_bind_host: str | None = None
    master_port: int | None = None
    #: A generative model's requests (``traffic.input_tokens``, ``output_tokens``, ``dataset``;
    #: ``--protocol`` names its token stream).
    input_tokens: str | None = None
    output_tokens: str | None = None
    dataset: Path | None = None
    #: How a secured server is reached (``analyzer.config.access``): its gRPC address, TLS files
    #: and headers (values read from flags, ``${VAR}`` and files; never written down).
    grpc_url: str | None = None
    ssl_ca: Path | None = None
    ssl_cert: Path | None = None
    ssl_key: Path | None = None
    ssl_insecure: bool | None = None
    header: list[str] | None = None
    header_file: list[Path] | None = None

    def live_flags(self) -> list[str]:
        """The flags given that only make sense when measuring."""
        skip = {"scenario_file", "baseline"}
        return [
            "--" + f.name.replace("_", "-")
            for f in dataclasses.fields(self)
            if f.name not in skip and getattr(self, f.name) is not None
        ]


def resolve_criteria(
    flags: GateFlags, table: GateSection | None, goals_fallback: Scenario | None = None
) -> Criteria:
    """Flags win over the ``[gate]`` table; with no criterion at all, the scenario's goals."""
    t = table or GateSection()

    def pick(name: str) -> Any:
        given = getattr(flags, name)
        return given if given is not None else getattr(t, name)

    p99, floor, errors = pick("p99_ms"), pick("min_throughput_rps"), pick("max_error_rate")
    tokens = {k: pick(k) for k in ("ttft_p99_ms", "itl_p99_ms", "min_tokens_per_s")}
    regression = flags.max_regression
    if regression is None and t.max_regression_pct is not None:
        regression = t.max_regression_pct / 100.0
    given = (p99, floor, errors, regression, *tokens.values())
    if goals_fallback is not None and all(v is None for v in given):
        g = goals_fallback.goals
        errors, floor = g.max_error_rate, g.min_throughput_rps or None
        tokens.update(ttft_p99_ms=g.ttft_p99_ms, itl_p99_ms=g.itl_p99_ms)
        # Token goals replace the end-to-end p99 (a stream's length is not its latency), as a
        # sweep judges them; p99 is gated then only when the scenario sets it.
        token_goals = g.ttft_p99_ms is not None or g.itl_p99_ms is not None
        p99 = None if token_goals and "p99_ms" not in g.model_fields_set else g.p99_ms
    return Criteria(
        p99_ms=p99,
        min_throughput_rps=floor,
        max_error_rate=errors,
        max_regression=regression,
        alpha=flags.alpha if flags.alpha is not None else t.alpha,
        **tokens,
    )


@dataclass(frozen=True)
class MeasurePlan:
    """What one repeat measures, identical for candidate and live baseline."""

    spec: LoadSpec
    repeats: int

    def describe(self) -> str:
        unit = "req/s" if self.spec.mode is LoadMode.REQUEST_RATE else "users"
        return f"{self.spec.target:g} {unit}, {self.repeats} repeat(s)"


def plan_measurement(
    scenario: Scenario,
    criteria: Criteria,
    repeats: int,
    rate_rps: float | None,
    concurrency: int | None,
    arrival: str | None,
    warmup_s: float | None,
    window_s: float | None,
    windows: int,
) -> MeasurePlan:
    """The fixed load level each repeat measures (flags > scenario > throughput floor)."""
    t, b = scenario.traffic, scenario.budget
    if rate_rps is not None and concurrency is not None:
        raise InputError("give --rate-rps or --concurrency, not both")
    if concurrency is not None or (rate_rps is None and t.mode is TrafficMode.CONCURRENCY):
        level = concurrency or t.concurrency
        if level is None:
            raise InputError("closed-loop gate needs --concurrency N (or traffic.concurrency)")
        mode, target = LoadMode.CONCURRENCY, float(level)
    else:
        rate = rate_rps or t.rate_rps
        if rate is None and criteria.min_throughput_rps:
            rate = criteria.min_throughput_rps * FLOOR_HEADROOM
        if rate is None:
            raise InputError(
                "measure-and-gate needs a load level: --rate-rps R (or traffic.rate_rps, or "
                "--min-throughput-rps, which offers 10% above the floor)"
            )
        mode, target = LoadMode.REQUEST_RATE, float(rate)
    # Constant arrivals unless the scenario asks otherwise: a throughput floor then does not
    # flake on Poisson noise in the number of arrivals per window.
    if arrival is not None and t.trace is not None:
        raise InputError("--arrival shapes generated traffic; a --trace replays its own")
    if arrival is not None:
        process = parse_arrival(arrival)
    elif "arrival" in t.model_fields_set or t.trace is not None:
        process = t.arrival_process()
    else:
        process = CONSTANT
    if windows < 1:
        raise InputError(f"--windows must be >= 1, got {windows}")
    spec = LoadSpec(
        mode=mode,
        target=target,
        arrival=process,
        warmup_s=b.warmup_s if warmup_s is None else warmup_s,
        window_s=b.window_s if window_s is None else window_s,
        # The gate wants comparable repeats, not early stops: every repeat runs all windows.
        stable_windows=windows,
        max_windows=windows,
        seed=scenario.run.seed,
    )
    if repeats < 1:
        raise InputError(f"--repeats must be >= 1, got {repeats}")
    return MeasurePlan(spec, repeats)


def measurement_hash(scenario: Scenario, plan: MeasurePlan, device: str) -> str:
    """Fingerprint of what was measured (not where: URLs and paths change between CI runs)."""
    s = plan.spec
    data: dict[str, Any] = {
        "model": scenario.model.name,
        "device": device,
        "input": scenario.input.identity(),
        "level": [s.mode.value, s.target, s.arrival.to_text()],
        "windows": [s.warmup_s, s.window_s, s.max_windows],
    }
    if scenario.model.protocol != "http":  # HTTP, the only protocol before, keeps its hashes
        data["protocol"] = scenario.model.protocol
    if s.arrival.trace is not None:  # a trace by its bytes, not by its file name
        data["trace_sha256"] = scenario.traffic.trace_sha256
    if scenario.traffic.classes:  # a priority mix changes what was sent; none keeps the hash
        data["classes"] = [c.model_dump() for c in scenario.traffic.classes]
    if scenario.model.protocol in STREAM_PROTOCOLS:  # a token stream: its requests' lengths
        lengths = scenario.traffic.lengths()
        if lengths.dataset:  # a dataset by its lines, not by its file name
            data["dataset"] = [[r.input_tokens, r.output_tokens, r.prompt] for r in lengths.dataset]
        else:
            data["lengths"] = [lengths.input.to_text(), lengths.output.to_text()]
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]
