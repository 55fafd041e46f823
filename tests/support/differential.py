"""Run one batching scenario against any Triton-compatible server and describe what happened.

A *scenario* is a model config plus a timed list of inference requests; the *observation* is what
a client and the statistics extension can see afterwards: ``batch_stats``, ``execution_count``,
which requests were executed together, which failed with what, and which waited for the queue
delay. Differential tests run the same scenario on the real Triton and on the reference server
and compare observations.

Which requests shared an execution is read from completion times: the scenarios use one
instance and an ``execute_delay_ms`` of a few hundred ms, so executions finish at least that far
apart while the responses of one execution arrive within milliseconds of each other.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import tritonclient.http as httpclient
from tritonclient.grpc import model_config_pb2 as mc
from tritonclient.utils import InferenceServerException

from tests.support.servers import wait_until


class Target(Protocol):
    """The part of a server handle the scenarios need (``RealTriton`` satisfies it)."""

    @property
    def http_url(self) -> str: ...

    def model_stats(self, name: str) -> dict[str, Any]: ...

    def metrics_text(self) -> str: ...


@dataclass(frozen=True)
class Send:
    """One inference request of a scenario.

    Attributes:
        batch: batch size (leading dim); ignored when the model has ``max_batch_size: 0``.
        item_dims: per-item shape.
        priority: request ``priority`` parameter (0 = not sent).
        timeout_us: request ``timeout`` parameter (None = not sent).
        pause_s: sleep before sending this request.
        wait_queued: after sending, wait until the server reports every request sent so far
            as pending (``nv_inference_pending_request_count``), so the arrival order is the
            send order. Only for requests that stay queued: held by
            ``TRITONSERVER_DELAY_SCHEDULER`` or waiting for the queue delay.
        pending: with ``wait_queued``, the pending count to wait for instead of "every request
            sent so far" (for scenarios where earlier requests are already executing).
    """

    batch: int = 1
    item_dims: tuple[int, ...] = (16,)
    priority: int = 0
    timeout_us: int | None = None
    pause_s: float = 0.0
    wait_queued: bool = False
    pending: int | None = None


@dataclass(frozen=True)
class Outcome:
    """What the client saw for one request."""

    latency_s: float
    completed_at_s: float
    error_status: str | None = None
    error_message: str | None = None


@dataclass(frozen=True)
class Observation:
    """The comparable result of a scenario run.

    Attributes:
        batch_stats: executed batch size -> number of executions (statistics extension).
        execution_count: ``execution_count`` of the statistics extension.
        inference_count: ``inference_count``.
        fail_count: ``inference_stats.fail.count``.
        groups: request indices executed together, in completion order.
        errors: request index -> (HTTP status, message).
        waited_for_delay: indices of successful requests whose latency reached the queue delay.
    """

    batch_stats: dict[int, int]
    execution_count: int
    inference_count: int
    fail_count: int
    groups: tuple[tuple[int, ...], ...]
    errors: dict[int, tuple[str, str]] = field(default_factory=dict)
    waited_for_delay: frozenset[int] = frozenset()


def batch_stats_counts(stats: dict[str, Any]) -> dict[int, int]:
    """``{batch_size: executions}`` from one ``model_stats`` entry."""
    return {
        int(entry["batch_size"]): int(entry["compute_infer"]["count"])
        for entry in stats.get("batch_stats", [])
    }


def pending_count(target: Target, model: str) -> int:
    """Current ``nv_inference_pending_request_count`` of ``model`` (0 if absent)."""
    pattern = re.compile(
        r'^nv_inference_pending_request_count\{[^}]*model="' + re.escape(model) + r'"[^}]*\}\s+'
        r"([0-9.eE+-]+)$",
        re.MULTILINE,
    )
    match = pattern.search(target.metrics_text())
    return int(float(match.group(1))) if match else 0


def _wait_pending(target: Target, model: str, count: int, timeout_s: float = 15.0) -> None:
    what = f"the server to report {count} pending requests for {model}"
    wait_until(lambda: pending_count(target, model) >= count, timeout_s, what, poll_s=0.01)


def _request(
    url: str,
    model: str,
    config: mc.ModelConfig,
    send: Send,
    index: int,
    origin: float,
    outcomes: dict[int, Outcome],
) -> None:
    shape = list(send.item_dims)
    if config.max_batch_size > 0:
        shape = [send.batch, *shape]
    data = np.full(shape, float(index), dtype=np.float32)
    tensor = httpclient.InferInput(config.input[0].name, shape, "FP32")
    tensor.set_data_from_numpy(data)
    client = httpclient.InferenceServerClient(url, network_timeout=120.0)
    start = time.monotonic()
    try:
        result = client.infer(
            model, [tensor], priority=send.priority, timeout=send.timeout_us
        ).as_numpy(config.output[0].name)
        end = time.monotonic()
        # Batching must never mix up tensors between requests.
        assert result is not None and np.array_equal(result, data), f"request {index}: bad output"
        outcomes[index] = Outcome(end - start, end - origin)
    except InferenceServerException as exc:
        end = time.monotonic()
        outcomes[index] = Outcome(end - start, end - origin, str(exc.status()), str(exc.message()))
    finally:
        client.close()


def group_by_completion(outcomes: dict[int, Outcome], gap_s: float) -> tuple[tuple[int, ...], ...]:
    """Split successful requests into executions: a new one starts after a gap > ``gap_s``."""
    done = sorted((o.completed_at_s, i) for i, o in outcomes.items() if o.error_status is None)
    groups: list[list[int]] = []
    last = -1e9
    for completed, index in done:
        if completed - last > gap_s or not groups:
            groups.append([])
        groups[-1].append(index)
        last = completed
    return tuple(tuple(sorted(g)) for g in groups)


def run_scenario(
    target: Target,
    model: str,
    config: mc.ModelConfig,
    sends: Sequence[Send],
    *,
    settle_timeout_s: float = 60.0,
) -> Observation:
    """Send the requests (each on its own thread/connection), wait for all, observe.

    Args:
        target: a running server with ``model`` loaded (fresh statistics).
        model: model name.
        config: the model's config (input name, batching, ``execute_delay_ms``).
        sends: the requests, in send order.
        settle_timeout_s: upper bound for the whole scenario.
    """
    execute_delay_s = float(config.parameters["execute_delay_ms"].string_value or 0) / 1000
    # Without dynamic batching there is no queue delay (the proto default reads 0 as well).
    queue_delay_s = config.dynamic_batching.max_queue_delay_microseconds / 1e6
    outcomes: dict[int, Outcome] = {}
    threads: list[threading.Thread] = []
    origin = time.monotonic()
    for index, send in enumerate(sends):
        if send.pause_s:
            time.sleep(send.pause_s)  # the scenario's send schedule, not a sync wait
        thread = threading.Thread(
            target=_request,
            args=(target.http_url, model, config, send, index, origin, outcomes),
            daemon=True,
        )
        thread.start()
        threads.append(thread)
        if send.wait_queued:
            _wait_pending(target, model, index + 1 if send.pending is None else send.pending)
    deadline = time.monotonic() + settle_timeout_s
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    missing = [i for i in range(len(sends)) if i not in outcomes]
    assert not missing, f"requests {missing} did not finish within {settle_timeout_s} s"
    succeeded = [i for i, o in outcomes.items() if o.error_status is None]
    items = sum(sends[i].batch if config.max_batch_size > 0 else 1 for i in succeeded)
    stats = settled_stats(target, model, successes=len(succeeded), items=items)
    return Observation(
        batch_stats=batch_stats_counts(stats),
        execution_count=int(stats["execution_count"]),
        inference_count=int(stats["inference_count"]),
        fail_count=int(stats["inference_stats"]["fail"]["count"]),
        groups=group_by_completion(outcomes, gap_s=execute_delay_s / 2),
        errors={
            i: (o.error_status, o.error_message or "")
            for i, o in outcomes.items()
            if o.error_status is not None
        },
        waited_for_delay=frozenset(
            i
            for i, o in outcomes.items()
            if o.error_status is None and queue_delay_s > 0 and o.latency_s >= queue_delay_s
        ),
    )


def settled_stats(
    target: Target, model: str, *, successes: int, items: int, timeout_s: float = 10.0
) -> dict[str, Any]:
    """The model's statistics once they account for ``successes`` requests and ``items``.

    Triton's Python backend reports statistics after it has sent the responses, so a client
    that reads them right after its last response can miss the last execution. Polls until
    ``success.count``, ``inference_count`` and the executed batch sizes have caught up (or
    ``timeout_s`` passed; the caller's assertions then show what was missing).
    """
    deadline = time.monotonic() + timeout_s
    while True:
        stats = target.model_stats(model)
        executed = sum(size * count for size, count in batch_stats_counts(stats).items())
        caught_up = (
            stats["inference_stats"]["success"]["count"] >= successes
            and stats["inference_count"] >= items
            and executed >= items
        )
        if caught_up or time.monotonic() > deadline:
            return stats
        time.sleep(0.02)


def key_structure(value: Any) -> Any:
    """The shape of a JSON document: dict keys (recursively), list element shape, leaf types.

    Lists are described by the structure of their first element; numbers are one type so that
    ints and floats of the same field compare equal.
    """
    if isinstance(value, dict):
        return {key: key_structure(item) for key, item in sorted(value.items())}
    if isinstance(value, list):
        return [key_structure(value[0])] if value else []
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return "number"
    return type(value).__name__


def metric_families(text: str) -> dict[str, str]:
    """``{family name: type}`` from ``# TYPE`` lines of a Prometheus exposition."""
    families: dict[str, str] = {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(maxsplit=3)
            families[name] = kind
    return families


def model_series(text: str, model: str) -> set[str]:
    """Series (``name{labels}``, labels sorted, value dropped) that carry ``model="<model>"``."""
    series: set[str] = set()
    for line in text.splitlines():
        if line.startswith("#") or f'model="{model}"' not in line:
            continue
        head = line.rsplit(maxsplit=1)[0]
        name, _, labels = head.partition("{")
        parts = sorted(p for p in labels.rstrip("}").split(",") if p)
        series.add(f"{name}{{{','.join(parts)}}}")
    return series
