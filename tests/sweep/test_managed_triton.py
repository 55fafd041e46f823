"""`perfsweep run --server triton`: perfsweep starts a real ``tritonserver`` (the nvidia-pytriton
wheel's), tunes a Python-backend model in the user's repository, and the recommended
``config.pbtxt`` loads and answers in that Triton; a Triton killed mid-sweep is restarted and
its trial retried. The user's ``config.pbtxt`` is never written. One live sweep; the managed
Triton's own behaviour (loads, restarts, ports, shared memory, dying with its owner) is tested on
the target alone.

The model has two inputs (INT64, FP16) and a BYTES output. Its ``model.py`` reads only the
inputs' shapes: the wheel's stub is built against numpy 1, and with this project's numpy 2 it
misreads array item sizes (see :data:`MODEL_SOURCE` for how the BYTES output gets through).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from analyzer.config.knobs import Knobs
from analyzer.config.model_config import apply_knobs, knobs_of
from analyzer.errors import TargetError
from analyzer.rundir.results import load_summary, parse_config_text
from analyzer.target.managed import ManagedServer
from analyzer.target.protocol import ConfigRejectedError
from analyzer.target.supervise import group_members
from analyzer.target.triton import ManagedTriton, shm_regions
from tests.support.real_triton import TritonInstall
from tests.support.servers import process_gone, supervised_pid, wait_until, write_model
from tests.support.sweeps import small_scenario

pytestmark = [pytest.mark.triton, pytest.mark.slow]

MODEL = "shop"

#: A Python-backend model: INT64 ``INPUT_IDS`` and FP16 ``SCALE`` in, BYTES ``LABEL`` out.
MODEL_SOURCE = '''\
"""Two inputs in, one BYTES label per item out (written by tests/sweep/test_managed_triton.py).

The nvidia-pytriton stub is built against numpy 1. Under numpy 2 it reads an array's item size
from where numpy 1 kept it, which numpy 2 uses for the dtype's flags; a BYTES output (serialised
by pb_utils.serialize_byte_tensor) then comes out empty. Handing the stub the serialised bytes as
an aligned one-field struct whose item size equals its flags (144) makes the two agree; the
last label is padded with spaces to a multiple of 144 bytes. Under numpy 1 nothing is changed.
"""

import time

import numpy as np
import triton_python_backend_utils as pb_utils

_ITEM = 144
_STRUCT = np.dtype({"names": ["b"], "formats": ["u1"], "itemsize": _ITEM}, align=True)
_NUMPY2 = int(np.__version__.split(".")[0]) >= 2 and _STRUCT.flags == _ITEM


def _labels(count):
    labels = [b"ok"] * count
    if _NUMPY2:
        used = sum(4 + len(label) for label in labels)
        labels[-1] += b" " * ((-used) % _ITEM)
    return np.array(labels, dtype=np.object_).reshape(count, 1)


class TritonPythonModel:
    def initialize(self, args):
        if _NUMPY2:
            serialize = pb_utils.serialize_byte_tensor
            pb_utils.serialize_byte_tensor = lambda t: np.frombuffer(serialize(t), dtype=_STRUCT)

    def execute(self, requests):
        items = sum(
            pb_utils.get_input_tensor_by_name(r, "INPUT_IDS").shape()[0] for r in requests
        )
        time.sleep(0.002 + 0.0003 * items)
        responses = []
        for request in requests:
            count = pb_utils.get_input_tensor_by_name(request, "INPUT_IDS").shape()[0]
            label = pb_utils.Tensor("LABEL", _labels(count))
            responses.append(pb_utils.InferenceResponse(output_tensors=[label]))
        return responses
'''


def model_config(ids_dims: str = "[ 8 ]") -> str:
    return f"""name: "{MODEL}"
