"""The server-overhead benchmark runs end to end and writes a well-formed result file.

No timing is asserted here (timing claims live in ``benchmarks/README.md``); this only proves
that one short run drives both servers with the same client and records what it measured.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.real_triton import TritonInstall

pytestmark = [pytest.mark.usefixtures("quiet_machine"), pytest.mark.triton, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]


def test_short_run_measures_both_servers(triton_install: TritonInstall, tmp_path: Path) -> None:
    output = tmp_path / "result.json"
    completed = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "server_overhead.py"),
            "--concurrency", "1", "4",
            "--duration-s", "0.5",
            "--warmup-s", "0.2",
            "--rounds", "1",
            "--output", str(output),
        ],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=ROOT,
    )  # fmt: skip
    assert completed.returncode == 0, completed.stderr[-3000:]
    document = json.loads(output.read_text())
    assert document["format_version"] == 1
    assert document["environment"]["triton_version"].startswith("2.")
    rows = {(r["server"], r["concurrency"]): r for r in document["results"]}
    assert set(rows) == {(s, c) for s in ("reference", "triton") for c in (1, 4)}
    for row in rows.values():
        assert row["requests"] > 0 and row["errors"] == 0
        assert row["p50_ms"] <= row["p99_ms"]
        # Every response was counted by the server too: both saw executions of the model.
        assert row["mean_batch_size"] >= 1.0
        assert row["server_cpu_us"] > 0
    assert [q["concurrency"] for q in document["ratios_reference_over_triton"]] == [1, 4]
    assert "| reference | 1 |" in completed.stdout
