"""Dynamic batching through the facade: real threads, identity backend with delays.

Arrival patterns are made deterministic with the DELAY_SCHEDULER hook (the batcher waits until
N requests are queued) and with an instance kept busy by a slow first request.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.core.conftest import (
    Collector,
    ServerFactory,
    batch_stats,
    identity_config,
    pending,
    request,
    wait_until,
    write_model,
)


def submit_all(server, col: Collector, model: str, sizes: list[int], **kw: object) -> None:  # type: ignore[no-untyped-def]
    for i, bs in enumerate(sizes):
        server.submit(request(model, float(i), str(i), batch=bs, **kw), col.callback(str(i)))


def test_six_queued_with_preferred_4_8_zero_delay(
    tmp_path: Path, make_server: ServerFactory
) -> None:
    write_model(
        tmp_path, "m", identity_config("m", "dynamic_batching { preferred_batch_size: [4, 8] }")
    )
    server = make_server(delay_scheduler=6)
    col = Collector()
    submit_all(server, col, "m", [1] * 6)
    col.wait(6)
    assert batch_stats(server, "m") == {2: 1, 4: 1}
    for i in range(6):
        out = col.results[str(i)]
        assert not isinstance(out, Exception)
        assert out.outputs["OUTPUT0"].tolist() == [[float(i)] * 4], "each gets its own data"


def test_use_biggest_preferred_with_long_delay(tmp_path: Path, make_server: ServerFactory) -> None:
    write_model(
        tmp_path,
        "m",
        identity_config(
            "m",
            "dynamic_batching { preferred_batch_size: [2, 6] max_queue_delay_microseconds: 10000000 }",
        ),
    )
    server = make_server(delay_scheduler=6)
    col = Collector()
    submit_all(server, col, "m", [1] * 6)
    col.wait(6)
    assert batch_stats(server, "m") == {6: 1}


def test_gt_max_preferred_both_immediate(tmp_path: Path, make_server: ServerFactory) -> None:
    write_model(
        tmp_path,
        "m",
        identity_config(
            "m",
            "dynamic_batching { preferred_batch_size: [2, 6] max_queue_delay_microseconds: 10000000 }",
        ),
    )
    server = make_server(delay_scheduler=2)
    col = Collector()
    start = time.monotonic()
    submit_all(server, col, "m", [3, 7])
    col.wait(2, timeout=5.0)  # far below the 10 s delay: both went at once
    assert time.monotonic() - start < 5.0
    assert batch_stats(server, "m") == {3: 1, 7: 1}


def test_sum_gt_max_preferred_second_waits_delay(
    tmp_path: Path, make_server: ServerFactory
) -> None:
    write_model(
        tmp_path,
        "m",
        identity_config(
            "m",
            "dynamic_batching { preferred_batch_size: [2, 6] max_queue_delay_microseconds: 300000 }",
        ),
    )
    server = make_server(delay_scheduler=2)
    col = Collector()
    start = time.monotonic()
    submit_all(server, col, "m", [3, 4])
    col.wait(2)
    assert batch_stats(server, "m") == {3: 1, 4: 1}
    assert col.order == ["0", "1"]
    assert col.times["1"] - start >= 0.29, "the bs=4 request waited for the queue delay"


@pytest.mark.usefixtures("takes_seconds")
def test_prefetch_growth_while_instance_busy(tmp_path: Path, make_server: ServerFactory) -> None:
    # §11 B.1: default dynamic_batching {}, D=0: five requests sent one by one while the only
    # instance is busy are executed as ONE batch of 5 afterwards.
    write_model(tmp_path, "m", identity_config("m", "dynamic_batching {}"))
    server = make_server()
    col = Collector()
    server.submit(request("m", 0.0, "slow", delay_ms=1000), col.callback("slow"))
    wait_until(
        lambda: pending(server, "m") == 0, 10, "the first request left the queue (it executes)"
    )
    for i in range(5):
        server.submit(request("m", float(i), str(i)), col.callback(str(i)))
        time.sleep(0.01)  # the scenario: arrivals one by one, not a burst (not a sync wait)
    col.wait(6)
    assert batch_stats(server, "m") == {1: 1, 5: 1}


def test_no_dynamic_batching_never_batches(tmp_path: Path, make_server: ServerFactory) -> None:
    write_model(
        tmp_path,
        "m",
        identity_config("m", 'parameters { key: "execute_delay_ms" value { string_value: "20" } }'),
    )
    server = make_server()
    col = Collector()
    submit_all(server, col, "m", [1] * 6, priority=1, timeout_us=1)
    col.wait(6)
    assert batch_stats(server, "m") == {1: 6}
    assert all(not isinstance(r, Exception) for r in col.results.values()), "timeout ignored"


def test_max_batch_size_zero_with_dynamic_batching(
    tmp_path: Path, make_server: ServerFactory
) -> None:
    write_model(tmp_path, "m", identity_config("m", "dynamic_batching {}", max_batch_size=0))
    server = make_server(delay_scheduler=4)
    col = Collector()
    for i in range(4):
        server.submit(request("m", float(i), str(i), shape=(4,)), col.callback(str(i)))
    col.wait(4)
    assert batch_stats(server, "m") == {1: 4}
    assert server.model_statistics("m")["model_stats"][0]["execution_count"] == 4


def test_shape_mismatch_cuts_batches(tmp_path: Path, make_server: ServerFactory) -> None:
    write_model(
        tmp_path,
        "m",
        identity_config(
            "m",
            "dynamic_batching { preferred_batch_size: [2, 6] max_queue_delay_microseconds: 10000000 }",
            dims="-1",
        ),
    )
    import numpy as np

    from reference_server.core.types import InferRequest

    server = make_server(delay_scheduler=4)
    col = Collector()
    for i, (bs, width) in enumerate([(1, 3), (3, 3), (1, 5), (5, 5)]):
        req = InferRequest("m", id=str(i), inputs={"INPUT0": np.full((bs, width), i, np.float32)})
        server.submit(req, col.callback(str(i)))
    col.wait(4)
    assert batch_stats(server, "m") == {4: 1, 6: 1}
    out = col.results["3"]
    assert not isinstance(out, Exception) and out.outputs["OUTPUT0"].shape == (5, 5)


def test_ragged_batch_allows_mixed_shapes(tmp_path: Path, make_server: ServerFactory) -> None:
    import numpy as np

    from reference_server.core.types import InferRequest

    config = """