backend: "python"
max_batch_size: 8
input [
  {{ name: "INPUT_IDS" data_type: TYPE_INT64 dims: {ids_dims} }},
  {{ name: "SCALE" data_type: TYPE_FP16 dims: [ 4 ] }}
]
output [ {{ name: "LABEL" data_type: TYPE_STRING dims: [ 1 ] }} ]
instance_group [ {{ kind: KIND_CPU count: 1 }} ]
"""


def make_repository(root: Path, ids_dims: str = "[ 8 ]") -> Path:
    repository = root / "repo"
    write_model(repository, MODEL, model_config(ids_dims), model_source=MODEL_SOURCE)
    return repository


def sweep_command(
    binary: Path,
    repository: Path,
    run_dir: Path,
    tmp_path: Path,
    *extra: str,
    trials: int = 2,
    validate_top: int = 1,
) -> list[str]:
    scenario = tmp_path / f"s{trials}-{validate_top}.toml"
    scenario.write_text(small_scenario(trials, validate_top=validate_top))
    return [
        sys.executable,
        "-c",
        "from analyzer.cli import main; main()",
        "run",
        "--scenario",
        str(scenario),
        "--server",
        "triton",
        "--triton-server-path",
        str(binary),
        "--model-repository",
        str(repository),
        "--model",
        MODEL,
        "--run-dir",
        str(run_dir),
        *extra,
    ]


def infer_once(target: ManagedServer, ids_width: int = 8) -> np.ndarray:
    """One request with both inputs; the BYTES labels it returns."""
    import tritonclient.http as httpclient

    client = httpclient.InferenceServerClient(target.url.removeprefix("http://"))
    try:
        ids = httpclient.InferInput("INPUT_IDS", [2, ids_width], "INT64")
        ids.set_data_from_numpy(np.arange(2 * ids_width, dtype=np.int64).reshape(2, ids_width))
        scale = httpclient.InferInput("SCALE", [2, 4], "FP16")
        scale.set_data_from_numpy(np.ones((2, 4), dtype=np.float16))
        result = client.infer(MODEL, [ids, scale])
        labels = result.as_numpy("LABEL")
    finally:
        client.close()
    assert labels is not None and labels.shape == (2, 1), labels
    assert [label.rstrip() for label in labels.ravel()] == [b"ok", b"ok"]
    return labels


@pytest.fixture()
def triton(triton_install: TritonInstall, tmp_path: Path) -> Iterator[ManagedTriton]:
    target = ManagedTriton(
        MODEL,
        make_repository(tmp_path),
        tmp_path / "run" / "server" / "tritonserver.log",
        binary=triton_install.server_bin,
        startup_timeout_s=120,
    )
    target.start()
    try:
        yield target
    finally:
        target.stop()


def test_managed_triton_loads_configs_and_survives_a_kill(
    triton: ManagedTriton, tmp_path: Path
) -> None:
    repository_file = tmp_path / "repo" / MODEL / "config.pbtxt"
    written = repository_file.read_bytes()
    infer_once(triton)
    assert triton.describe()["managed_server"] == "triton"
    assert triton.describe()["server"] == "triton"
    base = triton.model_config()
    wanted = Knobs(8, 500, (8, 4), 2)
    triton.load_config(apply_knobs(base, wanted))
    assert knobs_of(triton.model_config()) == wanted
    infer_once(triton)

    bad = apply_knobs(base, Knobs(4, 100, (), 1))
    bad.dynamic_batching.preferred_batch_size.append(16)  # above max_batch_size
    with pytest.raises(ConfigRejectedError):
        triton.load_config(bad)
    triton.load_config(apply_knobs(base, wanted))

    # A dead Triton: the next load is a target failure (restart and retry), not a rejection.
    old_pid, old_url = triton.pid(), triton.url
    assert old_pid is not None
    os.kill(old_pid, signal.SIGKILL)
    wait_until(lambda: not triton.alive(), 30, "the killed Triton to be seen dead")
    with pytest.raises(TargetError) as refused:
        triton.load_config(apply_knobs(base, wanted))
    assert not isinstance(refused.value, ConfigRejectedError)
    triton.ensure_alive()
    assert triton.pid() != old_pid and triton.restarts == 1
    assert triton.url == old_url  # its old ports: whoever holds the url reaches it again
    assert knobs_of(triton.model_config()) == wanted  # the last config, pushed again
    infer_once(triton)
    log = triton.log_path.read_text()
    assert "server died" in log and log.count("--- perfsweep: starting ") == 2
    assert repository_file.read_bytes() == written  # never written by perfsweep

    # Stopped: nothing of either Triton runs, and no shared-memory file of theirs is left.
    new_pid = triton.pid()
    assert new_pid is not None
    regions = shm_regions(new_pid)
    triton.stop()
    wait_until(lambda: process_gone(new_pid), 30, "the stopped Triton to be gone")
    assert not [r for r in regions if r.exists()]


def stub_regions(pgid: int) -> set[Path]:
    """The regions named on the command lines of Triton's running stub processes."""
    found: set[Path] = set()
    for pid in group_members(pgid):
        if pid == pgid:
            continue
        with contextlib.suppress(OSError):
            args = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
            found |= {Path("/dev/shm") / a for a in args if a.startswith("triton_python_backend")}
    return found


