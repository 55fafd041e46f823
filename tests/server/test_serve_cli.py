"""``perfsweep serve`` as a user runs it: a subprocess, its ready line, exit codes."""

from __future__ import annotations

import signal
import socket
import sys
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.server.conftest import MODELS, write_model, write_repository
from tests.support.servers import PORT_ZERO, ChildProcess

pytestmark = pytest.mark.usefixtures("spawns")


def perfsweep(log: Path, *args: str) -> ChildProcess:
    """``perfsweep ARGS`` in a subprocess, from the repository root (stderr into ``log``)."""
    script = Path(sys.executable).with_name("perfsweep")
    command = (
        [str(script)]
        if script.exists()
        else [sys.executable, "-c", "from analyzer.cli import main; main()"]
    )
    return ChildProcess([*command, *args], log)


FREE_PORTS = PORT_ZERO


def finish(process: ChildProcess, timeout_s: float = 120) -> tuple[int, str]:
    try:
        code = process.wait(timeout_s)
    finally:
        process.stop()
    # rich wraps long error lines at the terminal width: compare whitespace-normalised text.
    return code, " ".join(process.stderr().split())


@pytest.mark.slow
def test_serve_bundled_resnet50_over_http_and_grpc(tmp_path: Path) -> None:
    process = perfsweep(
        tmp_path / "perfsweep.log", "serve", "--model", "resnet50", "--device", "cpu", *FREE_PORTS
    )
    try:
        addresses = process.wait_ready(timeout_s=300)
        image = np.random.default_rng(0).random((1, 3, 224, 224), dtype=np.float32)
        http = httpclient.InferenceServerClient(addresses.http_url, network_timeout=120)
        http_input = httpclient.InferInput("input", [1, 3, 224, 224], "FP32")
        http_input.set_data_from_numpy(image)
        http_logits = http.infer("resnet50", [http_input]).as_numpy("output")
        config = http.get_model_config("resnet50")
        http.close()
        grpc = grpcclient.InferenceServerClient(addresses.grpc_url)
        grpc_input = grpcclient.InferInput("input", [1, 3, 224, 224], "FP32")
        grpc_input.set_data_from_numpy(image)
        grpc_logits = grpc.infer("resnet50", [grpc_input], client_timeout=120).as_numpy("output")
        grpc.close()
    finally:
        process.proc.send_signal(signal.SIGTERM)
        code, err = finish(process)
    assert http_logits.shape == (1, 1000)
    assert np.isfinite(http_logits).all()
    # Same model, same input: both protocols return the same logits.
    np.testing.assert_allclose(http_logits, grpc_logits, rtol=1e-5, atol=1e-5)
    assert config["backend"] == "onnxruntime"
    assert code == 0, err


def test_serve_bad_repository_exits_2(tmp_path: Path) -> None:
    process = perfsweep(
        tmp_path / "perfsweep.log",
        "serve",
        "--model-repository",
        str(tmp_path / "missing"),
        *FREE_PORTS,
    )
    code, err = finish(process)
    assert code == 2
    assert "is not a directory" in err
    assert "--model-repository" in err


def test_serve_bad_config_exits_2(tmp_path: Path) -> None:
    write_model(tmp_path, "bad", 'backend: "identity" max_batch_size: -3', add_name=True)
    process = perfsweep(
        tmp_path / "perfsweep.log", "serve", "--model-repository", str(tmp_path), *FREE_PORTS
    )
    code, err = finish(process)
    assert code == 2
    assert "model 'bad' failed to load" in err


def test_serve_unknown_bundled_model_exits_2(tmp_path: Path) -> None:
    process = perfsweep(tmp_path / "perfsweep.log", "serve", "--model", "resnet51", *FREE_PORTS)
    code, err = finish(process)
    assert code == 2
    assert "not a bundled model" in err


def test_serve_port_in_use_exits_3(tmp_path: Path) -> None:
    repository = write_repository(tmp_path, {"nobatch": MODELS["nobatch"]})
    with socket.socket() as blocker:
        blocker.bind(("127.0.0.1", 0))
        blocker.listen()
        port = str(blocker.getsockname()[1])
        process = perfsweep(
            tmp_path / "perfsweep.log",
            "serve",
            "--model-repository",
            str(repository),
            "--http-port",
            port,
            "--grpc-port",
            "0",
            "--metrics-port",
            "0",
        )
        code, err = finish(process)
    assert code == 3
    assert f"127.0.0.1:{port}" in err
    assert "--http-port 0" in err


def test_serve_passes_the_read_timeout_to_the_server(tmp_path: Path) -> None:
    # The server validates the value, so a refused one shows that the flag reaches it.
    repository = write_repository(tmp_path, {"nobatch": MODELS["nobatch"]})
    process = perfsweep(
        tmp_path / "perfsweep.log",
        "serve",
        "--model-repository",
        str(repository),
        "--http-read-timeout",
        "0",
        *FREE_PORTS,
    )
    code, err = finish(process)
    assert code == 2
    assert "http-read-timeout 0.0 must be a positive number of seconds" in err


def test_serve_passes_the_rate_limiter_flags_to_the_server(tmp_path: Path) -> None:
    # Capacity 1 for a resource an instance needs 2 of fails the load with Triton's reason,
    # which shows that both flags reach the server; with --rate-limit off they are ignored.
    write_model(
        tmp_path,
        "limited",
        'backend: "identity" max_batch_size: 4 '
        'input [{ name: "INPUT0" data_type: TYPE_FP32 dims: [1] }] '
        'output [{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [1] }] '
        'instance_group [{ count: 1 kind: KIND_CPU rate_limiter { resources [{ name: "R" count: 2 }] } }]',
        add_name=True,
    )
    process = perfsweep(
        tmp_path / "perfsweep.log",
        "serve",
        "--model-repository",
        str(tmp_path),
        "--rate-limit",
        "execution_count",
        "--rate-limit-resource",
        "R:1",
        *FREE_PORTS,
    )
    code, err = finish(process)
    assert code == 2
    assert 'Resource count for "R" is limited to 1' in err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--http-port", "notanint"], "Invalid value for '--http-port'"),
        (["--no-such-flag"], "No such option: --no-such-flag"),
    ],
)
def test_a_bad_flag_is_a_usage_error_not_a_traceback(
    tmp_path: Path, args: list[str], message: str
) -> None:
    code, err = finish(perfsweep(tmp_path / "perfsweep.log", "serve", *args))
    assert code == 2, err
    assert message in err and "Traceback" not in err
