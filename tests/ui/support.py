"""Helpers for the dashboard tests: a small simulated model, the reference server and
``perfsweep ui`` / ``locust`` as child processes whose stdout lines are read without blocking.

Processes, waits and models come from :mod:`tests.support.servers`; this module adds what only
the dashboard tests need (``perfsweep ui``, the server's own totals, agreement with them).
"""

from __future__ import annotations

import contextlib
import json
import re
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from reference_server.ready import READY_PREFIX as SERVER_READY
from tests.support.servers import (
    REPO_ROOT,
    ChildProcess,
    NotYet,
    ReferenceProcess,
    child_env,
    children_of,
    process_gone,
    wait_all_gone,
    wait_until,
    write_sim_model,
)

#: The dashboard tests' handle on a child process (the one in tests/support/servers.py).
Child = ChildProcess
UI_READY = "perfsweep ui: dashboard at "
MODEL = "simple"


def dashboard_model(device_ms: float = 2.0, batching: str = "") -> dict[str, Any]:
    """:func:`write_sim_model` arguments of the dashboard tests' model.

    ``device_ms`` + 0.2 ms per batch item, no jitter, batches to 8 with a 1 ms queue delay;
    ``batching`` goes inside ``dynamic_batching { ... }`` (e.g. a queue policy).
    """
    return {
        "device_ms": device_ms,
        "per_item_ms": 0.2,
        "max_batch_size": 8,
        "dynamic_batching": f"dynamic_batching {{ max_queue_delay_microseconds: 1000 {batching} }}",
    }


__all__ = [
    "MODEL",
    "REPO_ROOT",
    "SERVER_READY",
    "TOTAL_KEYS",
    "UI_READY",
    "Child",
    "child_env",
    "children_of",
    "dashboard_model",
    "http",
    "perfsweep",
    "process_gone",
    "quiet_truth",
    "reference_server",
    "server_truth",
    "start_ui",
    "wait_agreement",
    "wait_all_gone",
    "wait_until",
    "write_sim_model",
]


def perfsweep(*args: str) -> list[str]:
    """The ``perfsweep`` command line in this interpreter."""
    return [sys.executable, "-c", "from analyzer.cli import main; main()", *args]


@contextlib.contextmanager
def reference_server(repository: Path, log: Path) -> Iterator[dict[str, str]]:
    """The reference server serving ``repository`` (sim device); yields its ready-line fields."""
    server = ReferenceProcess(
        log.parent, repository=repository, device="sim", startup_timeout_s=60.0, log=log
    )
    server.start()
    try:
        addresses = server.addresses
        assert addresses is not None
        host = addresses.http_url.rsplit(":", 1)[0]
        yield {
            "http": addresses.http_url,
            "grpc": addresses.grpc_url,
            "metrics": f"{host}:{addresses.metrics_port}",
        }
    finally:
        server.stop(20.0)


def http(
    method: str,
    url: str,
    body: Any = None,
    form: dict[str, Any] | None = None,
    opener: urllib.request.OpenerDirector | None = None,
    timeout_s: float = 30.0,
) -> tuple[int, Any]:
    """One request; JSON decoded when the answer is JSON, text otherwise."""
    data = None
    headers = {}
    if body is not None:
        data = json.dumps(body).encode()
        headers["Content-Type"] = "application/json"
    elif form is not None:
        data = urllib.parse.urlencode(form, doseq=True).encode()
        headers["Content-Type"] = "application/x-www-form-urlencoded"
    request = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with (opener or urllib.request.build_opener()).open(request, timeout=timeout_s) as resp:
            status, raw, ctype = resp.status, resp.read(), resp.headers.get("Content-Type", "")
    except urllib.error.HTTPError as exc:
        status, raw, ctype = exc.code, exc.read(), exc.headers.get("Content-Type", "")
    if "json" in ctype:
        return status, json.loads(raw)
    return status, raw.decode(errors="replace")


def start_ui(
    tmp: Path, http_url: str, model: str, grpc_url: str, metrics_url: str, *extra: str, **env: str
) -> tuple[Child, str]:
    """``perfsweep ui --url`` on a free port; returns the child and the dashboard's base URL."""
    child = Child(
        perfsweep(
            "ui",
            "--url",
            http_url,
            "--model",
            model,
            "--grpc-url",
            grpc_url,
            "--metrics-url",
            metrics_url,
            "--web-port",
            "0",
            *extra,
        ),
        tmp / "ui.log",
        env=child_env(**env),
    )
    line = child.wait_line(UI_READY)
    match = re.search(r"(http://\S+?)/? ", line + " ")
    assert match, line
    return child, match.group(1)


def server_truth(http_url: str, metrics_url: str, model: str) -> dict[str, Any]:
    """What a server itself reports for ``model``: statistics totals and Prometheus counters."""
    from prometheus_client.parser import text_string_to_metric_families

    _, stats = http("GET", f"{http_url}/v2/models/{model}/stats")
    entry = stats["model_stats"][0]
    batches = {str(b["batch_size"]): int(b["compute_infer"]["count"]) for b in entry["batch_stats"]}
    _, text = http("GET", metrics_url)
    failures: dict[str, int] = {}
    pending = None
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.labels.get("model") != model:
                continue
            # prometheus_client's parser names counter samples with a _total suffix.
            if s.name.removesuffix("_total") == "nv_inference_request_failure":
                reason = s.labels.get("reason", "OTHER")
                failures[reason] = failures.get(reason, 0) + int(s.value)
            elif s.name == "nv_inference_pending_request_count":
                pending = (pending or 0) + int(s.value)
    return {
        "inference_count": int(entry["inference_count"]),
        "execution_count": int(entry["execution_count"]),
        "batch_executions": batches,
        "failures_by_reason": failures,
        "pending_requests": pending,
    }


def quiet_truth(http_url: str, metrics_url: str, model: str, timeout_s: float = 30.0) -> dict:
    """``server_truth`` once the server is quiet: nothing pending and nothing changing for 1 s.

    After Locust stops its users, requests already on the wire still arrive for a moment, so a
    single "pending == 0" reading is not the end of the traffic.
    """
    last: list[dict] = []

    def quiet() -> dict:
        now = server_truth(http_url, metrics_url, model)
        settled = last[-1:] == [now] and now["pending_requests"] in (0, None)
        last[:] = [now]
        if not settled:
            raise NotYet(f"still changing or pending: {now}")
        return now

    # Polled once a second: "quiet" means the same totals one second apart.
    return wait_until(quiet, timeout_s, f"{model} on {http_url} to go quiet", poll_s=1.0)


TOTAL_KEYS = (
    "inference_count",
    "execution_count",
    "batch_executions",
    "failures_by_reason",
    "pending_requests",
)


def wait_agreement(dashboard_url: str, truth: dict, timeout_s: float = 15.0) -> dict:
    """Wait until the dashboard's server totals equal ``truth`` (a quiet server's own numbers).

    The dashboard scrapes once a second, so its next document must agree on every key; if it
    never does, the assertion shows both sides.
    """

    def agreeing() -> dict:
        _, doc = http("GET", f"{dashboard_url}/perfsweep/server")
        totals = (doc.get("server") or {}).get("totals", {})
        diff = {k: (totals.get(k), truth[k]) for k in TOTAL_KEYS if totals.get(k) != truth[k]}
        if diff:
            raise NotYet(f"dashboard vs server (dashboard, server): {diff}")
        return dict(totals)

    return wait_until(agreeing, timeout_s, "the dashboard to agree with the server", poll_s=0.5)
