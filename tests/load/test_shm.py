"""``analyzer.load.shm.ShmInputs`` against a real reference server (a ServerThread on port 0).

The module is pure of gevent, so these tests run it in the pytest process. Every segment a test
makes is closed (unregistered and unlinked) by the ``made`` fixture, also when the test fails.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from analyzer.errors import InputError, TargetError
from analyzer.load import shm as shm_module
from analyzer.load.shm import ShmInputs
from reference_server import ServerOptions, ServerThread
from tests.support.servers import write_model

MODELS = {
    "identity": """
        backend: "identity" max_batch_size: 8
        input { name: "INPUT0" data_type: TYPE_FP32 dims: [16] }
        output { name: "OUTPUT0" data_type: TYPE_FP32 dims: [16] }
    """,
    "add_sub": """
        backend: "add_sub" max_batch_size: 8
        input { name: "INPUT0" data_type: TYPE_FP32 dims: [4] }
        input { name: "INPUT1" data_type: TYPE_FP32 dims: [4] }
        output { name: "OUTPUT0" data_type: TYPE_FP32 dims: [4] }
        output { name: "OUTPUT1" data_type: TYPE_FP32 dims: [4] }
    """,
    "strings": """
        backend: "identity" max_batch_size: 8
        input { name: "INPUT0" data_type: TYPE_STRING dims: [1] }
        output { name: "OUTPUT0" data_type: TYPE_STRING dims: [1] }
    """,
}


def _start(repository: Path) -> ServerThread:
    for name, text in MODELS.items():
        write_model(repository, name, text, add_name=True)
    options = ServerOptions(model_repositories=(repository,), models=tuple(MODELS), device="cpu")
    return ServerThread(options).start()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, serves: None) -> Iterator[ServerThread]:
    running = _start(tmp_path_factory.mktemp("shm_repo"))
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture(params=["http", "grpc"])
def client(request: pytest.FixtureRequest, server: ServerThread) -> Iterator[Any]:
    if request.param == "http":
        made: Any = httpclient.InferenceServerClient(server.http_url)
    else:
        made = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        yield made
    finally:
        made.close()


@pytest.fixture
def made() -> Iterator[Callable[..., ShmInputs]]:
    """``ShmInputs(...)`` that is closed at the end of the test whatever happens."""
    opened: list[ShmInputs] = []

    def make(*args: Any, **kwargs: Any) -> ShmInputs:
        inputs = ShmInputs(*args, **kwargs)
        opened.append(inputs)
        return inputs

    try:
        yield make
    finally:
        for inputs in opened:
            inputs.close()


def _segment_exists(key: str) -> bool:
    return os.path.exists(os.path.join("/dev/shm", key.lstrip("/")))


def _status(client: Any) -> dict[str, int]:
    """Registered region name -> byte size, for either protocol."""
    if isinstance(client, grpcclient.InferenceServerClient):
        reply = client.get_system_shared_memory_status(as_json=True)
        return {name: int(r["byte_size"]) for name, r in reply.get("regions", {}).items()}
    return {r["name"]: r["byte_size"] for r in client.get_system_shared_memory_status()}


def test_payloads_are_written_once_and_referenced(
    client: Any, made: Callable[..., ShmInputs]
) -> None:
    rng = np.random.default_rng(7)
    first, second = ({"INPUT0": rng.standard_normal((1, 16)).astype(np.float32)} for _ in range(2))
    rotation = [first, second, first, first]  # repeats are the same object
    inputs = made(client, rotation)
    assert len(inputs) == 4
    assert _status(client) == {inputs.region_name: inputs.byte_size}
    # Two distinct payloads of 64 bytes each, 64-byte aligned: the repeats add nothing.
    assert inputs.byte_size == 128
    assert inputs.places(2) == inputs.places(0)
    assert inputs.places(1)[0].offset == 64
    for index, payload in enumerate(rotation):
        np.testing.assert_array_equal(inputs.read(index, "INPUT0"), payload["INPUT0"])
        result = client.infer("identity", inputs.inputs(index))
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), payload["INPUT0"])


def test_several_inputs_and_shapes(client: Any, made: Callable[..., ShmInputs]) -> None:
    rotation = [
        {
            "INPUT0": np.full((batch, 4), float(batch), dtype=np.float32),
            "INPUT1": np.ones((batch, 4), dtype=np.float32),
        }
        for batch in (1, 3)
    ]
    inputs = made(client, rotation)
    for index, payload in enumerate(rotation):
        result = client.infer("add_sub", inputs.inputs(index))
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), payload["INPUT0"] + 1)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), payload["INPUT0"] - 1)


def test_bytes_payloads(client: Any, made: Callable[..., ShmInputs]) -> None:
    rotation = [
        {"INPUT0": np.array([[b"hello"], [b""]], dtype=object)},
        {"INPUT0": np.array([[b"x" * 300]], dtype=object)},
    ]
    inputs = made(client, rotation)
    assert [place.datatype for place in inputs.places(0)] == ["BYTES"]
    for index, payload in enumerate(rotation):
        result = client.infer("strings", inputs.inputs(index))
        assert result.as_numpy("OUTPUT0").tolist() == payload["INPUT0"].tolist()


def test_close_unregisters_unlinks_and_is_idempotent(client: Any) -> None:
    with ShmInputs(client, [{"INPUT0": np.zeros((1, 16), dtype=np.float32)}]) as inputs:
        assert _segment_exists(inputs.key)
        assert inputs.region_name in _status(client)
    assert inputs.closed
    assert not _segment_exists(inputs.key)
    assert inputs.region_name not in _status(client)
    inputs.close()  # again: nothing to do, no error


@pytest.mark.usefixtures("serves")
def test_close_after_the_server_went_away(tmp_path: Path) -> None:
    running = _start(tmp_path)
    client = httpclient.InferenceServerClient(running.http_url)
    try:
        inputs = ShmInputs(client, [{"INPUT0": np.zeros((1, 16), dtype=np.float32)}])
    finally:
        running.stop()
    try:
        inputs.close()  # the unregister call fails; the segment is unlinked all the same
        assert not _segment_exists(inputs.key)
    finally:
        inputs.close()
        client.close()


class _RefusingClient:
    """A client whose server refuses every region (as one on another host does)."""

    def __init__(self) -> None:
        self.unregistered: list[str] = []

    def register_system_shared_memory(
        self, name: str, key: str, byte_size: int, offset: int = 0, headers: Any = None
    ) -> None:
        raise InferenceServerException(
            msg=f"Unable to open shared memory region: '{key}'", status="500"
        )

    def unregister_system_shared_memory(self, name: str = "", headers: Any = None) -> None:
        self.unregistered.append(name)


def test_a_refused_registration_unlinks_the_segment(monkeypatch: pytest.MonkeyPatch) -> None:
    created: list[str] = []
    real_create = shm_module.shm.create_shared_memory_region

    def spy(name: str, key: str, size: int, create_only: bool = False) -> Any:
        created.append(key)
        return real_create(name, key, size, create_only=create_only)

    monkeypatch.setattr(shm_module.shm, "create_shared_memory_region", spy)
    refusing = _RefusingClient()
    with pytest.raises(TargetError) as info:
        ShmInputs(refusing, [{"INPUT0": np.zeros(4, dtype=np.float32)}])
    assert "Unable to open shared memory region" in str(info.value)
    assert "needs the server on this host" in str(info.value)
    assert len(created) == 1
    assert not _segment_exists(created[0])
    assert refusing.unregistered == []  # never registered, so nothing to unregister


def test_too_little_shared_memory_is_refused_before_creating(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(
        shm_module.os, "statvfs", lambda path: SimpleNamespace(f_bavail=1, f_frsize=4096)
    )
    with pytest.raises(InputError, match="has 4096 free"):
        ShmInputs(_RefusingClient(), [{"INPUT0": np.zeros(4096, dtype=np.float32)}])


def test_no_payloads_is_an_input_error() -> None:
    with pytest.raises(InputError):
        ShmInputs(_RefusingClient(), [])
