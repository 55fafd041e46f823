"""Golden outputs of a gate: the Markdown summary, the console table and JUnit XML (parsed back)."""

from __future__ import annotations

import xml.etree.ElementTree as ET

from analyzer.gate.render import render_console, render_junit, render_markdown
from analyzer.gate.verdict import Criteria, GateInput, GateReport, TokenFigures, evaluate

ENV = {"model": "resnet50", "device": "sim", "scenario_hash": "h1", "measure": "request_rate 50"}


def report() -> GateReport:
    """A fixed report: p99 passes, the throughput floor fails, throughput regresses significantly,
    p99's change is within tolerance."""
    base = GateInput(
        "base.json",
        502.0,
        20.0,
        0.0,
        (500.0, 502.0, 504.0, 502.0),
        (20.0, 20.1, 19.9, 20.0),
        "repeats",
        ENV,
    )
    cand = GateInput(
        "new.json",
        451.0,
        20.5,
        0.0,
        (450.0, 451.0, 452.0, 451.0),
        (20.5, 20.4, 20.6, 20.5),
        "repeats",
        ENV,
        notes=("new.json repeat 2: invalid measurement (generator limits): lag",),
    )
    return evaluate(
        cand, Criteria(p99_ms=100, min_throughput_rps=500, max_regression=0.05), baseline=base
    )


GOLDEN_MARKDOWN = """\
### perfsweep gate: FAILED

| criterion | measured | limit | baseline | change | verdict |
|---|---|---|---|---|---|
| p99_ms <= 100 | 20.50 ms | <= 100 ms |  |  | pass |
| throughput_rps >= 500 | 451.0 req/s | >= 500 req/s |  |  | **fail** |
| throughput_rps regression <= 5% | 451.0 req/s | worse by <= 5% | 502.0 req/s | -10.2% | **fail** |
| p99_ms regression <= 5% | 20.50 ms | worse by <= 5% | 20.00 ms | +2.5% | pass |

- candidate: new.json (model resnet50, device sim, measure request_rate 50, 4 repeats)
- baseline: base.json (model resnet50, device sim, measure request_rate 50, 4 repeats)
- p99_ms <= 100: p99 20.50 ms within the 100 ms limit
- throughput_rps >= 500: throughput 451.0 req/s is below the 500 req/s floor
- throughput_rps regression <= 5%: median 10.2% lower than the baseline: a regression beyond 5%, significant (one-sided Mann-Whitney p=0.0143 <= 0.05, n=4/4)
- p99_ms regression <= 5%: median 2.5% higher than the baseline: within the 5% tolerance
- note: new.json repeat 2: invalid measurement (generator limits): lag
"""

GOLDEN_CONSOLE = """\
criterion                        measured     limit           baseline     change  verdict
-------------------------------  -----------  --------------  -----------  ------  -------
p99_ms <= 100                    20.50 ms     <= 100 ms                            pass
throughput_rps >= 500            451.0 req/s  >= 500 req/s                         fail
throughput_rps regression <= 5%  451.0 req/s  worse by <= 5%  502.0 req/s  -10.2%  fail
p99_ms regression <= 5%          20.50 ms     worse by <= 5%  20.00 ms     +2.5%   pass
gate FAILED (2 of 4)
"""

GOLDEN_JUNIT = """\
<?xml version="1.0" encoding="utf-8"?>
<testsuites name="perfsweep gate" tests="4" failures="2" errors="0" time="0">
  <testsuite name="perfsweep gate" tests="4" failures="2" errors="0" skipped="0" time="0">
    <properties>
      <property name="candidate" value="new.json (model resnet50, device sim, measure request_rate 50, 4 repeats)" />
      <property name="baseline" value="base.json (model resnet50, device sim, measure request_rate 50, 4 repeats)" />
    </properties>
    <testcase classname="perfsweep.gate" name="p99_ms &lt;= 100" time="0">
      <system-out>pass: p99 20.50 ms within the 100 ms limit</system-out>
    </testcase>
    <testcase classname="perfsweep.gate" name="throughput_rps &gt;= 500" time="0">
      <failure message="throughput 451.0 req/s is below the 500 req/s floor" type="GateFailed">measured 451.0 req/s, limit &gt;= 500 req/s</failure>
      <system-out>fail: throughput 451.0 req/s is below the 500 req/s floor</system-out>
    </testcase>
    <testcase classname="perfsweep.gate" name="throughput_rps regression &lt;= 5%" time="0">
      <failure message="median 10.2% lower than the baseline: a regression beyond 5%, significant (one-sided Mann-Whitney p=0.0143 &lt;= 0.05, n=4/4)" type="GateFailed">measured 451.0 req/s, limit worse by &lt;= 5%</failure>
      <system-out>fail: median 10.2% lower than the baseline: a regression beyond 5%, significant (one-sided Mann-Whitney p=0.0143 &lt;= 0.05, n=4/4)</system-out>
    </testcase>
    <testcase classname="perfsweep.gate" name="p99_ms regression &lt;= 5%" time="0">
      <system-out>pass: median 2.5% higher than the baseline: within the 5% tolerance</system-out>
    </testcase>
  </testsuite>
</testsuites>
"""


