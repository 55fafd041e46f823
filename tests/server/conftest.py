"""Fixtures for the frontend tests: a model repository and one real server per session.

The session server (:func:`server`) is a :class:`reference_server.app.ServerThread` on port 0,
reached over real sockets by the real ``tritonclient``. Tests that change server-wide state
(a failed load makes the server not ready) start their own with :func:`start_server`.
Statistics and metrics are shared, so tests compare before/after values or use their own model.
"""

from __future__ import annotations

import http.client
import json
import shutil
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from reference_server import ServerOptions, ServerThread
from tests.support.servers import wait_until, write_model

__all__ = ["wait_until", "write_model"]  # re-exported: the frontend tests import them from here

#: Every KServe datatype (the ``all_types`` model has one identity input/output per type).
DATATYPES = (
    "BOOL",
    "UINT8",
    "UINT16",
    "UINT32",
    "UINT64",
    "INT8",
    "INT16",
    "INT32",
    "INT64",
    "FP16",
    "FP32",
    "FP64",
    "BF16",
    "BYTES",
)

_CONFIG_TYPE = {dt: "TYPE_STRING" if dt == "BYTES" else f"TYPE_{dt}" for dt in DATATYPES}

#: Models loaded at startup of the session server: name -> config.pbtxt text.
MODELS: dict[str, str] = {
    "identity_fp32": """
        backend: "identity" max_batch_size: 8
        input { name: "INPUT0" data_type: TYPE_FP32 dims: [16] }
        output { name: "OUTPUT0" data_type: TYPE_FP32 dims: [16] }
        dynamic_batching { max_queue_delay_microseconds: 100 }
    """,
    "all_types": 'backend: "identity" max_batch_size: 0\n'
    + "".join(
        f'input {{ name: "IN_{dt}" data_type: {_CONFIG_TYPE[dt]} dims: [-1] }}\n'
        for dt in DATATYPES
    )
    + "".join(
        f'output {{ name: "OUT_{dt}" data_type: {_CONFIG_TYPE[dt]} dims: [-1] }}\n'
        for dt in DATATYPES
    ),
    "add_sub": """
        backend: "add_sub" max_batch_size: 8
        input { name: "INPUT0" data_type: TYPE_FP32 dims: [4] }
        input { name: "INPUT1" data_type: TYPE_FP32 dims: [4] }
        output { name: "OUTPUT0" data_type: TYPE_FP32 dims: [4] }
        output { name: "OUTPUT1" data_type: TYPE_FP32 dims: [4] }
    """,
    "bytes_model": """
        backend: "identity" max_batch_size: 8
        input { name: "INPUT0" data_type: TYPE_STRING dims: [1] }
        output { name: "OUTPUT0" data_type: TYPE_STRING dims: [1] }
    """,
    "nobatch": """
        backend: "identity" max_batch_size: 0
        input { name: "INPUT0" data_type: TYPE_INT32 dims: [2, 2] }
        output { name: "OUTPUT0" data_type: TYPE_INT32 dims: [2, 2] }
    """,
    "int8_model": """
        backend: "identity" max_batch_size: 0
        input { name: "INPUT0" data_type: TYPE_INT8 dims: [3] }
        output { name: "OUTPUT0" data_type: TYPE_INT8 dims: [3] }
    """,
    "variable": """
        backend: "identity" max_batch_size: 8
        input { name: "INPUT0" data_type: TYPE_FP32 dims: [-1] }
        output { name: "OUTPUT0" data_type: TYPE_FP32 dims: [-1] }
    """,
}

#: Not loaded at startup: used by the repository-API tests.
EXTRA_MODELS: dict[str, str] = {
    "loadable": """
        backend: "identity" max_batch_size: 4
        input { name: "INPUT0" data_type: TYPE_FP32 dims: [4] }
        output { name: "OUTPUT0" data_type: TYPE_FP32 dims: [4] }
    """,
}

#: A one-instance model whose every execution sleeps, for queueing/cancellation tests; each
#: test that needs one gets its own copy so statistics start at zero. The queue policy puts the
#: batcher in non-prefetch mode (spec §3.5), so waiting requests stay in the scheduler queue,
#: where a cancellation removes them (§3.8), instead of a prefetched batch.
SLOW_MODEL = """
    backend: "identity" max_batch_size: 1
    input { name: "INPUT0" data_type: TYPE_FP32 dims: [4] }
    output { name: "OUTPUT0" data_type: TYPE_FP32 dims: [4] }
    instance_group { count: 1 kind: KIND_CPU }
    dynamic_batching { default_queue_policy { max_queue_size: 16 } }
    parameters { key: "execute_delay_ms" value { string_value: "%d" } }
"""


def write_repository(repository: Path, models: Mapping[str, str]) -> Path:
    """Write several models (config texts without their ``name``) into ``repository``."""
    for name, text in models.items():
        write_model(repository, name, text, add_name=True)
    return repository


@pytest.fixture(scope="session")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The session repository: :data:`MODELS` and :data:`EXTRA_MODELS`."""
    root = tmp_path_factory.mktemp("frontend_repo")
    write_repository(root, {**MODELS, **EXTRA_MODELS})
    return root


@pytest.fixture(scope="session")
def server(repository: Path, serves: None) -> Iterator[ServerThread]:
    """One reference server for the session (port 0 everywhere), :data:`MODELS` loaded."""
    options = ServerOptions(model_repositories=(repository,), models=tuple(MODELS), device="cpu")
    with ServerThread(options) as running:
        yield running


@pytest.fixture
def never_loaded(server: ServerThread, request: pytest.FixtureRequest) -> Iterator[str]:
    """The name of a model written into the session repository for this test only, never loaded.

    Index tests assert on it rather than on a shared model, which another test may have loaded
    (and unloaded) on the session server; the directory is removed afterwards.
    """
    name = f"never_loaded_{request.node.originalname}"
    repository = server.options.model_repositories[0]
    directory = write_model(repository, name, EXTRA_MODELS["loadable"], add_name=True)
    yield name
    shutil.rmtree(directory)


@pytest.fixture
def start_server(serves: None) -> Iterator[Callable[..., ServerThread]]:
    """Factory for a private server (stopped at the end of the test)."""
    started: list[ServerThread] = []

    def start(repository: Path, models: tuple[str, ...] = (), **options: Any) -> ServerThread:
        running = ServerThread(
            ServerOptions(model_repositories=(repository,), models=models, **options)
        ).start()
        started.append(running)
        return running

    yield start
    for running in started:
        running.stop()


def raw_request(
    address: str,
    method: str,
    path: str,
    body: bytes | None = None,
    headers: Mapping[str, str] | None = None,
    timeout_s: float = 30.0,
) -> tuple[int, dict[str, str], bytes]:
    """One HTTP request with exactly the given headers and body (status, headers, body)."""
    host, port = address.rsplit(":", 1)
    connection = http.client.HTTPConnection(host, int(port), timeout=timeout_s)
    try:
        connection.request(method, path, body=body, headers=dict(headers or {}))
        response = connection.getresponse()
        return response.status, dict(response.getheaders()), response.read()
    finally:
        connection.close()


def error_message(body: bytes) -> str:
    """The ``error`` field of a Triton error body (asserts the body has exactly that shape)."""
    parsed = json.loads(body)
    assert list(parsed) == ["error"], parsed
    message: str = parsed["error"]
    return message
