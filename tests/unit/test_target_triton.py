"""The managed Triton's pure parts and its process group, without a Triton: where the binary is
found (and the error naming ``--triton-server-path``), how a wheel's install is assembled, the
command line, bind failures, ``make_target``'s choice; a supervised child's own group ends with
it. The real ``tritonserver`` runs in ``tests/sweep/test_managed_triton.py``."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from analyzer.config.scenario import load_scenario
from analyzer.errors import InputError
from analyzer.target.factory import make_target
from analyzer.target.managed import ManagedServer
from analyzer.target.remote import RemoteTarget
from analyzer.target.supervise import Supervisor, group_members
from analyzer.target.triton import (
    ManagedTriton,
    TritonLaunch,
    TritonPorts,
    bind_failure,
    find_tritonserver,
    free_ports,
    triton_command,
    triton_launch,
)
from reference_server.ready import ServerAddresses
from tests.support.servers import process_gone, wait_until

VERSION = f"{sys.version_info.major}.{sys.version_info.minor}"


def executable(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\nexit 0\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def wheel_layout(root: Path, stub_version: str = VERSION) -> Path:
    """A fake ``pytriton/tritonserver`` tree: the binary, the python backend, one stub."""
    binary = executable(root / "pytriton" / "tritonserver" / "bin" / "tritonserver")
    backend = root / "pytriton" / "tritonserver" / "backends" / "python"
    backend.mkdir(parents=True)
    (backend / "libtriton_python.so").write_bytes(b"so")
    (backend / "triton_python_backend_utils.py").write_text("")
    stub = root / "pytriton" / "tritonserver" / "python_backend_stubs" / stub_version
    executable(stub / "triton_python_backend_stub")
    return binary


def test_the_binary_is_the_given_path_or_the_one_on_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    given = executable(tmp_path / "a" / "tritonserver")
    assert find_tritonserver(given) == given.resolve()
    with pytest.raises(InputError, match=r"--triton-server-path .*nope: no executable"):
        find_tritonserver(tmp_path / "nope")
    plain = tmp_path / "b" / "tritonserver"
    plain.parent.mkdir()
    plain.write_text("")  # not executable
    with pytest.raises(InputError, match="--triton-server-path"):
        find_tritonserver(plain)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(InputError, match=r"no tritonserver on PATH; pass --triton-server-path"):
        find_tritonserver(None)
    monkeypatch.setenv("PATH", str(given.parent))
    assert find_tritonserver(None) == given.resolve()


def test_a_wheel_triton_gets_its_backends_with_the_stub_and_a_library_path(
    tmp_path: Path,
) -> None:
    binary = wheel_layout(tmp_path / "site")
    launch = triton_launch(binary, tmp_path / "run" / "server", base_env={"PYTHONPATH": "/x"})
    assert launch.backend_directory == tmp_path / "run" / "server" / "backends"
    python = launch.backend_directory / "python"
    assert (python / "triton_python_backend_stub").is_file()  # beside libtriton_python.so
    assert (python / "libtriton_python.so").read_bytes() == b"so"
    libs = launch.env["LD_LIBRARY_PATH"].split(os.pathsep)
    # This interpreter's libpython first: a system one of another patch release breaks models.
    assert libs[0] == sysconfig.get_config_var("LIBDIR")
    assert libs[1] == str(tmp_path / "site" / "nvidia_pytriton.libs")
    paths = launch.env["PYTHONPATH"].split(os.pathsep)
    import numpy

    assert paths[0] == str(Path(numpy.__file__).resolve().parent.parent) and paths[-1] == "/x"
    # Assembled once: a second run directory's launch copies again, the same one does not.
    (python / "marker").write_text("kept")
    triton_launch(binary, tmp_path / "run" / "server")
    assert (python / "marker").exists()


def test_a_wheel_without_a_stub_for_this_python_is_refused(tmp_path: Path) -> None:
    binary = wheel_layout(tmp_path / "site", stub_version="3.8")
    with pytest.raises(InputError, match=rf"stubs for 3\.8, not for Python {VERSION}"):
        triton_launch(binary, tmp_path / "run")


def test_a_regular_install_runs_as_installed(tmp_path: Path) -> None:
    binary = executable(tmp_path / "opt" / "bin" / "tritonserver")
    assert triton_launch(binary, tmp_path / "run") == TritonLaunch(binary, None, {})
    (tmp_path / "opt" / "backends").mkdir()
    assert (
        triton_launch(binary, tmp_path / "run").backend_directory == tmp_path / "opt" / "backends"
    )


@pytest.mark.usefixtures("serves")
def test_the_command_line_is_loopback_explicit_and_loads_nothing(tmp_path: Path) -> None:
    launch = TritonLaunch(Path("/t/bin/tritonserver"), Path("/b"))
    args = triton_command(launch, Path("/repo"), TritonPorts(1001, 1002, 1003))
    assert args[0] == "/t/bin/tritonserver"
    assert {
        "--model-repository=/repo",
        "--model-control-mode=explicit",
        "--http-port=1001",
        "--grpc-port=1002",
        "--metrics-port=1003",
        "--http-address=127.0.0.1",
        "--grpc-address=127.0.0.1",
        "--metrics-address=127.0.0.1",
        "--backend-directory=/b",
    } <= set(args)
    assert not [a for a in args if a.startswith("--load-model")]
    bare = triton_command(TritonLaunch(Path("/t")), Path("/repo"), TritonPorts(1, 2, 3))
    assert not [a for a in bare if a.startswith("--backend-directory")]
    assert TritonPorts(1, 2, 3).addresses() == ServerAddresses("127.0.0.1", 1, 2, 3)
    ports = free_ports(3)
    assert len(set(ports)) == 3 and all(p > 0 for p in ports)


def test_bind_failures_are_found_in_the_log() -> None:
    # The E line is the one Triton 2.51 (the wheel's) writes when its HTTP port is taken.
    log = (
        'I1201 grpc_server.cc:2558] "Started GRPCInferenceService at 127.0.0.1:1"\n'
        "E1201 main.cc:257] \"failed to start HTTP service: Unavailable - Socket '127.0.0.1:2' "
        'already in use "\n'
    )
    assert bind_failure(log) is not None and "HTTP service" in (bind_failure(log) or "")
    assert bind_failure('I1201 http_server.cc:4713] "Started HTTPService at 127.0.0.1:2"') is None


def test_make_target_starts_triton_for_server_triton(tmp_path: Path) -> None:
    binary = executable(tmp_path / "bin" / "tritonserver")
    repository = tmp_path / "repo"
    repository.mkdir()
    path = tmp_path / "s.toml"
    path.write_text(
        f'[model]\nname = "m"\nserver = "triton"\nrepository = "{repository}"\n'
        f'triton_server_path = "{binary}"\n'
    )
    target = make_target(load_scenario(path, env={}), tmp_path / "run")
    assert isinstance(target, ManagedTriton) and isinstance(target, ManagedServer)
    assert target.log_path == (tmp_path / "run" / "server" / "tritonserver.log").resolve()
    assert target.binary == binary.resolve() and target.repository == repository.resolve()
    assert target.device == "triton" and not target.shared
    # --url wins: nothing is started.
    remote = make_target(load_scenario(path, env={}), tmp_path, url="127.0.0.1:9")
    assert isinstance(remote, RemoteTarget)
    path.write_text(f'[model]\nname = "m"\nserver = "triton"\ntriton_server_path = "{binary}"\n')
    with pytest.raises(InputError, match="--model-repository"):
        make_target(load_scenario(path, env={}), tmp_path / "run")


def test_a_restart_asks_for_the_old_ports(tmp_path: Path) -> None:
    server = ManagedServer("m", "sim", tmp_path / "server.log", repository=tmp_path)
    fresh = server.command()
    assert fresh[fresh.index("--http-port") + 1] == "0"
    again = server.command(ServerAddresses("127.0.0.1", 7001, 7002, 7003))
    assert [
        again[again.index(f) + 1] for f in ("--http-port", "--grpc-port", "--metrics-port")
    ] == [
        "7001",
        "7002",
        "7003",
    ]


GRANDCHILD = (
    "import subprocess, sys, time; "
    "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)']); "
    "print('grandchild', p.pid, flush=True); time.sleep(120)"
)


def grandchild_of(process: Supervisor) -> int:
    line = process.wait_for(
        lambda text: next((x for x in text.splitlines() if x.startswith("grandchild")), None), 60
    )
    return int(line.split()[1])


@pytest.mark.usefixtures("spawns")
def test_an_own_group_child_takes_what_it_started_along(tmp_path: Path) -> None:
    process = Supervisor(
        [sys.executable, "-u", "-c", GRANDCHILD], tmp_path / "child.log", own_group=True
    )
    process.start()
    pid = process.pid()
    assert pid is not None and os.getpgid(pid) == pid  # a group of its own
    grandchild = grandchild_of(process)
    assert set(group_members(pid)) >= {pid, grandchild}
    process.stop(timeout_s=5)
    wait_until(lambda: process_gone(grandchild), 10, "the grandchild to be gone")
    # The child killed: the grandchild goes with it, before anyone calls stop() (a killed
    # Triton's stubs would hold its sockets open and hang the requests in flight).
    process.start()
    pid = process.pid()
    assert pid is not None
    grandchild = grandchild_of(process)
    os.kill(pid, 9)
    wait_until(lambda: process_gone(grandchild), 10, "the orphaned grandchild to be gone")
    assert group_members(pid) == []
    process.stop(timeout_s=5)


@pytest.mark.usefixtures("spawns")
def test_without_an_own_group_the_child_shares_ours(tmp_path: Path) -> None:
    process = Supervisor([sys.executable, "-c", "import time; time.sleep(60)"], tmp_path / "l.log")
    process.start()
    try:
        pid = process.pid()
        assert pid is not None and os.getpgid(pid) == os.getpgid(0)
    finally:
        process.stop(timeout_s=5)


@pytest.mark.usefixtures("spawns")
def test_run_server_triton_without_a_binary_exits_2_naming_the_flag(tmp_path: Path) -> None:
    repository = tmp_path / "repo"
    (repository / "m" / "1").mkdir(parents=True)
    (repository / "m" / "config.pbtxt").write_text(
        'name: "m"\nbackend: "python"\nmax_batch_size: 8\n'
    )
    run_dir = tmp_path / "run"
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "from analyzer.cli import main; main()",
            "run",
            "--server",
            "triton",
            "--model-repository",
            str(repository),
            "--model",
            "m",
            "--run-dir",
            str(run_dir),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PATH": str(tmp_path / "empty")},
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert "no tritonserver on PATH; pass --triton-server-path" in done.stdout + done.stderr
    assert not (run_dir / "run.json").exists()
