"""Starting and stopping the server: ``python -m reference_server``, options, startup errors."""

from __future__ import annotations

import signal
import socket
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from reference_server.app import ServerOptions, ServerThread
from reference_server.core.errors import Code, ServerError
from reference_server.ready import ServerAddresses, parse_ready_line
from tests.server.conftest import MODELS, raw_request, write_model, write_repository
from tests.support.servers import PORT_ZERO, ChildProcess, reference_server_command


def start_subprocess(log: Path, *args: str) -> ChildProcess:
    """``python -m reference_server ARGS`` (stderr into ``log``)."""
    return ChildProcess(reference_server_command(*args), log)


def test_ready_line_round_trip() -> None:
    addresses = ServerAddresses("127.0.0.1", 8000, 8001, 8002)
    line = addresses.ready_line()
    assert line == (
        "perfsweep reference server ready: http=127.0.0.1:8000 grpc=127.0.0.1:8001 "
        "metrics=127.0.0.1:8002"
    )
    assert parse_ready_line(line) == addresses
    assert parse_ready_line("something else") is None


def test_options_are_validated_at_the_edge() -> None:
    with pytest.raises(ServerError, match="not a TCP port"):
        ServerOptions(http_port=70000)
    with pytest.raises(ServerError, match="unknown device 'tpu'"):
        ServerOptions(device="tpu")
    defaults = ServerOptions()
    assert (defaults.host, defaults.http_port, defaults.grpc_port, defaults.metrics_port) == (
        "127.0.0.1",
        8000,
        8001,
        8002,
    )
    assert defaults.max_input_size_bytes == 64 * 2**20


@pytest.mark.usefixtures("spawns")
def test_python_dash_m_serves_and_stops_on_sigterm(tmp_path: Path) -> None:
    repository = write_repository(tmp_path, {"nobatch": MODELS["nobatch"]})
    process = start_subprocess(
        tmp_path / "server.log", "--model-repository", str(repository), *PORT_ZERO
    )
    try:
        addresses = process.wait_ready()
        assert addresses.host == "127.0.0.1"
        assert len({addresses.http_port, addresses.grpc_port, addresses.metrics_port}) == 3
        tensor = np.arange(4, dtype=np.int32).reshape(2, 2)
        http = httpclient.InferenceServerClient(addresses.http_url)
        http_input = httpclient.InferInput("INPUT0", [2, 2], "INT32")
        http_input.set_data_from_numpy(tensor)
        assert http.infer("nobatch", [http_input]).as_numpy("OUTPUT0").tolist() == [[0, 1], [2, 3]]
        http.close()
        grpc = grpcclient.InferenceServerClient(addresses.grpc_url)
        grpc_input = grpcclient.InferInput("INPUT0", [2, 2], "INT32")
        grpc_input.set_data_from_numpy(tensor)
        assert grpc.infer("nobatch", [grpc_input]).as_numpy("OUTPUT0").tolist() == [[0, 1], [2, 3]]
        grpc.close()
        status, _, body = raw_request(
            f"127.0.0.1:{addresses.metrics_port}", "GET", "/metrics", timeout_s=10
        )
        assert status == 200
        assert b'nv_inference_request_success{model="nobatch",version="1"} 2' in body
    finally:
        returncode = process.stop(60)
    err = process.stderr()
    assert returncode == 0, err
    assert "Traceback" not in err


