"""Targets against a real reference server process: config push, refusal, restart after death."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from analyzer.config.knobs import Knobs
from analyzer.config.model_config import apply_knobs, knobs_of
from analyzer.errors import TargetError
from analyzer.target.managed import ManagedServer, bundled_repository
from analyzer.target.protocol import ConfigRejectedError
from analyzer.target.remote import RemoteTarget
from reference_server.ready import READY_PREFIX
from tests.support.servers import wait_until
from tests.sweep.test_e2e_sim import make_repo

pytestmark = [pytest.mark.usefixtures("spawns"), pytest.mark.slow]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ManagedServer]:
    root = tmp_path_factory.mktemp("target")
    managed = ManagedServer(
        "tiny", "sim", root / "server" / "server.log", repository=make_repo(root)
    )
    managed.start()
    try:
        yield managed
    finally:
        managed.stop()


def test_config_push_without_restart(server: ManagedServer) -> None:
    pid = server.pid()
    base = server.model_config()
    assert knobs_of(base) == Knobs(16, instance_count=1, dynamic_batching=False)
    wanted = Knobs(8, 500, (8, 4), 2)
    server.load_config(apply_knobs(base, wanted))
    served = server.model_config()
    assert knobs_of(served) == wanted
    assert served.parameters["profile"].string_value == "resnet50_sim"  # the rest is untouched
    assert server.pid() == pid  # same process: reloaded through the repository API


def test_a_config_the_server_refuses_is_a_rejection_not_a_crash(server: ManagedServer) -> None:
    bad = apply_knobs(server.model_config(), Knobs(4, 100, (), 1))
    bad.dynamic_batching.preferred_batch_size.append(16)  # above max_batch_size: Triton refuses
    with pytest.raises(ConfigRejectedError, match="preferred"):
        server.load_config(bad)
    server.ensure_alive()  # still serving


def test_dead_server_is_restarted_with_the_last_config(server: ManagedServer) -> None:
    wanted = Knobs(4, 1000, (4, 2), 1)
    server.load_config(apply_knobs(server.model_config(), wanted))
    old_pid = server.pid()
    assert old_pid is not None
    os.kill(old_pid, signal.SIGKILL)
    wait_until(lambda: not server.alive(), 10, "the killed server to be seen dead")
    server.ensure_alive()
    assert server.pid() != old_pid and server.restarts == 1
    assert knobs_of(server.model_config()) == wanted
    log = server.log_path.read_text()
    assert "server died" in log and log.count(READY_PREFIX) == 2


def test_remote_target_checks_reachability_and_model(server: ManagedServer) -> None:
    remote = RemoteTarget(server.url, "tiny")
    remote.start()
    assert remote.describe()["kind"] == "remote"
    with pytest.raises(TargetError, match="not ready"):
        RemoteTarget(server.url, "no_such_model").start()


def test_managed_server_startup_failure_names_the_log(tmp_path: Path) -> None:
    broken = ManagedServer(
        "tiny",
        "sim",
        tmp_path / "server.log",
        repository=tmp_path / "missing",
        startup_timeout_s=60,
    )
    with pytest.raises(TargetError, match=r"server\.log"):
        broken.start()
    broken.stop()


def test_bundled_model_with_a_relative_run_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # `make run` writes to reports/<run-id>/ relative to the checkout: the repository writer and
    # the server run in other working directories, so relative paths must not reach them.
    monkeypatch.chdir(tmp_path)
    managed = ManagedServer("resnet50", "sim", Path("reports/run/server/server.log"))
    managed.start()
    try:
        assert managed.devices() and managed.devices()[0]["backend"] == "simulated"
        assert (tmp_path / "reports/run/server/repository/resnet50/config.pbtxt").exists()
    finally:
        managed.stop()


def test_bundled_repository_is_written_by_a_child_and_refuses_other_names(tmp_path: Path) -> None:
    root = bundled_repository("resnet50", tmp_path / "repository", "sim")
    assert (root / "resnet50" / "config.pbtxt").exists()
    with pytest.raises(TargetError, match=r"not a bundled model: nope.*--model-repository"):
        bundled_repository("nope", tmp_path / "other", "sim")


def test_bundled_tinyllm_is_written_with_its_engine_file_and_runs_on_sim_only(
    tmp_path: Path,
) -> None:
    root = bundled_repository("tinyllm", tmp_path / "repository", "sim")
    engine = json.loads((root / "tinyllm" / "1" / "model.json").read_text())
    assert engine["max_num_seqs"] == 8 and engine["enable_chunked_prefill"] is True
    config = (root / "tinyllm" / "config.pbtxt").read_text()
    assert 'backend: "vllm"' in config and "decoupled: true" in config
    with pytest.raises(TargetError, match="--device sim"):
        bundled_repository("tinyllm", tmp_path / "other", "cpu")