name: "m"
backend: "identity"
max_batch_size: 8
input { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] allow_ragged_batch: true }
output { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] }
dynamic_batching { preferred_batch_size: [4] max_queue_delay_microseconds: 10000000 }
"""
    write_model(tmp_path, "m", config)
    server = make_server(delay_scheduler=4)
    col = Collector()
    for i, width in enumerate([3, 5, 3, 2]):
        req = InferRequest("m", id=str(i), inputs={"INPUT0": np.full((1, width), i, np.float32)})
        server.submit(req, col.callback(str(i)))
    col.wait(4)
    assert batch_stats(server, "m") == {4: 1}


def test_preserve_ordering_batches_of_four(tmp_path: Path, make_server: ServerFactory) -> None:
    write_model(
        tmp_path,
        "m",
        identity_config(
            "m", "dynamic_batching { preferred_batch_size: [4] preserve_ordering: true }"
        ),
    )
    server = make_server(delay_scheduler=12)
    col = Collector()
    submit_all(server, col, "m", [1] * 12)
    col.wait(12)
    assert batch_stats(server, "m") == {4: 3}
    assert col.order == [str(i) for i in range(12)]


def _two_instance_model(tmp_path: Path, preserve: bool) -> None:
    flag = "true" if preserve else "false"
    write_model(
        tmp_path,
        "m",
        identity_config(
            "m",
            f"dynamic_batching {{ preferred_batch_size: [1] preserve_ordering: {flag} }}\n"
            "instance_group [{ count: 2 kind: KIND_CPU }]",
        ),
    )


def test_preserve_ordering_holds_back_faster_later_responses(
    tmp_path: Path, make_server: ServerFactory
) -> None:
    _two_instance_model(tmp_path, preserve=True)
    server = make_server()
    col = Collector()
    server.submit(request("m", 0.0, "slow", delay_ms=300), col.callback("slow"))
    wait_until(lambda: pending(server, "m") == 0, 10, "the slow request left the queue")
    server.submit(request("m", 1.0, "fast"), col.callback("fast"))
    col.wait(2)
    assert col.order == ["slow", "fast"]


def test_without_preserve_ordering_fast_response_overtakes(
    tmp_path: Path, make_server: ServerFactory
) -> None:
    _two_instance_model(tmp_path, preserve=False)
    server = make_server()
    col = Collector()
    server.submit(request("m", 0.0, "slow", delay_ms=300), col.callback("slow"))
    wait_until(lambda: pending(server, "m") == 0, 10, "the slow request left the queue")
    server.submit(request("m", 1.0, "fast"), col.callback("fast"))
    col.wait(2)
    assert col.order == ["fast", "slow"], "two instances run concurrently"


@pytest.mark.usefixtures("takes_seconds")
def test_instance_merges_prefetched_batches_older_than_delay(
    tmp_path: Path, make_server: ServerFactory
) -> None:
    # §3.6: batches prefetched behind a busy instance are merged when it picks them up, if
    # their oldest request waited longer than the delay and the sum fits max_batch_size.
    write_model(
        tmp_path,
        "m",
        identity_config(
            "m",
            "dynamic_batching { preferred_batch_size: [2] max_queue_delay_microseconds: 50000 }",
        ),
    )
    server = make_server()
    col = Collector()
    server.submit(request("m", 0.0, "busy", delay_ms=1000), col.callback("busy"))
    wait_until(
        lambda: pending(server, "m") == 0, 10, "the first request left the queue (it executes)"
    )
    for i in range(3):  # -> one sealed batch of 3 (preferred 2 + the §3.4 absorb quirk)
        server.submit(request("m", float(i), str(i)), col.callback(str(i)))
    # The scenario, not a sync wait: the sealed batch ages past D (50 ms) before "3" arrives.
    time.sleep(0.1)
    server.submit(request("m", 3.0, "3"), col.callback("3"))  # -> a second batch after D
    col.wait(5)
    assert batch_stats(server, "m") == {1: 1, 4: 1}
