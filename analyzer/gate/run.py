"""The gate's measurement and the one call ``perfsweep gate`` makes (library, no CLI).

``perfsweep gate`` (``analyzer/commands/gate.py``) parses its flags into a :class:`GateCommand`,
calls :func:`run_gate`, and maps the report to an exit code. Everything between lives here:

* criteria: flags > ``--scenario``'s ``[gate]`` > ``./perfsweep.toml``'s ``[gate]`` >
  (measure mode only) the scenario's ``[goals]`` (:func:`resolve_criteria`);
* file mode: read a result (and a baseline) and judge it (:func:`judge_result`);
* measure mode: plan one fixed load level (:func:`plan_measurement`), start the targets
  (:func:`analyzer.target.factory.make_target`), measure each ``repeats`` times, interleaved with a
  live baseline, re-measuring invalid repeats (:func:`measure_targets`), fingerprint what was
  measured (:func:`measurement_hash`), judge (:func:`measure_and_gate`);
* outputs: console lines through ``echo``, Markdown, JUnit XML and the GitHub step summary
  (:func:`publish`).

The verdicts, readers and renderers are :mod:`analyzer.gate.verdict`'s. The load generator is behind
:data:`GeneratorFactory` (tests pass fakes); Locust is imported only when measuring.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import socket
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from analyzer.config.scenario import (
    Scenario,
    bundled_scenario,
    generator_overrides,
    input_overrides,
    load_scenario,
)
from analyzer.config.sections import GateSection
from analyzer.errors import InputError, TargetError
from analyzer.gate.inputs import from_measurements, read_result
from analyzer.gate.render import render_console, render_junit, render_markdown
from analyzer.gate.verdict import Criteria, GateInput, GateReport, evaluate
from analyzer.measure.generator import load_output_dict
from analyzer.measure.measurement import Measurement
from analyzer.measure.specs import Arrival, LoadMode, LoadSpec
from analyzer.target.factory import make_target
from analyzer.target.managed import ManagedServer
from analyzer.target.protocol import Target
from analyzer.target.remote import RemoteTarget

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
    arrival: str | None = None
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
    p99 = flags.p99_ms if flags.p99_ms is not None else t.p99_ms
    floor = (
        flags.min_throughput_rps if flags.min_throughput_rps is not None else t.min_throughput_rps
    )
    errors = flags.max_error_rate if flags.max_error_rate is not None else t.max_error_rate
    regression = flags.max_regression
    if regression is None and t.max_regression_pct is not None:
        regression = t.max_regression_pct / 100.0
    nothing = p99 is None and floor is None and errors is None and regression is None
    if goals_fallback is not None and nothing:
        g = goals_fallback.goals
        p99, errors = g.p99_ms, g.max_error_rate
        floor = g.min_throughput_rps or None
    return Criteria(
        p99_ms=p99,
        min_throughput_rps=floor,
        max_error_rate=errors,
        max_regression=regression,
        alpha=flags.alpha if flags.alpha is not None else t.alpha,
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
    if concurrency is not None or (rate_rps is None and t.mode == "concurrency"):
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
                "--min-throughput, which offers 10% above the floor)"
            )
        mode, target = LoadMode.REQUEST_RATE, float(rate)
    # Constant arrivals unless the scenario asks otherwise: a throughput floor then does not
    # flake on Poisson noise in the number of arrivals per window.
    chosen = arrival or (t.arrival if "arrival" in t.model_fields_set else "constant")
    if chosen not in ("poisson", "constant"):
        raise InputError(f"--arrival must be poisson or constant, got {chosen!r}")
    if windows < 1:
        raise InputError(f"--windows must be >= 1, got {windows}")
    spec = LoadSpec(
        mode=mode,
        target=target,
        arrival=Arrival(chosen),
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
        "level": [s.mode.value, s.target, s.arrival.value],
        "windows": [s.warmup_s, s.window_s, s.max_windows],
    }
    if scenario.model.protocol != "http":  # HTTP, the only protocol before, keeps its hashes
        data["protocol"] = scenario.model.protocol
    if scenario.traffic.classes:  # a priority mix changes what was sent; none keeps the hash
        data["classes"] = [c.model_dump() for c in scenario.traffic.classes]
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


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
                say(
                    f"{name} repeat {i + 1}/{plan.repeats}: {m.throughput_rps:.1f} req/s, "
                    f"p99 {m.p99_ms:.2f} ms, errors {m.error_count}/{m.request_count}{gpu}"
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
    }


def _gate_environment(env: Mapping[str, Any], level: str) -> dict[str, str | None]:
    return {
        "model": env.get("model"),
        "device": env.get("device"),
        "scenario_hash": env.get("scenario_hash"),
        "measure": level,
        "host": env.get("host"),
    }


def publish(
    report: GateReport,
    junit: Path | None,
    markdown: Path | None,
    echo: Echo,
    step_summary: Path | None = None,
) -> None:
    """Console table (through ``echo``), Markdown (``markdown`` and appended to
    ``step_summary``, the CI's ``$GITHUB_STEP_SUMMARY``), JUnit XML."""
    echo(render_console(report).rstrip("\n"))
    for r in report.results:
        echo(f"  {r.name}: {r.detail}")
    for note in (*report.candidate.notes, *(report.baseline.notes if report.baseline else ())):
        echo(f"  note: {note}")
    for reason in report.forced:
        echo(f"  forced despite: {reason}")
    text = render_markdown(report)
    if markdown is not None:
        markdown.parent.mkdir(parents=True, exist_ok=True)
        markdown.write_text(text, encoding="utf-8")
    if step_summary is not None:
        with open(step_summary, "a", encoding="utf-8") as handle:
            handle.write(text + "\n")
    if junit is not None:
        junit.parent.mkdir(parents=True, exist_ok=True)
        junit.write_text(render_junit(report), encoding="utf-8")


def _write_load_doc(path: Path, measurements: list[Measurement], env: Mapping[str, Any]) -> None:
    from analyzer.rundir.results import write_json

    write_json(path, load_output_dict(measurements, None, env))


def _table_baseline(table: GateSection | None, scenario_file: Path | None) -> Path | None:
    """``[gate] baseline`` resolved relative to the file that declares it."""
    if table is None or table.baseline is None:
        return None
    path = Path(table.baseline)
    if not path.is_absolute() and scenario_file is not None:
        path = scenario_file.parent / path
    return path


def measure_and_gate(
    flags: GateFlags,
    request: MeasureRequest,
    level: float | None = None,
    force: bool = False,
    echo: Echo = _quiet,
    generators: GeneratorFactory | None = None,
) -> GateReport:
    """Measure the candidate (and a live baseline, interleaved), then judge it.

    ``generators`` replaces the Locust engine (tests pass a fake).

    Raises:
        InputError: Inconsistent flags or an unreadable scenario/baseline.
        TargetError: A target failed to start or stopped answering.
    """
    r = request
    if r.baseline is not None and r.baseline_url is not None:
        raise InputError("give --baseline (a result file) or --baseline-url (live), not both")
    overrides = {
        "model.name": r.model,
        "model.repository": str(r.model_repository) if r.model_repository else None,
        "model.device": r.device,
        **input_overrides(
            r.shape, r.input_data, r.batch_size, r.unique_payloads, r.repeat_ratio, r.shared_memory
        ),
        **generator_overrides(
            r.protocol,
            r.metrics_url,
            r.workers,
            r.expect_workers,
            r.master_bind_host,
            r.master_port,
        ),
    }
    path = r.scenario_file
    if path is None and r.url is None and r.model_repository is None:
        path = bundled_scenario(r.model or "resnet50", r.device)
    scenario = load_scenario(path, overrides)
    if scenario.traffic.expect_workers and r.baseline_url is not None:
        raise InputError(
            "--expect-workers measures one live target: remote workers follow one Locust "
            "master, and a live baseline needs a second; compare against a result file "
            "(--baseline FILE) instead of --baseline-url"
        )
    url = r.url or scenario.model.url
    table = scenario.gate if r.scenario_file is not None else None
    table = table or project_gate_table()
    criteria = resolve_criteria(flags, table, goals_fallback=scenario)
    base_path = r.baseline or _table_baseline(table, r.scenario_file)
    if base_path is None and r.baseline_url is None and criteria.max_regression is not None:
        raise InputError("--max-regression needs --baseline FILE or --baseline-url URL")
    repeats = r.repeats if r.repeats is not None else (table or GateSection()).repeats
    plan = plan_measurement(
        scenario,
        criteria,
        repeats,
        r.rate_rps,
        r.concurrency,
        r.arrival,
        r.warmup_s,
        r.window_s,
        r.windows if r.windows is not None else 2,
    )
    base_file = read_result(base_path, level) if base_path else None
    echo(f"perfsweep gate: measuring {scenario.model.name} at {plan.describe()}")
    # RemoteTarget checks the URL (https:// refused, the one place URLs are checked). A gate
    # never waits for a --url server to return (wait_s 0): it reports that the server died.
    baseline_target = (
        RemoteTarget(r.baseline_url, scenario.model.name, wait_s=0.0) if r.baseline_url else None
    )
    with tempfile.TemporaryDirectory(prefix="perfsweep-gate-") as tmp:
        candidate_target = make_target(scenario, Path(tmp), url)
        if isinstance(candidate_target, RemoteTarget):
            candidate_target.wait_s = 0.0
        metrics_urls = {}
        if url and scenario.model.metrics_url:
            metrics_urls[candidate_target.url] = scenario.model.metrics_url
        cand_ms, base_ms = measure_targets(
            plan,
            candidate_target,
            baseline_target,
            generators or locust_generators(scenario, metrics_urls),
            echo,
        )
        cand_env = live_environment(scenario, candidate_target, plan, url)
    level_text = f"{plan.spec.mode.value} {plan.spec.target:g}"
    if r.output is not None:
        _write_load_doc(r.output, cand_ms, cand_env)
    candidate = from_measurements(
        cand_ms, url or "managed reference server", _gate_environment(cand_env, level_text)
    )
    base: GateInput | None = base_file
    if baseline_target is not None:
        base_env = {**cand_env, "target_url": r.baseline_url}
        if r.baseline_output is not None:
            _write_load_doc(r.baseline_output, base_ms, base_env)
        base = from_measurements(
            base_ms, str(r.baseline_url), _gate_environment(base_env, level_text)
        )
    return evaluate(candidate, criteria, base, force=force)


def judge_result(
    result: Path,
    flags: GateFlags,
    request: MeasureRequest,
    level: float | None = None,
    force: bool = False,
) -> GateReport:
    """File mode: judge a result that exists (and its baseline file).

    Raises:
        InputError: A flag that only makes sense when measuring, or an unreadable
            result/baseline/scenario.
    """
    given = request.live_flags()
    if given:
        raise InputError(
            f"{', '.join(given)} measure a live target; drop them to judge {result}, "
            "or drop RESULT to measure"
        )
    scenario_file = request.scenario_file
    table = load_scenario(scenario_file).gate if scenario_file is not None else None
    table = table or project_gate_table()
    criteria = resolve_criteria(flags, table)
    base_path = request.baseline or _table_baseline(table, scenario_file)
    candidate = read_result(result, level)
    base = read_result(base_path, level) if base_path else None
    return evaluate(candidate, criteria, base, force=force)


@dataclass(frozen=True)
class GateCommand:
    """One ``perfsweep gate``: what to judge, by which criteria, and where the outputs go.

    Attributes:
        result: A run directory, summary.json or load document to judge; None = measure now.
        flags: The criteria flags as given.
        request: The measure-mode flags (and ``--scenario`` / ``--baseline`` of both modes).
        level: The load level (target) to judge in a load document.
        force: Compare results from different environments anyway.
        junit: Write JUnit XML here.
        markdown: Write the Markdown summary here.
        step_summary: Append the Markdown here too (the CI's ``$GITHUB_STEP_SUMMARY``).
    """

    result: Path | None
    flags: GateFlags
    request: MeasureRequest
    level: float | None = None
    force: bool = False
    junit: Path | None = None
    markdown: Path | None = None
    step_summary: Path | None = None


def run_gate(
    command: GateCommand, echo: Echo = _quiet, generators: GeneratorFactory | None = None
) -> GateReport:
    """Judge ``command.result`` (or measure the targets now), then publish the report.

    The caller decides what a failed report means (``perfsweep gate`` exits 1).

    Raises:
        InputError: Inconsistent flags or unreadable inputs.
        TargetError: A target failed to start or stopped answering.
    """
    c = command
    if c.result is None:
        report = measure_and_gate(c.flags, c.request, c.level, c.force, echo, generators)
    else:
        report = judge_result(c.result, c.flags, c.request, c.level, c.force)
    publish(report, c.junit, c.markdown, echo, c.step_summary)
    return report