def test_a_triton_killed_during_a_load_leaves_no_shared_memory(triton: ManagedTriton) -> None:
    # The load's new stub has its region; Triton, killed, cannot remove it: perfsweep does.
    # (Killed between creating a region and starting its stub, Triton leaves a file only a
    # look during the load finds: the 50 ms watch of _watching_regions, not tested here.)
    base = triton.model_config()
    pid = triton.pid()
    assert pid is not None
    before = shm_regions(pid)
    failures: list[BaseException] = []

    def load() -> None:
        try:
            triton.load_config(apply_knobs(base, Knobs(4, 0, (), 2)))
        except TargetError as exc:
            failures.append(exc)

    loader = threading.Thread(target=load)
    loader.start()
    new = wait_until(lambda: stub_regions(pid) - before, 60, "a new stub with its region")
    os.kill(pid, signal.SIGKILL)
    loader.join(120)
    assert failures and not isinstance(failures[0], ConfigRejectedError)
    triton.ensure_alive()
    infer_once(triton)
    triton.stop()
    assert not [r for r in new | before if r.exists()]


def test_a_port_taken_at_startup_means_a_start_on_new_ports(
    triton_install: TritonInstall, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import analyzer.target.triton as triton_server

    real_free_ports = triton_server.free_ports
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = int(taken.getsockname()[1])
        picks = iter([[port, *real_free_ports(2)]])
        monkeypatch.setattr(
            triton_server, "free_ports", lambda n=3: next(picks, None) or real_free_ports(n)
        )
        target = ManagedTriton(
            MODEL, make_repository(tmp_path), tmp_path / "t.log", triton_install.server_bin
        )
        try:
            target.start()
            assert target.ports is not None and target.ports.http != port
            infer_once(target)
        finally:
            target.stop()
    log = target.log_path.read_text()
    assert f"'127.0.0.1:{port}' already in use" in log and "starting again on new ports" in log


def test_a_missing_model_is_named_with_the_log(
    triton_install: TritonInstall, tmp_path: Path
) -> None:
    target = ManagedTriton(
        "nope", make_repository(tmp_path), tmp_path / "log" / "t.log", triton_install.server_bin
    )
    with pytest.raises(TargetError, match=r"could not load model 'nope'.*t\.log"):
        target.start()
    target.stop()


def trials_of(run_dir: Path) -> list[dict[str, Any]]:
    """The measured trials' records (``trials/NNN/measurement.json``), in order."""
    return [
        json.loads(path.read_text())
        for path in sorted((run_dir / "trials").glob("[0-9]*/measurement.json"))
    ]


def served(trial: dict[str, Any]) -> bool:
    """The trial's load was answered: throughput measured, next to no failed requests."""
    return bool(trial["throughput_rps"] > 0 and trial["error_rate"] <= 0.01)


PA_DATA = {
    "data": [
        {"INPUT_IDS": {"content": list(range(16)), "shape": [16]}, "SCALE": [1.0, 0.5, 0.25, 2.0]},
        {"INPUT_IDS": {"content": list(range(12)), "shape": [12]}, "SCALE": [0.0, 1.0, 2.0, 3.0]},
    ]
}


@pytest.mark.usefixtures("live_sweep")
def test_run_server_triton_restarts_a_killed_triton_and_its_best_config_loads(
    triton_install: TritonInstall, tmp_path: Path
) -> None:
    """The live sweep of a managed Triton: INT64 [-1] and FP16 [4] in, BYTES out, the requests
    from a perf_analyzer --input-data file (content + shape for the variable dim, a flat list for
    the fixed one; two sequence lengths) sent over gRPC by two generator processes. Triton is
    SIGKILLed while trial 0 is measured (its config loaded, the capacity search running): the
    step's refused requests and the failed health check say the server died, not that the
    config missed its goals; Triton is restarted on its ports and the trial measured again. The
    recommended config.pbtxt, as the model's own file, loads in a Triton and answers; the
    user's config.pbtxt is never written."""
    repository = make_repository(tmp_path, ids_dims="[ -1 ]")
    written = (repository / MODEL / "config.pbtxt").read_bytes()
    data = tmp_path / "data.json"
    data.write_text(json.dumps(PA_DATA))
    run_dir = tmp_path / "run"
    log = run_dir / "server" / "tritonserver.log"
    command = sweep_command(
        triton_install.server_bin,
        repository,
        run_dir,
        tmp_path,
        *("--input-data", str(data), "--protocol", "grpc", "--workers", "2"),
        validate_top=0,  # validation would only measure the restarted Triton twice more
    )
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    loaded = f"successfully loaded '{MODEL}'"
    try:

        def trial_started() -> int | None:
            assert proc.poll() is None, proc.communicate()[0][-3000:]
            if not (run_dir / "trials" / "000" / "config.pbtxt").exists():
                return None
            return supervised_pid(log.read_text())

        pid = wait_until(trial_started, 240, "trial 0 to start", poll_s=0.01)
        before = log.read_text().count(loaded)
        wait_until(lambda: log.read_text().count(loaded) > before, 60, loaded, poll_s=0.005)
        time.sleep(1.5)  # into the capacity search
        os.kill(pid, signal.SIGKILL)
        output, _ = proc.communicate(timeout=280)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode in (0, 1), output[-3000:]
    # The trial that lost its server was measured again on the new one, on the same url: both
    # trials complete, their load answered.
    measured = trials_of(run_dir)
    assert len(measured) == 2 and all(t["state"] == "complete" for t in measured), output[-3000:]
    assert all(served(t) for t in measured), measured
    summary = load_summary(run_dir)
    target = summary["environment"]["target"]
    assert target["managed_server"] == "triton" and target["server"] == "triton"
    assert summary["server_restarts"] == 1 and target["restarts"] == 1, output[-3000:]
    assert [(e["trial"], e["event"]) for e in summary["server_events"]] == [(0, "died")]
    assert "during a load step" in summary["server_events"][0]["detail"]
    assert "server: trial 0: died:" in output and "restarting it" in output
    text = log.read_text()
    assert f"server pid {pid}" in text and "server died" in text
    assert text.count("--- perfsweep: starting ") == 2
    # The run directory records how the load was sent and from what.
    recorded = summary["scenario"]
    assert recorded["model"]["protocol"] == "grpc" and recorded["traffic"]["workers"] == 2
    assert recorded["input"]["data_file"] == str(data)
    assert recorded["input"]["data_sha256"] == hashlib.sha256(data.read_bytes()).hexdigest()
    assert (repository / MODEL / "config.pbtxt").read_bytes() == written
    assert summary["best"] is not None, output[-3000:]
    best_text = (run_dir / "best" / "config.pbtxt").read_text()
    check_repo = tmp_path / "check"
    shutil.copytree(repository, check_repo)
    (check_repo / MODEL / "config.pbtxt").write_text(best_text)
    with ManagedTriton(
        MODEL, check_repo, tmp_path / "check.log", triton_install.server_bin
    ) as check:
        assert knobs_of(check.model_config()) == knobs_of(parse_config_text(best_text))
        assert list(check.model_config().input[0].dims) == [-1]
        infer_once(check, ids_width=12)


#: A process that holds a started ManagedTriton until it is killed (what perfsweep run does
#: with its managed Triton, without a sweep).
HOLDER = """
import sys, time
from pathlib import Path
from analyzer.target.triton import ManagedTriton
triton = ManagedTriton(sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]), Path(sys.argv[4]))
triton.start()
print(triton.pid(), flush=True)
time.sleep(600)
"""


def test_kill_9_of_its_owner_takes_a_managed_triton_and_its_stubs_down(
    triton_install: TritonInstall, tmp_path: Path
) -> None:
    repository = make_repository(tmp_path)
    proc = subprocess.Popen(
        [
            *(sys.executable, "-c", HOLDER, MODEL, str(repository)),
            *(str(tmp_path / "t.log"), str(triton_install.server_bin)),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        start_new_session=True,  # one killpg cleans up if the test fails
    )
    try:
        assert proc.stdout is not None
        pid = int(proc.stdout.readline())
        assert group_members(pid)  # Triton and its stubs run
        os.kill(proc.pid, signal.SIGKILL)  # the owner only: nothing gets to clean up
        proc.wait(30)
        # Triton gets SIGTERM (PR_SET_PDEATHSIG), unloads its model and ends its stubs.
        wait_until(lambda: not group_members(pid), 60, "Triton and its stubs to be gone")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)
