"""Repository control through the facade: index states, load/unload, config override, swap."""

from __future__ import annotations

import json
import tempfile
import threading
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import json_format

from reference_server.core.config import config_to_json, parse_config_text
from reference_server.core.errors import Code, ServerError
from reference_server.core.server import CoreOptions, InferenceServer
from reference_server.core.types import InferRequest
from tests.core.conftest import Collector, ServerFactory, identity_config, request, write_model


def test_index_states_and_reasons(tmp_path: Path, make_server: ServerFactory) -> None:
    write_model(tmp_path, "a", identity_config("a"))
    write_model(tmp_path, "b", identity_config("b"))
    write_model(
        tmp_path, "bad", identity_config("bad", "dynamic_batching { preferred_batch_size: [64] }")
    )
    write_model(tmp_path, "gpu", identity_config("gpu", "instance_group [{ kind: KIND_GPU }]"))
    server = make_server(models=("a", "bad", "gpu"))
    # Reasons read "<code phrase>: <message>" as in real Triton 2.51 (which, unlike this
    # server, leaves a model refused at the config-poll stage without any index state).
    assert server.repository_index() == [
        {"name": "a", "version": "1", "state": "READY"},
        {"name": "b"},
        {
            "name": "bad",
            "version": "1",
            "state": "UNAVAILABLE",
            "reason": "Invalid argument: dynamic batching preferred size must be <= max batch "
            "size for bad",
        },
        {
            "name": "gpu",
            "version": "1",
            "state": "UNAVAILABLE",
            "reason": "Invalid argument: instance group gpu_0 of model gpu has kind KIND_GPU "
            "but no GPUs are available",
        },
    ]
    assert not server.is_ready(), "strict readiness: a model failed to load"
    assert set(server.load_errors()) == {"bad", "gpu"}
    assert server.repository_index(ready_only=True) == [
        {"name": "a", "version": "1", "state": "READY"}
    ]
    server.unload_model("a")
    server.unload_model("never-loaded")  # success, like Triton
    # Unload returns at once; the state settles after draining.
    for _ in range(200):
        if server.repository_index()[0]["state"] == "UNAVAILABLE":
            break
        threading.Event().wait(0.01)
    assert server.repository_index()[0] == {
        "name": "a",
        "version": "1",
        "state": "UNAVAILABLE",
        "reason": "unloaded",
    }


def test_lookup_errors_follow_triton(tmp_path: Path, make_server: ServerFactory) -> None:
    write_model(tmp_path, "a", identity_config("a"))
    server = make_server(models=("a",))
    with pytest.raises(ServerError, match=r"^Request for unknown model: 'zz' is not found$") as e:
        server.model_ready("zz")
    assert e.value.code is Code.NOT_FOUND
    with pytest.raises(ServerError, match="'a' version 7 is not found"):
        server.model_metadata("a", "7")
    server.unload_model("a")
    col = Collector()
    server.submit(request("a", 1.0, "x"), col.callback("x"))
    col.wait(1)
    err = col.results["x"]
    assert isinstance(err, ServerError) and err.code is Code.NOT_FOUND
    assert err.message == "Request for unknown model: 'a' has no available versions"
    with pytest.raises(ServerError, match="is not at ready state") as e:
        server.model_ready("a", "1")
    assert e.value.code is Code.UNAVAILABLE


def test_load_errors(tmp_path: Path, make_server: ServerFactory) -> None:
    write_model(tmp_path, "a", identity_config("a"))
    server = make_server(models=())
    with pytest.raises(ServerError) as e:
        server.load_model("nope")
    assert e.value.code is Code.INTERNAL
    assert e.value.message == "failed to load 'nope', failed to poll from model repository"
    # Triton 2.51 answers an unparsable override as any poll failure: INTERNAL (HTTP 500).
    with pytest.raises(
        ServerError,
        match=r"^failed to load 'a', failed to poll from model repository: Invalid config "
        "override: ",
    ) as e:
        server.load_model("a", config_json="{bad")
    assert e.value.code is Code.INTERNAL
    none_mode = make_server(model_control_mode="none")
    with pytest.raises(ServerError, match="explicit model load / unload is not allowed") as e:
        none_mode.load_model("a")
    assert e.value.code is Code.UNAVAILABLE
    assert none_mode.model_ready("a"), "mode none loads everything at start"