def test_golden_markdown() -> None:
    assert render_markdown(report()) == GOLDEN_MARKDOWN


def test_golden_console_table() -> None:
    assert render_console(report()) == GOLDEN_CONSOLE


def test_golden_junit() -> None:
    assert render_junit(report()) == GOLDEN_JUNIT


def test_junit_parses_back_to_one_case_per_criterion() -> None:
    r = report()
    root = ET.fromstring(render_junit(r))
    assert root.tag == "testsuites"
    (suite,) = root.findall("testsuite")
    cases = suite.findall("testcase")
    assert [c.get("name") for c in cases] == [x.name for x in r.results]
    failed = [c.get("name") for c in cases if c.find("failure") is not None]
    assert failed == [x.name for x in r.failures]
    assert int(suite.get("tests", "")) == len(cases) == 4
    assert int(suite.get("failures", "")) == len(failed) == 2
    # The JUnit schema's required attributes (Jenkins/GitLab read these).
    for case in cases:
        assert case.get("classname") and case.get("name") and case.get("time") is not None
    for failure in suite.iter("failure"):
        assert failure.get("message") and failure.get("type")


def test_markdown_escapes_table_pipes_and_a_passing_gate_says_so() -> None:
    env = {**ENV, "model": "a|b"}
    cand = GateInput("x|y.json", 10.0, 5.0, 0.0, (10.0,), (5.0,), "single", env)
    text = render_markdown(evaluate(cand, Criteria(p99_ms=6)))
    assert text.startswith("### perfsweep gate: passed\n")
    row = next(line for line in text.splitlines() if line.startswith("| p99_ms"))
    assert row.count("|") == 7  # no cell split by the label's pipe
    assert "x|y.json" in text  # list items keep the label verbatim


def token_report() -> GateReport:
    """A generative model's gate: absolute token criteria and token regressions (3 repeats):
    TTFT over its limit and 30 % worse than the baseline in every repeat (the smallest p-value
    three repeats a side can reach, 0.05), the other figures within tolerance."""
    env = {**ENV, "model": "tinyllm", "measure": "request_rate 4"}

    def result(label: str, ttft: tuple[float, ...], tokens_per_s: tuple[float, ...]) -> GateInput:
        figures = TokenFigures(ttft[1], 12.0, tokens_per_s[1], ttft, (12.0,) * 3, tokens_per_s)
        samples = ((4.0, 4.0, 4.0), (900.0, 910.0, 920.0))
        return GateInput(label, 4.0, 910.0, 0.0, *samples, "repeats", env, tokens=figures)

    base = result("base.json", (100.0, 101.0, 102.0), (128.0, 128.0, 128.0))
    cand = result("new.json", (130.0, 131.0, 132.0), (127.0, 128.0, 127.0))
    criteria = Criteria(ttft_p99_ms=120, min_tokens_per_s=100, max_regression=0.1)
    return evaluate(cand, criteria, baseline=base)


GOLDEN_TOKEN_CONSOLE = """\
criterion                         measured     limit            baseline     change  verdict
--------------------------------  -----------  ---------------  -----------  ------  -------
ttft_p99_ms <= 120                131.00 ms    <= 120 ms                             fail
tokens_per_s >= 100               128.0 tok/s  >= 100 tok/s                          pass
throughput_rps regression <= 10%  4.0 req/s    worse by <= 10%  4.0 req/s    +0.0%   pass
p99_ms regression <= 10%          910.00 ms    worse by <= 10%  910.00 ms    +0.0%   pass
ttft_p99_ms regression <= 10%     131.00 ms    worse by <= 10%  101.00 ms    +29.7%  fail
itl_p99_ms regression <= 10%      12.00 ms     worse by <= 10%  12.00 ms     +0.0%   pass
tokens_per_s regression <= 10%    128.0 tok/s  worse by <= 10%  128.0 tok/s  -0.8%   pass
gate FAILED (2 of 7)
"""


def test_golden_console_table_of_token_criteria() -> None:
    assert render_console(token_report()) == GOLDEN_TOKEN_CONSOLE


def test_token_criteria_are_junit_cases_and_markdown_rows() -> None:
    r = token_report()
    cases = ET.fromstring(render_junit(r)).findall("testsuite/testcase")
    assert [c.get("name") for c in cases] == [x.name for x in r.results]
    assert [c.get("name") for c in cases if c.find("failure") is not None] == [
        "ttft_p99_ms <= 120",
        "ttft_p99_ms regression <= 10%",
    ]
    text = render_markdown(r)
    assert "| ttft_p99_ms regression <= 10% | 131.00 ms | worse by <= 10% | 101.00 ms |" in text
    assert "- candidate: new.json (model tinyllm, device sim, measure request_rate 4, " in text
    assert "3 repeats, token streams, 3 samples)" in text
