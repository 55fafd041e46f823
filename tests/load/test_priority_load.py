"""A priority mix against a real reference server: the requests carry their class's priority and
timeout, and the results split by class.

The child (``python -m tests.load.test_priority_load``, the load engine is gevent code) starts a
reference server with two simulated models, one instance each, 20 ms a request, no batching
(``max_batch_size: 1``), two priority levels with level 2 the default:

* ``ordered``: no queue policy (a request's timeout is ignored). 24 closed-loop users keep 24
  requests in the server's queue: 30 % ``urgent`` at priority 1, 70 % ``bulk`` sending no
  priority (the default level 2) and a 5 ms timeout. An urgent request goes ahead of the queued
  bulk ones and waits a device time or two; a bulk one waits behind most of the others (~17 x
  20 ms). So the urgent class's p90 is below the bulk class's median, by far; without the
  priority arriving both classes would share one FIFO queue and one latency. (Closed loop, so
  the queue stays below gRPC's 100 concurrent streams per connection: beyond them requests wait
  in the client, in arrival order, where no priority reaches.)
* ``rejecting``: ``default_queue_policy { timeout_action: REJECT, default_timeout 10 s,
  allow_timeout_override }`` (an override may only shorten the default, as in Triton), offered
  60 req/s open loop (capacity 50). ``bulk`` sends ``timeout = 5 ms`` and is rejected once it
  has waited that long; ``urgent`` sends none and waits at most a few device times. So the bulk
  class has errors (Triton's "Request timeout expired") and the urgent class none.

Both run through ``engine_options`` from a scenario's ``[[traffic.classes]]``, over HTTP (the
pre-built raw requests) and over gRPC (tritonclient's ``infer``), and over HTTP from two
generator processes (each draws its own classes; the per-class histograms cross Locust's
messages). The child also returns the JSON
header of one pre-built request per class and HTTP client, parsed: the ``parameters`` exactly as
tritonclient writes them.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

from tests.load.child import run_module

# Timing against tight bounds: run alone (tests/support/quiet.py).
pytestmark = pytest.mark.usefixtures("quiet_machine")

DEVICE_MS = 20.0
RATE_RPS = 60.0
USERS = 24
TIMEOUT_US = 5000
CLASSES = [
    {"name": "urgent", "share": 0.3, "priority": 1, "p99_ms": 200.0},
    {"name": "bulk", "share": 0.7, "timeout_us": TIMEOUT_US},
]
ORDERED = "dynamic_batching { priority_levels: 2 default_priority_level: 2 }"
REJECTING = (
    "dynamic_batching { priority_levels: 2 default_priority_level: 2 default_queue_policy { "
    "timeout_action: REJECT default_timeout_microseconds: 10000000 allow_timeout_override: true"
    " } }"
)


@pytest.fixture(
    scope="module",
    params=[("http", 1), ("grpc", 1), pytest.param(("http", 2), marks=pytest.mark.slow)],
    ids=["http", "grpc", "http-2-workers"],
)
def answer(request: pytest.FixtureRequest, spawns: None) -> dict[str, Any]:
    protocol, workers = request.param
    return run_module("tests.load.test_priority_load", protocol, str(workers), timeout_s=300.0)


def _by_name(level: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in level["classes"]}


def test_the_priority_reaches_the_server_and_the_urgent_class_goes_first(
    answer: dict[str, Any],
) -> None:
    level = answer["ordered"]
    classes = _by_name(level)
    urgent, bulk = classes["urgent"], classes["bulk"]
    assert [c["name"] for c in level["classes"]] == ["urgent", "bulk"]
    assert (urgent["priority"], bulk["priority"]) == (1, 0)
    assert (urgent["timeout_us"], bulk["timeout_us"]) == (0, TIMEOUT_US)
    assert urgent["request_count"] + bulk["request_count"] == level["request_count"]
    assert urgent["error_count"] == bulk["error_count"] == level["error_count"] == 0
    for c in (urgent, bulk):
        assert 0 < c["p50_ms"] <= c["p90_ms"] <= c["p99_ms"], c
        assert c["p50_ms"] >= DEVICE_MS, c
    assert urgent["p90_ms"] < bulk["p50_ms"], level["classes"]
    assert urgent["p99_ms"] < level["p99_ms"], level["classes"]


def test_a_queue_timeout_rejects_only_the_class_that_sends_no_override(
    answer: dict[str, Any],
) -> None:
    level = answer["rejecting"]
    classes = _by_name(level)
    urgent, bulk = classes["urgent"], classes["bulk"]
    assert urgent["request_count"] > 0 and bulk["request_count"] > 0
    assert urgent["error_count"] == 0, level["errors"]
    assert bulk["error_count"] > 0, level
    assert bulk["error_count"] == level["error_count"]
    assert any("timeout" in kind.lower() for kind in level["errors"]), level["errors"]
    # Per class goals: the rejected bulk class misses the error budget.
    assert answer["rejecting_slacks"]["bulk"]["err_slack"] > 0
    assert answer["rejecting_verdict"][0] is False


def test_pre_built_http_requests_carry_the_parameters_as_tritonclient_writes_them(
    answer: dict[str, Any],
) -> None:
    headers = answer["headers"]
    for client in ("raw", "geventhttpclient"):
        urgent, bulk = headers[client]
        assert urgent["parameters"] == {"priority": 1}  # no timeout set, none sent
        assert bulk["parameters"] == {"timeout": TIMEOUT_US}  # priority 0: none sent
        assert urgent["inputs"] == bulk["inputs"]


# ---- child side ---------------------------------------------------------------------------------


def _header(request: bytes) -> dict[str, Any]:
    """The JSON inference header of a whole pre-built HTTP request."""
    head, _, body = request.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")[1:]
    return _body_header(body, dict(line.split(": ", 1) for line in lines))


def _body_header(body: bytes, headers: dict[str, str]) -> dict[str, Any]:
    length = int(headers["Inference-Header-Content-Length"])
    header: dict[str, Any] = json.loads(body[:length])
    return header


def main(protocol: str, workers: int) -> None:
    """Child side: serve the two models, measure each under the mix, print the answer."""
    from analyzer.config.scenario import load_scenario
    from analyzer.load import LocustLoadGenerator
    from analyzer.load.clients import fetch_model_documents
    from analyzer.load.engine import engine_options
    from analyzer.load.inputs import build_inputs
    from analyzer.load.prepared import prepare_requests
    from analyzer.measure.arrivals import POISSON
    from analyzer.measure.goals import class_slacks, meets_goals
    from analyzer.measure.specs import Goals, LoadMode, LoadSpec
    from tests.load.refserver import RefServer, write_sim_model

    repo = Path(tempfile.mkdtemp(prefix="perfsweep-priority-"))
    models = {"ordered": ORDERED, "rejecting": REJECTING}
    for name, batching in models.items():
        write_sim_model(repo, name, DEVICE_MS, max_batch_size=1, dynamic_batching=batching)
    scenario = load_scenario(
        None,
        {"traffic.classes": CLASSES, "model.protocol": protocol, "goals.p99_ms": 5000.0},
        env={},
    )
    goals = Goals(
        p99_ms=scenario.goals.p99_ms,
        max_error_rate=0.01,
        classes=scenario.traffic.class_goals(),
    )
    window = {"warmup_s": 0.5, "window_s": 1.0, "max_windows": 3, "seed": 3}
    specs = {
        "ordered": LoadSpec(LoadMode.CONCURRENCY, USERS, **window),
        "rejecting": LoadSpec(LoadMode.REQUEST_RATE, RATE_RPS, POISSON, **window),
    }
    answer: dict[str, Any] = {}
    with RefServer(repo, tuple(models)) as srv:
        for name in models:
            options = engine_options(
                scenario,
                f"http://{srv.http_url}",
                name,
                metrics_url=srv.metrics_url,
                grpc_url=srv.grpc_url,
                workers=workers,
            )
            with LocustLoadGenerator(options) as generator:
                m = generator.measure(specs[name])
            answer[name] = m.to_dict()
            answer[f"{name}_verdict"] = list(meets_goals(m, goals))
            answer[f"{name}_slacks"] = class_slacks(m, goals)
        metadata, config = fetch_model_documents("http", srv.http_url, "ordered")
        classes = engine_options(scenario, f"http://{srv.http_url}", "ordered").classes
        inputs = build_inputs(metadata, config)
        raw = prepare_requests("http", srv.http_url, inputs, "raw", classes)
        pooled = prepare_requests("http", srv.http_url, inputs, "geventhttpclient", classes)
        answer["headers"] = {
            "raw": [_header(r[0]) for r in raw.by_class],
            "geventhttpclient": [_body_header(*b[0]) for b in pooled.by_class],
        }
    print(json.dumps(answer), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
