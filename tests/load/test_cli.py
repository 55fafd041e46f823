"""``perfsweep load`` as a user runs it: flags, exit codes, the table and the JSON file.

Usage errors end while the flags are checked, before the load engine is imported: they run in
the test process (``tests/support/cli.py``); everything that reaches a server is a subprocess.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.load.refserver import REPO_ROOT, RefServer, write_sim_model
from tests.support.cli import perfsweep_in_process
from tests.support.servers import write_model

PERFSWEEP = str(Path(sys.executable).parent / "perfsweep")


def _load(*args: str, timeout_s: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PERFSWEEP, "load", *args], capture_output=True, text=True, timeout=timeout_s, cwd=REPO_ROOT
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--model", "m"], "exactly one of"),
        (["--model", "m", "--concurrency", "1", "--request-rate", "5"], "exactly one of"),
        (["--model", "m", "--find-capacity"], "--p99-ms"),
        (["--model", "m", "--concurrency", "two"], "comma-separated"),
        (["--model", "m", "--request-rate", "5", "--protocol", "udp"], "is not one of"),
        (["--concurrency", "1"], "--model"),
        (["--model", "m", "--concurrency", "1", "--repeat-ratio", "1"], "repeat ratio"),
        (["--model", "m", "--concurrency", "1", "--unique-payloads", "0"], "unique payloads"),
        (["--model", "m", "--concurrency", "1", "--input-data", "nowhere.json"], "no such file"),
        (
            [
                "--model",
                "m",
                "--concurrency",
                "1",
                "--input-data",
                "zeros",
                "--repeat-ratio",
                "0.5",
            ],
            "apply to random data",
        ),
    ],
)
def test_usage_errors_exit_2_and_say_what_to_do(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    args: list[str],
    message: str,
) -> None:
    monkeypatch.chdir(REPO_ROOT)  # where _load runs the command
    done = perfsweep_in_process(monkeypatch, capsys, "load", *args)
    assert done.returncode == 2
    assert message in done.stderr


@pytest.mark.usefixtures("spawns")
def test_unreachable_target_exits_3() -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    done = _load("--url", f"127.0.0.1:{port}", "--model", "m", "--concurrency", "1")
    assert done.returncode == 3
    assert "cannot reach" in done.stderr


@pytest.mark.usefixtures("spawns")
def test_fixed_levels_write_versioned_json(tmp_path: Path) -> None:
    write_sim_model(tmp_path / "repo", "cli", 5.0, max_batch_size=4)
    out = tmp_path / "levels.json"
    with RefServer(tmp_path / "repo", ("cli",)) as srv:
        done = _load(
            "--url",
            srv.http_url,
            "--model",
            "cli",
            "--metrics-url",
            srv.metrics_url,
            "--concurrency",
            "1,3",
            "--window-requests",
            "60",
            "--max-windows",
            "3",
            "--warmup-s",
            "0.3",
            "--batch-size",
            "2",
            "--output",
            str(out),
        )
    assert done.returncode == 0, done.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert doc["format_version"] == 1 and doc["kind"] == "perfsweep.load"
    assert doc["environment"]["model"] == "cli" and doc["environment"]["packages"]["locust"]
    one, three = doc["results"]
    assert (one["mode"], one["target"], three["target"]) == ("concurrency", 1, 3)
    for m in (one, three):
        assert m["error_count"] == 0
        assert all(w["request_count"] >= 60 for w in m["windows"])  # count windows
        assert m["server"]["inference_count"] == 2 * m["server"]["success_count"]  # batch 2
        assert any("coordinated omission" in msg for msg in m["messages"])
    # three users on one 5 ms device: about three times one user's throughput is impossible,
    # the device serialises them, so latency grows instead
    assert three["p50_ms"] > one["p50_ms"]
    assert "c=1 " in done.stdout and "p99" in done.stdout  # the final table


@pytest.mark.usefixtures("spawns")
@pytest.mark.slow
def test_master_and_worker_commands(tmp_path: Path) -> None:
    """``--master`` + ``--worker --master-host``: the cross-machine mode, here on loopback."""
    write_sim_model(tmp_path / "repo", "mw", 5.0)
    out = tmp_path / "mw.json"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    with RefServer(tmp_path / "repo", ("mw",)) as srv:
        master = subprocess.Popen(
            [
                PERFSWEEP,
                "load",
                "--url",
                srv.http_url,
                "--model",
                "mw",
                "--metrics-url",
                srv.metrics_url,
                "--master",
                "--expect-workers",
                "1",
                "--master-port",
                port,
                "--request-rate",
                "30",
                "--arrival",
                "constant",
                "--window-s",
                "1",
                "--max-windows",
                "3",
                "--warmup-s",
                "0.5",
                "--output",
                str(out),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=REPO_ROOT,
        )
        worker = subprocess.Popen(
            [PERFSWEEP, "load", "--worker", "--master-host", "127.0.0.1", "--master-port", port],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            cwd=REPO_ROOT,
        )
        try:
            _, master_err = master.communicate(timeout=180)
            worker.wait(timeout=60)  # the worker leaves when the master quits
        finally:
            for proc in (master, worker):
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
    assert master.returncode == 0, master_err[-3000:]
    assert worker.returncode == 0
    (m,) = json.loads(out.read_text())["results"]
    assert m["workers"] == 1 and m["error_count"] == 0
    assert m["request_count"] == pytest.approx(30 * m["duration_s"], rel=0.15)
    assert m["server"]["success_count"] == pytest.approx(m["request_count"], abs=4)


def _write_tensor_model(repo: Path) -> None:
    """Identity over a [3, 4] INT32 tensor and a BYTES pair: shapes the server checks."""
    write_model(
        repo,
        "tensors",
        textwrap.dedent(
            """\
            name: "tensors"
            backend: "identity"
            max_batch_size: 4
            input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 3, 4 ] },
                    { name: "INPUT1" data_type: TYPE_STRING dims: [ 2 ] } ]
            output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 3, 4 ] },
                     { name: "OUTPUT1" data_type: TYPE_STRING dims: [ 2 ] } ]
            """
        ),
    )


@pytest.mark.usefixtures("spawns")
def test_perf_analyzer_json_data_file_is_sent_with_the_model_shapes(tmp_path: Path) -> None:
    """A perf_analyzer data file through Locust: flat lists for [3, 4] (not 1x12), strings,
    b64, three entries at batch size 2; the server checks every request's shapes."""
    import base64

    import numpy as np

    _write_tensor_model(tmp_path / "repo")
    b64 = base64.b64encode(np.arange(12, dtype="<i4").tobytes()).decode()
    data = tmp_path / "data.json"
    data.write_text(
        json.dumps(
            {
                "data": [
                    {"INPUT0": list(range(12)), "INPUT1": ["a", "bc"]},
                    {"INPUT0": {"b64": b64}, "INPUT1": ["d", ""]},
                    {"INPUT0": {"content": [1] * 12, "shape": [3, 4]}, "INPUT1": ["e", "f"]},
                ]
            }
        )
    )
    out = tmp_path / "data-run.json"
    with RefServer(tmp_path / "repo", ("tensors",)) as srv:
        done = _load(
            "--url",
            srv.http_url,
            "--model",
            "tensors",
            "--metrics-url",
            srv.metrics_url,
            "--concurrency",
            "2",
            "--window-requests",
            "40",
            "--max-windows",
            "3",
            "--warmup-s",
            "0.2",
            "--batch-size",
            "2",
            "--input-data",
            str(data),
            "--output",
            str(out),
        )
        assert done.returncode == 0, done.stderr[-3000:]
        hostile = tmp_path / "hostile.json"
        hostile.write_text(json.dumps({"data": [{"INPUT0": [1, 2, 3], "INPUT1": ["a", "b"]}]}))
        refused = _load(
            "--url", srv.http_url, "--model", "tensors", "--concurrency", "1",
            "--input-data", str(hostile),
        )  # fmt: skip
    (m,) = json.loads(out.read_text())["results"]
    assert m["error_count"] == 0 and m["request_count"] >= 120
    assert m["server"]["inference_count"] == 2 * m["server"]["success_count"]  # batch 2
    recorded = json.loads(out.read_text())["environment"]["input"]
    assert recorded["mode"] == "file" and recorded["data_file"] == str(data)
    assert recorded["batch_size"] == 2
    assert refused.returncode == 2, refused.stderr[-2000:]
    assert f"{hostile}: entry 0: input 'INPUT0' (INT32) has 3 values" in refused.stderr