def test_override_takes_effect_and_plain_load_keeps_it(
    tmp_path: Path, make_server: ServerFactory
) -> None:
    """A load without a config after an override keeps the override, as Triton 2.51 does
    (``tests/server/test_hardening.py`` checks it against the real Triton)."""
    write_model(tmp_path, "a", identity_config("a"))
    server = make_server(models=("a",))
    assert not server.model_config("a").HasField("dynamic_batching")
    cfg = config_to_json(server.model_config("a"))
    cfg["dynamic_batching"] = {"preferred_batch_size": [4], "max_queue_delay_microseconds": 500}
    cfg["instance_group"] = [{"count": 2, "kind": "KIND_CPU"}]
    server.load_model("a", config_json=json.dumps(cfg))
    loaded = server.model_config("a")
    assert loaded.dynamic_batching.max_queue_delay_microseconds == 500
    assert [(g.name, g.count) for g in loaded.instance_group] == [("a_0", 2)]
    assert len(server.device_info("a")) == 2
    server.load_model("a")
    assert server.model_config("a").dynamic_batching.max_queue_delay_microseconds == 500
    assert len(server.device_info("a")) == 2
    # Only a new override (here: the on-disk config sent explicitly) replaces it.
    on_disk = json_format.MessageToJson(parse_config_text(identity_config("a")))
    server.load_model("a", config_json=on_disk)
    assert not server.model_config("a").HasField("dynamic_batching")


def test_invalid_override_keeps_serving(tmp_path: Path, make_server: ServerFactory) -> None:
    write_model(tmp_path, "a", identity_config("a"))
    write_model(tmp_path, "b", identity_config("b"))
    server = make_server(models=("a", "b"))
    bad = config_to_json(server.model_config("a"))
    bad["dynamic_batching"] = {"preferred_batch_size": [99]}
    with pytest.raises(ServerError) as e:
        server.load_model("a", config_json=json.dumps(bad))
    # Triton answers INTERNAL "failed to poll" (and logs the reason, which we append).
    assert e.value.code is Code.INTERNAL
    assert e.value.message == (
        "failed to load 'a', failed to poll from model repository: dynamic batching preferred "
        "size must be <= max batch size for a"
    )
    gpu = config_to_json(server.model_config("a"))
    gpu["instance_group"] = [{"kind": "KIND_GPU", "count": 1}]
    with pytest.raises(ServerError) as e:
        server.load_model("a", config_json=json.dumps(gpu))
    assert e.value.code is Code.INVALID_ARG
    assert e.value.message == (
        "load failed for model 'a': version 1 is at UNAVAILABLE state: Invalid argument: "
        "instance group a_0 of model a has kind KIND_GPU but no GPUs are available;\n"
    )
    assert server.repository_index()[0] == {"name": "a", "version": "1", "state": "READY"}
    assert server.infer_sync(request("a", 1.0), 10).outputs["OUTPUT0"].tolist() == [[1.0] * 4]
    assert server.infer_sync(request("b", 2.0), 10).outputs["OUTPUT0"].tolist() == [[2.0] * 4]
    assert server.is_ready()


def test_reload_swaps_without_dropping_in_flight(
    tmp_path: Path, make_server: ServerFactory
) -> None:
    write_model(
        tmp_path,
        "a",
        identity_config(
            "a",
            "dynamic_batching { max_queue_delay_microseconds: 100000 }\n"
            'parameters { key: "execute_delay_ms" value { string_value: "100" } }',
        ),
    )
    server = make_server(models=("a",))
    col = Collector()
    for i in range(12):
        server.submit(request("a", float(i), str(i)), col.callback(str(i)))
    cfg = config_to_json(server.model_config("a"))
    cfg["dynamic_batching"]["max_queue_delay_microseconds"] = 0
    server.load_model("a", config_json=json.dumps(cfg))  # while those are queued/running
    for i in range(12, 16):
        server.submit(request("a", float(i), str(i)), col.callback(str(i)))
    col.wait(16)
    for i in range(16):
        result = col.results[str(i)]
        assert not isinstance(result, Exception), result
        assert result.outputs["OUTPUT0"].tolist() == [[float(i)] * 4]
    assert server.model_config("a").dynamic_batching.max_queue_delay_microseconds == 0
    stats = server.model_statistics("a")["model_stats"][0]
    assert stats["inference_stats"]["success"]["count"] == 4, "new version counts from 0"
    # ... but, as in Triton 2.51, the metric series of model/version keep counting.
    text = server.metrics_text()
    assert 'nv_inference_request_success{model="a",version="1"} 16' in text


