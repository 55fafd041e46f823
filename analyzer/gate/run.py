"""The gate's measurement and the one call ``perfsweep gate`` makes (library, no CLI).

``perfsweep gate`` (``analyzer/commands/gate.py``) parses its flags into a :class:`GateCommand`,
calls :func:`run_gate`, and maps the report to an exit code. Everything between starts here
(criteria and plan in :mod:`analyzer.gate.plan`, the repeats in :mod:`analyzer.gate.measuring`):

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

import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from analyzer.config.scenario import (
    access_overrides,
    bundled_scenario,
    generator_overrides,
    input_overrides,
    load_scenario,
    traffic_overrides,
)
from analyzer.config.sections import GateSection
from analyzer.errors import InputError
from analyzer.gate.inputs import from_measurements, read_result
from analyzer.gate.measuring import (
    GeneratorFactory,
    _gate_environment,
    live_environment,
    locust_generators,
    measure_targets,
)
from analyzer.gate.plan import (
    Echo,
    GateFlags,
    MeasureRequest,
    _quiet,
    plan_measurement,
    project_gate_table,
    resolve_criteria,
)
from analyzer.gate.render import render_console, render_junit, render_markdown
from analyzer.gate.verdict import GateInput, GateReport, evaluate
from analyzer.measure.generator import load_output_dict
from analyzer.measure.measurement import Measurement
from analyzer.target.factory import make_target
from analyzer.target.remote import RemoteTarget


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
        **traffic_overrides(None, r.trace, r.trace_unit),
        "traffic.input_tokens": r.input_tokens,
        "traffic.output_tokens": r.output_tokens,
        "traffic.dataset": str(r.dataset) if r.dataset else None,
        **generator_overrides(
            r.protocol,
            r.metrics_url,
            r.workers,
            r.expect_workers,
            r.master_bind_host,
            r.master_port,
        ),
        "model.url": r.url,
        **access_overrides(
            r.grpc_url,
            r.ssl_ca,
            r.ssl_cert,
            r.ssl_key,
            bool(r.ssl_insecure),
            r.header,
            r.header_file,
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
    # RemoteTarget checks the URL (the one place URLs are checked). A gate never waits for a
    # --url server to return (wait_s 0): it reports that the server died. A live baseline is
    # reached as the candidate is (the same TLS files and headers).
    baseline_target = (
        RemoteTarget(
            r.baseline_url, scenario.model.name, wait_s=0.0, access=scenario.model.access()
        )
        if r.baseline_url
        else None
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