@pytest.mark.usefixtures("spawns")
def test_python_dash_m_startup_errors_exit_2_with_the_fix(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere"
    process = start_subprocess(
        tmp_path / "server.log", "--model-repository", str(missing), *PORT_ZERO
    )
    returncode = process.wait(120)
    err = process.stderr()
    process.stop()
    assert returncode == 2
    assert f"model repository '{missing}' is not a directory" in err
    assert "Traceback" not in err


@pytest.mark.usefixtures("serves")
def test_busy_port_names_the_flag(tmp_path: Path) -> None:
    repository = write_repository(tmp_path, {"nobatch": MODELS["nobatch"]})
    with socket.socket() as blocker:
        blocker.bind(("127.0.0.1", 0))
        blocker.listen()
        port = blocker.getsockname()[1]
        for flag in ("http_port", "grpc_port", "metrics_port"):
            ports = {"http_port": 0, "grpc_port": 0, "metrics_port": 0, flag: port}
            options = ServerOptions(model_repositories=(repository,), **ports)
            with pytest.raises(ServerError) as info:
                ServerThread(options, keep_ports=True).start()
            assert info.value.code is Code.UNAVAILABLE
            assert f"127.0.0.1:{port}" in info.value.message
            assert f"--{flag.replace('_', '-')} 0" in info.value.message


@pytest.mark.usefixtures("serves")
def test_a_model_that_fails_to_load_fails_startup(tmp_path: Path) -> None:
    write_model(
        tmp_path,
        "broken",
        'backend: "identity" max_batch_size: 2 dynamic_batching { preferred_batch_size: [4] }\n'
        'input { name: "I" data_type: TYPE_FP32 dims: [1] }\n'
        'output { name: "O" data_type: TYPE_FP32 dims: [1] }',
    )
    with pytest.raises(ServerError) as info:
        ServerThread(ServerOptions(model_repositories=(tmp_path,))).start()
    assert info.value.code is Code.INVALID_ARG
    assert "model 'broken' failed to load" in info.value.message
    assert "fix its config.pbtxt" in info.value.message
    with pytest.raises(ServerError, match="model 'ghost' is not in the model repository"):
        ServerThread(ServerOptions(model_repositories=(tmp_path,), models=("ghost",))).start()


@pytest.mark.usefixtures("serves")
def test_a_model_without_a_version_folder_names_the_folder_to_create(tmp_path: Path) -> None:
    config = (
        'backend: "identity" max_batch_size: 2\n'
        'input { name: "I" data_type: TYPE_FP32 dims: [1] }\n'
        'output { name: "O" data_type: TYPE_FP32 dims: [1] }'
    )
    model_dir = write_model(tmp_path, "bare", config, versions=(), add_name=True)
    with pytest.raises(ServerError) as info:
        ServerThread(ServerOptions(model_repositories=(tmp_path,))).start()
    assert info.value.code is Code.INVALID_ARG
    assert info.value.message == (
        f"model 'bare' has no version folder: create {model_dir / '1'}/"
    ), info.value.message


def test_no_repository_and_no_bundled_model_is_refused() -> None:
    with pytest.raises(ServerError, match="not a bundled model"):
        ServerThread(ServerOptions(models=("mine",))).start()


@pytest.mark.usefixtures("serves")
def test_server_thread_exposes_core_and_stops(tmp_path: Path) -> None:
    repository = write_repository(tmp_path, {"nobatch": MODELS["nobatch"]})
    server = ServerThread(ServerOptions(model_repositories=(repository,))).start()
    try:
        assert server.core.model_ready("nobatch")
        assert raw_request(server.http_url, "GET", "/v2/health/ready")[0] == 200
        url = server.http_url
    finally:
        server.stop()
    with pytest.raises(OSError):
        raw_request(url, "GET", "/v2/health/live", timeout_s=5)
    with pytest.raises(RuntimeError, match="not running"):
        _ = server.http_url


@pytest.mark.usefixtures("spawns")
def test_python_dash_m_bundled_model_with_sim_device(tmp_path: Path) -> None:
    """No --model-repository: the bundled resnet50 is materialised (simulated device: no ONNX)."""
    process = start_subprocess(
        tmp_path / "server.log", "--model", "resnet50", "--device", "sim", *PORT_ZERO
    )
    try:
        addresses = process.wait_ready()
        status, _, body = raw_request(addresses.http_url, "GET", "/v2/models/resnet50/config")
        assert status == 200
        assert b'"backend":"simulated"' in body
    finally:
        returncode = process.stop(60)
    assert returncode == 0, process.stderr()


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
@pytest.mark.usefixtures("spawns")
def test_shutdown_answers_the_requests_in_flight(tmp_path: Path, signum: int) -> None:
    """A signal while one request executes and one waits: both get an HTTP answer (the running
    one 200, the waiting one 200 or 503), then the process exits 0."""
    import threading

    from tests.server.conftest import SLOW_MODEL, wait_until

    write_model(tmp_path / "repo", "slow", SLOW_MODEL % 1000, add_name=True)
    process = start_subprocess(
        tmp_path / "server.log", "--model-repository", str(tmp_path / "repo"), *PORT_ZERO
    )
    answers: list[int | str] = []

    def send(url: str) -> None:
        body = b'{"inputs":[{"name":"INPUT0","shape":[1,4],"datatype":"FP32","data":[1,2,3,4]}]}'
        try:
            answers.append(raw_request(url, "POST", "/v2/models/slow/infer", body)[0])
        except OSError as exc:
            answers.append(repr(exc))

    try:
        addresses = process.wait_ready()
        senders = [threading.Thread(target=send, args=(addresses.http_url,)) for _ in range(2)]
        for sender in senders:
            sender.start()
        # One executes (1 s) while the other waits in the queue: the pending gauge shows 1.
        metrics = f"127.0.0.1:{addresses.metrics_port}"
        queued = 'nv_inference_pending_request_count{model="slow",version="1"} 1'
        wait_until(
            lambda: queued in raw_request(metrics, "GET", "/metrics", timeout_s=10)[2].decode(),
            20,
            "one request executing and one queued",
        )
        process.proc.send_signal(signum)
        for sender in senders:
            sender.join(60)
    finally:
        returncode = process.stop(60)  # SIGTERM only if the signal above did not end it
    assert len(answers) == 2 and 200 in answers and set(answers) <= {200, 503}, answers
    assert returncode == 0, process.stderr()


@pytest.mark.usefixtures("spawns")
def test_python_dash_m_busy_port_exits_3(tmp_path: Path) -> None:
    repository = write_repository(tmp_path, {"nobatch": MODELS["nobatch"]})
    with socket.socket() as blocker:
        blocker.bind(("127.0.0.1", 0))
        blocker.listen()
        port = str(blocker.getsockname()[1])
        process = start_subprocess(
            tmp_path / "server.log",
            "--model-repository",
            str(repository),
            *PORT_ZERO,
            "--grpc-port",  # the last one counts
            port,
        )
        returncode = process.wait(120)
        err = process.stderr()
        process.stop()
    assert returncode == 3
    assert "--grpc-port 0" in " ".join(err.split())


@pytest.mark.usefixtures("serves")
def test_model_control_mode_none_refuses_load_and_unload(tmp_path: Path) -> None:
    repository = write_repository(tmp_path, {"nobatch": MODELS["nobatch"]})
    options = ServerOptions(model_repositories=(repository,), model_control_mode="none")
    with ServerThread(options) as server:
        message = "explicit model load / unload is not allowed if polling is enabled"
        for action in ("load", "unload"):
            status, _, body = raw_request(
                server.http_url, "POST", f"/v2/repository/models/nobatch/{action}", b""
            )
            assert status == 503
            assert message in body.decode()
        grpc = grpcclient.InferenceServerClient(server.grpc_url)
        from tritonclient.utils import InferenceServerException

        with pytest.raises(InferenceServerException) as info:
            grpc.load_model("nobatch")
        assert info.value.status() == "StatusCode.UNAVAILABLE"
        assert grpc.is_model_ready("nobatch")
        grpc.close()
    with pytest.raises(ServerError, match="unknown model control mode 'poll'"):
        ServerOptions(model_control_mode="poll")
