"""``perfsweep gate`` on result files: exit codes, outputs for CI, criteria from TOML tables."""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from analyzer.cli import main
from analyzer.measure.generator import load_output_dict
from analyzer.measure.measurement import Measurement, WindowStats
from analyzer.measure.specs import LoadMode


def level(rps: float, p99: float, errors: int = 0) -> Measurement:
    windows = tuple(WindowStats(i, 1.0, int(rps), 0, rps, p99 / 2, p99, p99 / 2) for i in range(2))
    return Measurement(
        mode=LoadMode.REQUEST_RATE,
        target=50.0,
        throughput_rps=rps,
        p50_ms=p99 / 2,
        p90_ms=p99,
        p95_ms=p99,
        p99_ms=p99,
        request_count=1000,
        error_count=errors,
        stable=True,
        valid=True,
        send_lag_p99_ms=0.0,
        server=None,
        windows=windows,
    )


def result_file(
    path: Path, rps: list[float], p99: list[float], device: str = "sim", errors: int = 0
) -> Path:
    env = {"model": "m", "device": device, "scenario_hash": "h"}
    doc = load_output_dict([level(r, p, errors) for r, p in zip(rps, p99, strict=True)], None, env)
    path.write_text(json.dumps(doc))
    return path


def flat(text: str) -> str:
    """Messages as one line (rich wraps long lines on stderr)."""
    return " ".join(text.split())


def run(monkeypatch: pytest.MonkeyPatch, *args: str) -> int:
    monkeypatch.setattr(sys, "argv", ["perfsweep", "gate", *args])
    try:
        main()
    except SystemExit as exc:
        return int(exc.code or 0)
    return 0


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    return {
        "base": result_file(tmp_path / "base.json", [50, 50.5, 49.8, 50.2], [8.0, 8.2, 7.9, 8.1]),
        "same": result_file(tmp_path / "same.json", [50.1, 49.9, 50.3, 50.0], [8.1, 8.0, 8.2, 7.9]),
        "slow": result_file(tmp_path / "slow.json", [50, 50.1, 49.9, 50], [9.9, 10.2, 10.0, 10.1]),
        "other": result_file(tmp_path / "other.json", [50, 50, 50, 50], [8, 8, 8, 8], "cuda"),
    }


def test_pass_writes_junit_markdown_and_the_github_step_summary(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    files: dict[str, Path],
    capsys: pytest.CaptureFixture[str],
) -> None:
    step_summary = tmp_path / "step_summary.md"
    step_summary.write_text("earlier step\n")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(step_summary))
    code = run(
        monkeypatch,
        str(files["same"]),
        "--p99-ms", "20",
        "--baseline", str(files["base"]),
        "--max-regression", "5%",
        "--junit", str(tmp_path / "out" / "gate.xml"),
        "--markdown", str(tmp_path / "gate.md"),
    )  # fmt: skip
    assert code == 0
    out = capsys.readouterr().out
    assert "gate PASSED" in out
    assert step_summary.read_text().startswith("earlier step\n### perfsweep gate: passed")
    assert (tmp_path / "gate.md").read_text() in step_summary.read_text()
    suite = ET.parse(tmp_path / "out" / "gate.xml").getroot().find("testsuite")
    assert suite is not None and suite.get("tests") == "3" and suite.get("failures") == "0"