def test_versions_and_metadata(tmp_path: Path, make_server: ServerFactory) -> None:
    write_model(
        tmp_path,
        "v",
        identity_config("v", "version_policy { all {} }"),
        versions=(1, 3),
    )
    server = make_server(models=("v",))
    meta = server.model_metadata("v")
    assert meta == {
        "name": "v",
        "versions": ["1", "3"],
        "platform": "identity",
        "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [-1, 4]}],
        "outputs": [{"name": "OUTPUT0", "datatype": "FP32", "shape": [-1, 4]}],
    }
    assert server.model_metadata("v", "1")["versions"] == ["1"]
    out = server.infer_sync(request("v", 1.0), 10)
    assert out.model_version == "3", "no version requested -> latest READY"
    req = request("v", 1.0)
    req.model_version = "1"
    assert server.infer_sync(req, 10).model_version == "1"
    assert [s["version"] for s in server.model_statistics("v")["model_stats"]] == ["1", "3"]


def test_statistics_errors(tmp_path: Path, make_server: ServerFactory) -> None:
    write_model(tmp_path, "a", identity_config("a"))
    server = make_server(models=("a",))
    with pytest.raises(ServerError, match="requested model 'zz' is not available"):
        server.model_statistics("zz")
    with pytest.raises(ServerError, match="requested model version is not available for model 'a'"):
        server.model_statistics("a", "9")
    assert [s["name"] for s in server.model_statistics()["model_stats"]] == ["a"]


def test_validation_messages(tmp_path: Path, make_server: ServerFactory) -> None:
    import numpy as np

    write_model(tmp_path, "a", identity_config("a"))
    server = make_server(models=("a",))

    def error(req: InferRequest) -> ServerError:
        col = Collector()
        server.submit(req, col.callback("r"))
        col.wait(1)
        result = col.results["r"]
        assert isinstance(result, ServerError)
        return result

    big = request("a", 1.0, "big", batch=9)
    assert (
        error(big).message == "[request id: big] inference request batch-size must be <= 8 for 'a'"
    )
    shape = request("a", 1.0, shape=(1, 5))
    assert error(shape).message.startswith(
        "[request id: <id_unknown>] unexpected shape for input 'INPUT0' for model 'a'. "
        "Expected [-1,4], got [1,5]. NOTE: Setting a non-zero max_batch_size"
    )
    dtype = InferRequest("a", inputs={"INPUT0": np.zeros((1, 4), np.int32)})
    assert error(dtype).message.endswith(
        "inference input 'INPUT0' data-type is 'INT32', but model 'a' expects 'FP32'"
    )
    # Triton 2.51's exact texts (no request-id prefix on this one).
    unknown = InferRequest("a", id="u", inputs={"X": np.zeros((1, 4), np.float32)})
    assert error(unknown).message == "unexpected inference input 'X' for model 'a'"
    extra = InferRequest(
        "a",
        id="e",
        inputs={"INPUT0": np.zeros((1, 4), np.float32), "X": np.zeros((1, 4), np.float32)},
    )
    assert error(extra).message == (
        "[request id: e] expected 1 inputs but got 2 inputs for model 'a'. Got input(s) "
        "['X','INPUT0'], but missing required input(s) ]. Please provide all required input(s)."
    )
    stats = server.model_statistics("a")["model_stats"][0]["inference_stats"]
    assert stats["fail"]["count"] == 0 and stats["success"]["count"] == 0


def test_stop_refuses_new_requests(tmp_path: Path) -> None:
    write_model(tmp_path, "a", identity_config("a", "dynamic_batching {}"))
    server = InferenceServer(CoreOptions(model_repositories=(tmp_path,), startup_models=("a",)))
    server.start()
    assert server.is_live() and server.is_ready()
    server.stop()
    col = Collector()
    server.submit(request("a", 1.0, "late"), col.callback("late"))
    result = col.results["late"]
    assert isinstance(result, ServerError) and result.code is Code.UNAVAILABLE
    assert "Server is stopping" in result.message


def test_plain_load_is_noop_unless_files_changed(
    tmp_path: Path, make_server: ServerFactory
) -> None:
    model_dir = write_model(tmp_path, "a", identity_config("a"))
    server = make_server(models=("a",))
    server.infer_sync(request("a", 1.0), 10)
    server.load_model("a")  # nothing changed: same model object, statistics kept
    assert server.model_statistics("a")["model_stats"][0]["execution_count"] == 1
    (model_dir / "1" / "weights.bin").write_bytes(b"new")
    server.load_model("a")  # a file changed: reloaded, statistics start again
    assert server.model_statistics("a")["model_stats"][0]["execution_count"] == 0


