"""The outputs CI reads: a gate report as Markdown, console text and JUnit XML."""

from __future__ import annotations

import xml.etree.ElementTree as ET

from analyzer.gate.verdict import CriterionResult, GateInput, GateReport


def _describe(g: GateInput) -> str:
    env = g.environment
    facts = [f"{k} {env[k]}" for k in ("model", "device", "measure") if env.get(k)]
    n = len(g.throughput_samples)
    facts.append(f"{n} {g.sample_basis}" if g.sample_basis != "single" else "1 sample")
    if g.tokens is not None:
        n = len(g.tokens.ttft_p99_samples)
        facts.append(f"token streams, {n} sample{'s' if n != 1 else ''}")
    return f"{g.label} ({', '.join(facts)})"


_COLUMNS = ("criterion", "measured", "limit", "baseline", "change", "verdict")


def _row(r: CriterionResult) -> tuple[str, ...]:
    return (r.name, r.measured, r.limit, r.baseline, r.change, r.outcome.value)


def render_markdown(report: GateReport) -> str:
    """A Markdown summary (for ``$GITHUB_STEP_SUMMARY`` and merge-request comments)."""
    title = "passed" if report.passed else "FAILED"
    lines = [
        f"### perfsweep gate: {title}",
        "",
        "| " + " | ".join(_COLUMNS) + " |",
        "|" + "---|" * len(_COLUMNS),
    ]
    for r in report.results:
        cells = [c.replace("|", "\\|") for c in _row(r)]
        if r.failed:
            cells[-1] = f"**{cells[-1]}**"
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", f"- candidate: {_describe(report.candidate)}"]
    if report.baseline is not None:
        lines.append(f"- baseline: {_describe(report.baseline)}")
    lines += [f"- {r.name}: {r.detail}" for r in report.results]
    lines += [f"- forced despite: {reason}" for reason in report.forced]
    notes = [*report.candidate.notes, *(report.baseline.notes if report.baseline else ())]
    lines += [f"- note: {note}" for note in notes]
    return "\n".join(lines) + "\n"


def render_console(report: GateReport) -> str:
    """A short plain-text table for the CI log."""
    rows = [_COLUMNS, *(_row(r) for r in report.results)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(_COLUMNS))]
    text = [
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in rows
    ]
    text.insert(1, "  ".join("-" * w for w in widths))
    verdict = "PASSED" if report.passed else f"FAILED ({len(report.failures)} of {len(rows) - 1})"
    return "\n".join([*text, f"gate {verdict}"]) + "\n"


def render_junit(report: GateReport, suite: str = "perfsweep gate") -> str:
    """JUnit XML: one test case per criterion; a failed criterion carries a ``<failure>``."""
    failures = str(len(report.failures))
    tests = str(len(report.results))
    root = ET.Element(
        "testsuites", name=suite, tests=tests, failures=failures, errors="0", time="0"
    )
    ts = ET.SubElement(
        root,
        "testsuite",
        name=suite,
        tests=tests,
        failures=failures,
        errors="0",
        skipped="0",
        time="0",
    )
    props = ET.SubElement(ts, "properties")
    ET.SubElement(props, "property", name="candidate", value=_describe(report.candidate))
    if report.baseline is not None:
        ET.SubElement(props, "property", name="baseline", value=_describe(report.baseline))
    for r in report.results:
        case = ET.SubElement(ts, "testcase", classname="perfsweep.gate", name=r.name, time="0")
        if r.failed:
            failure = ET.SubElement(case, "failure", message=r.detail, type="GateFailed")
            failure.text = f"measured {r.measured}, limit {r.limit}"
        out = ET.SubElement(case, "system-out")
        out.text = f"{r.outcome.value}: {r.detail}"
    ET.indent(root)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(root, "unicode") + "\n"