def test_significant_regression_exits_1(
    monkeypatch: pytest.MonkeyPatch, files: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    code = run(
        monkeypatch, str(files["slow"]), "--baseline", str(files["base"]), "--max-regression", "5%"
    )
    assert code == 1
    captured = capsys.readouterr()
    assert "p99_ms regression <= 5%" in captured.out and "significant" in captured.out
    assert "performance gate failed: p99_ms regression <= 5%" in flat(captured.err)


def test_absolute_failure_exits_1(monkeypatch: pytest.MonkeyPatch, files: dict[str, Path]) -> None:
    assert run(monkeypatch, str(files["base"]), "--p99-ms", "5") == 1
    assert run(monkeypatch, str(files["base"]), "--min-throughput", "50", "--p99-ms", "9") == 0


def test_incompatible_baseline_exits_2_unless_forced(
    monkeypatch: pytest.MonkeyPatch, files: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    args = [str(files["same"]), "--baseline", str(files["other"]), "--max-regression", "5%"]
    assert run(monkeypatch, *args) == 2
    assert "device differs: baseline 'cuda', candidate 'sim'" in flat(capsys.readouterr().err)
    assert run(monkeypatch, *args, "--force") == 0
    assert "forced despite: device differs" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--max-regression", "lots"], "takes a percentage"),
        (["--max-regression", "5%"], "go together"),
        (["--url", "http://127.0.0.1:1", "--p99-ms", "5"], "--url measure a live target"),
        (["--ttft-p99-ms", "5", "--input-tokens", "64"], "--input-tokens measure a live target"),
        (["--itl-p99-ms", "5"], "measured no token streams"),
        (["--min-tokens-per-s", "-1"], "--min-tokens-per-s must be >= 0"),
        ([], "nothing to gate on"),
    ],
)
def test_usage_errors_exit_2(
    monkeypatch: pytest.MonkeyPatch,
    files: dict[str, Path],
    capsys: pytest.CaptureFixture[str],
    extra: list[str],
    message: str,
) -> None:
    assert run(monkeypatch, str(files["base"]), *extra) == 2
    assert message in flat(capsys.readouterr().err)


def test_missing_result_exits_2(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    assert run(monkeypatch, str(tmp_path / "nope.json"), "--p99-ms", "5") == 2


def test_criteria_from_a_scenario_gate_table(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    files: dict[str, Path],
    capsys: pytest.CaptureFixture[str],
) -> None:
    scenario = tmp_path / "ci" / "scenario.toml"
    scenario.parent.mkdir()
    scenario.write_text('[gate]\np99_ms = 50\nmax_regression_pct = 5\nbaseline = "../base.json"\n')
    assert run(monkeypatch, str(files["slow"]), "--scenario", str(scenario)) == 1
    out = capsys.readouterr().out
    assert "p99_ms <= 50" in out and "p99_ms regression <= 5%" in out
    # A flag wins over the table.
    assert run(monkeypatch, str(files["slow"]), "--scenario", str(scenario), "--p99-ms", "9") == 1
    assert "p99_ms <= 9 " in capsys.readouterr().out


def test_criteria_from_perfsweep_toml(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, files: dict[str, Path]
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "perfsweep.toml").write_text("[tool]\nx = 1\n\n[gate]\np99_ms = 9\n")
    assert run(monkeypatch, str(files["base"])) == 0
    assert run(monkeypatch, str(files["slow"])) == 1
    (tmp_path / "perfsweep.toml").write_text("[gate]\np99 = 9\n")
    assert run(monkeypatch, str(files["base"])) == 2


def test_a_message_with_brackets_prints_them(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    files: dict[str, Path],
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.chdir(tmp_path)  # no ./perfsweep.toml: no criteria at all
    assert run(monkeypatch, str(files["same"])) == 2
    err = flat(capsys.readouterr().err)
    assert "(or a [gate] table)" in err, err  # text, not rich markup


def test_other_schemes_are_refused_with_a_clear_message(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    code = run(monkeypatch, "--url", "ftp://127.0.0.1:1", "--rate-rps", "5", "--p99-ms", "50")
    assert code == 2
    assert "must start with http:// or https://" in flat(capsys.readouterr().err)


def test_a_missing_ca_file_is_refused_before_any_load(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    args = ("--url", "https://127.0.0.1:1", "--ssl-ca", "nope.pem", "--rate-rps", "5")
    code = run(monkeypatch, *args, "--p99-ms", "50")
    assert code == 2
    assert "--ssl-ca nope.pem: no such file" in flat(capsys.readouterr().err)
