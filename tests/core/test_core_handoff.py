"""Who forms batches: an idle instance (prefetch mode) or the batcher thread.

With prefetching on, an instance waiting for work runs the batcher's steps itself and hands
the job back to the batcher thread when it gets busy (``Scheduler.next_batch``). These tests
pin the hand-over points: cancellation and timed dispatch while an instance leads, and
prefetching by the batcher thread while the only instance is busy.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from reference_server.core.errors import Code, ServerError
from reference_server.core.server import InferenceServer
from tests.core.conftest import (
    Collector,
    ServerFactory,
    identity_config,
    pending,
    request,
    wait_until,
    write_model,
)


def _batch_sizes(server: InferenceServer, model: str) -> dict[int, int]:
    stats = server.model_statistics(model)["model_stats"][0]
    return {int(b["batch_size"]): int(b["compute_infer"]["count"]) for b in stats["batch_stats"]}


def test_cancel_while_an_idle_instance_leads(tmp_path: Path, make_server: ServerFactory) -> None:
    # No queue policy: prefetch mode, so the idle instance is the one waiting out the delay.
    write_model(
        tmp_path,
        "m",
        identity_config(
            "m",
            "dynamic_batching { preferred_batch_size: [8] max_queue_delay_microseconds: 20000000 }",
        ),
    )
    server = make_server()
    col = Collector()
    gone = request("m", 0.0, "gone")
    server.submit(gone, col.callback("gone"))
    wait_until(lambda: pending(server, "m") == 1, 10, "one request waits in the queue")
    gone.cancel()
    col.wait(1, timeout=5)  # at once, not after the 20 s queue delay
    result = col.results["gone"]
    assert isinstance(result, ServerError) and result.code is Code.CANCELLED
    # The instance went back to leading after answering the drop: a full preferred batch
    # (8 items) is dispatched at once, without waiting for the delay.
    server.submit(request("m", 1.0, "full", batch=8), col.callback("full"))
    col.wait(2, timeout=5)
    assert not isinstance(col.results["full"], ServerError)
    assert _batch_sizes(server, "m") == {8: 1}


@pytest.mark.usefixtures("takes_seconds")
def test_idle_instance_dispatches_after_the_delay(
    tmp_path: Path, make_server: ServerFactory
) -> None:
    write_model(
        tmp_path,
        "m",
        identity_config(
            "m",
            "dynamic_batching { preferred_batch_size: [8] max_queue_delay_microseconds: 1000000 }",
        ),
    )
    server = make_server()
    col = Collector()
    for i in range(3):
        server.submit(request("m", float(i), f"r{i}"), col.callback(f"r{i}"))
    col.wait(3, timeout=10)
    assert all(not isinstance(r, ServerError) for r in col.results.values())
    # The three requests arrived well within the 1 s delay: one batch of 3 (a leader that
    # dispatched early would have made smaller ones; one that never woke would time out above).
    assert _batch_sizes(server, "m") == {3: 1}


def test_batcher_prefetches_while_the_instance_is_busy(
    tmp_path: Path, make_server: ServerFactory
) -> None:
    write_model(
        tmp_path,
        "m",
        identity_config("m", "dynamic_batching { preferred_batch_size: [4] }"),
    )
    server = make_server()
    col = Collector()
    # The first request keeps the only instance busy for 400 ms ...
    server.submit(request("m", 0.0, "slow", delay_ms=400), col.callback("slow"))
    wait_until(
        lambda: pending(server, "m") == 0, 10, "the first request left the queue (it executes)"
    )  # it is executing
    # ... while four more arrive: the batcher thread (no instance is idle) must form them into
    # one preferred batch of 4 for when the instance is free again.
    for i in range(4):
        server.submit(request("m", float(i + 1), f"r{i}"), col.callback(f"r{i}"))
    col.wait(5, timeout=10)
    assert col.order[0] == "slow"
    assert _batch_sizes(server, "m") == {1: 1, 4: 1}


def test_stop_drains_the_queue_and_ends_every_thread(
    tmp_path: Path, make_server: ServerFactory
) -> None:
    write_model(
        tmp_path,
        "m",
        identity_config("m", "dynamic_batching { max_queue_delay_microseconds: 100 }"),
    )
    server = make_server()
    runtime = server._lookup("m")
    col = Collector()
    # A paused device holds the instance inside its first batch, so that at stop() two batches
    # wait in the instance queue and the rest in the scheduler queue: the batcher must drain
    # them and then finish, whichever thread emptied the queue.
    server.pause_device("m", 0.5)
    for i in range(40):
        server.submit(request("m", float(i), f"r{i}"), col.callback(f"r{i}"))
    server.stop()
    col.wait(40, timeout=10)
    assert all(not isinstance(r, ServerError) for r in col.results.values())
    assert runtime.scheduler._thread is not None
    assert not runtime.scheduler._thread.is_alive(), "the batcher thread did not finish"
    assert all(
        inst._thread is not None and not inst._thread.is_alive() for inst in runtime.instances
    )
