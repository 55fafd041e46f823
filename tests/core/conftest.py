"""Helpers for driving the core facade directly: model repositories and servers on demand.

``write_model`` and ``wait_until`` are :mod:`tests.support.servers`' (the one of each).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from reference_server.core.errors import ServerError
from reference_server.core.server import CoreOptions, InferenceServer
from reference_server.core.types import InferRequest, InferResponse
from tests.support.servers import wait_until, write_model

__all__ = ["wait_until", "write_model"]  # re-exported: the core tests import them from here


def identity_config(name: str, extra: str = "", max_batch_size: int = 8, dims: str = "4") -> str:
    """An identity model config (FP32 INPUT0 -> OUTPUT0)."""
    return f"""
name: "{name}"
backend: "identity"
max_batch_size: {max_batch_size}
input {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ {dims} ] }}
output {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ {dims} ] }}
{extra}
"""


def request(
    model: str,
    value: float,
    rid: str = "",
    batch: int = 1,
    delay_ms: float = 0,
    shape: tuple[int, ...] | None = None,
    **kw: object,
) -> InferRequest:
    """A request with INPUT0 = ``value`` everywhere, shape [batch, 4] unless ``shape`` is given.

    ``delay_ms`` makes the identity backend's execution of this request's batch that slow.
    """
    params = {"execute_delay_ms": delay_ms} if delay_ms else {}
    return InferRequest(
        model_name=model,
        id=rid,
        inputs={"INPUT0": np.full(shape or (batch, 4), value, dtype=np.float32)},
        input_datatypes={"INPUT0": "FP32"},
        parameters=params,  # type: ignore[arg-type]
        **kw,  # type: ignore[arg-type]
    )


def metric(server: InferenceServer, line_prefix: str) -> float:
    """Value of the first exposition line starting with ``line_prefix`` (e.g. a series)."""
    for line in server.metrics_text().splitlines():
        if line.startswith(line_prefix + " "):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no series {line_prefix!r} in metrics")


def pending(server: InferenceServer, model: str) -> float:
    """``nv_inference_pending_request_count`` of ``model`` version 1."""
    return metric(server, f'nv_inference_pending_request_count{{model="{model}",version="1"}}')


class Collector:
    """Collects callback results with their arrival order and time."""

    def __init__(self) -> None:
        self.results: dict[str, InferResponse | ServerError] = {}
        self.order: list[str] = []
        self.times: dict[str, float] = {}
        self._cond = threading.Condition()

    def callback(self, rid: str) -> Callable[[InferResponse | ServerError], None]:
        def done(result: InferResponse | ServerError) -> None:
            with self._cond:
                assert rid not in self.results, f"request {rid} answered twice"
                self.results[rid] = result
                self.order.append(rid)
                self.times[rid] = time.monotonic()
                self._cond.notify_all()

        return done

    def wait(self, count: int, timeout: float = 20.0) -> None:
        with self._cond:
            ok = self._cond.wait_for(lambda: len(self.results) >= count, timeout)
        assert ok, f"only {len(self.results)} of {count} answers after {timeout} s"


ServerFactory = Callable[..., InferenceServer]


@pytest.fixture
def make_server(tmp_path: Path) -> Iterator[ServerFactory]:
    """Start servers over ``tmp_path`` (the repository); all are stopped at teardown."""
    servers: list[InferenceServer] = []

    def factory(models: tuple[str, ...] = ("*",), **options: object) -> InferenceServer:
        opts = CoreOptions(
            model_repositories=(tmp_path,),
            startup_models=models,
            gpu_ids=(),
            **options,  # type: ignore[arg-type]
        )
        server = InferenceServer(opts)
        server.start()
        servers.append(server)
        return server

    yield factory
    for server in servers:
        server.stop()


def batch_stats(server: InferenceServer, model: str) -> dict[int, int]:
    """``{batch_size: executions}`` from the statistics JSON."""
    stats = server.model_statistics(model)["model_stats"][0]
    return {b["batch_size"]: b["compute_infer"]["count"] for b in stats["batch_stats"]}