def test_failed_loads_of_unknown_names_leave_no_load_lock(
    tmp_path: Path, make_server: ServerFactory
) -> None:
    """A client sending loads of made-up names must not grow the server's memory (issue 11)."""
    write_model(tmp_path, "a", identity_config("a"))
    server = make_server(models=("a",))
    server.load_model("a")
    index = server.repository_index()
    start = len(server._load_locks)
    for i in range(1000):
        with pytest.raises(ServerError, match="failed to poll from model repository") as e:
            server.load_model(f"ghost-{i}")
        assert e.value.code is Code.INTERNAL
    assert len(server._load_locks) == start
    assert server.repository_index() == index
    assert server.model_ready("a")


def test_concurrent_loads_of_one_name_never_overlap(
    tmp_path: Path, make_server: ServerFactory
) -> None:
    """Loads of a name run one at a time even while the lock table drops idle entries."""
    write_model(tmp_path, "a", identity_config("a"))
    server = make_server(models=("a",))
    read = server.repository.read
    active: dict[str, int] = {}
    overlaps: list[str] = []
    guard = threading.Lock()

    def spying_read(name: str, *args: Any, **kwargs: Any) -> Any:
        with guard:
            active[name] = active.get(name, 0) + 1
            if active[name] > 1:
                overlaps.append(name)
        try:
            threading.Event().wait(0.0005)  # widen the window in which a second load could run
            return read(name, *args, **kwargs)
        finally:
            with guard:
                active[name] -= 1

    server.repository.read = spying_read  # type: ignore[method-assign]
    errors: list[BaseException] = []

    def load_many(names: list[str]) -> None:
        for name in names:
            try:
                server.load_model(name)
            except ServerError as exc:
                if not name.startswith("ghost"):
                    errors.append(exc)
            except BaseException as exc:  # reported below, not lost in the thread
                errors.append(exc)

    threads = [
        threading.Thread(target=load_many, args=(["a", "ghost"] * 40,), name=f"loader-{i}")
        for i in range(8)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not any(thread.is_alive() for thread in threads), "a load did not finish"
    assert not errors
    assert not overlaps, f"concurrent loads of {sorted(set(overlaps))}"
    assert server._load_locks == {}
    assert server.model_ready("a")


def test_failed_loads_with_files_leave_no_scratch_directory(
    tmp_path: Path,
    tmp_path_factory: pytest.TempPathFactory,
    make_server: ServerFactory,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Files sent with a load that fails are deleted at once, not kept on disk until shutdown."""
    scratch_root = tmp_path_factory.mktemp("scratch")
    monkeypatch.setattr(tempfile, "tempdir", str(scratch_root))
    write_model(tmp_path, "a", identity_config("a"))
    server = make_server(models=("a",))
    good = config_to_json(server.model_config("a"))
    server.load_model("a", config_json=json.dumps(good), files={"file:1/notes.txt": b"kept"})
    serving = sorted(p.relative_to(scratch_root) for p in scratch_root.rglob("*"))
    assert len(list(scratch_root.iterdir())) == 1, "the served model's files stay"
    refused = {
        # poll stage: a file path leaving the model directory
        "escape": (json.dumps(good | {"name": "escape"}), {"file:1/../../x": b"x"}),
        # poll stage: a config that does not validate
        "invalid": (
            json.dumps(good | {"name": "invalid", "max_batch_size": -1}),
            {"file:1/x": b"x"},
        ),
        # load stage: no such backend
        "nobackend": (
            json.dumps(good | {"name": "nobackend", "backend": "nope"}),
            {"file:1/x": b"x"},
        ),
    }
    for i in range(20):
        for name, (config, files) in refused.items():
            with pytest.raises(ServerError):
                server.load_model(f"{name}{i}", config_json=config, files=files)
        with pytest.raises(ServerError, match="version 1 is at UNAVAILABLE state"):
            server.load_model(
                "a", config_json=json.dumps(good | {"backend": "nope"}), files={"file:1/y": b"y"}
            )
    assert sorted(p.relative_to(scratch_root) for p in scratch_root.rglob("*")) == serving
    assert server.model_ready("a")
