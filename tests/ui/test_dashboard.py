"""``perfsweep ui`` end to end: a real reference server, Locust's web UI on port 0, real requests.

One ``perfsweep ui --url`` process (module fixture) serves the page and JSON tests; the numbers
it reports are compared with what the server itself says on ``/v2/models/<m>/stats`` and
``/metrics`` once the load has stopped. Separate processes cover the login, the refusal to bind
other addresses without one, and Locust workers.
"""

from __future__ import annotations

import re
import urllib.error
import urllib.request
from collections.abc import Iterator
from http.cookiejar import CookieJar
from pathlib import Path
from typing import Any

import pytest

from tests.ui.support import (
    MODEL,
    UI_READY,
    Child,
    child_env,
    dashboard_model,
    http,
    perfsweep,
    quiet_truth,
    reference_server,
    start_ui,
    wait_agreement,
    wait_until,
    write_sim_model,
)

pytestmark = [pytest.mark.usefixtures("spawns"), pytest.mark.timeout(240)]


#: A second model whose queue timeout rejects requests under load (failures by reason: REJECTED,
#: which Triton counts for queue timeouts, not for a full queue).
FULL = "queue_timeout"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    root = tmp_path_factory.mktemp("ui-server")
    repo = root / "repo"
    write_sim_model(repo, MODEL, **dashboard_model())
    write_sim_model(
        repo,
        FULL,
        **dashboard_model(
            20.0,
            "default_queue_policy { timeout_action: REJECT default_timeout_microseconds: 2000 }",
        ),
    )
    with reference_server(repo, root / "server.log") as fields:
        yield fields


def _start_ui(tmp: Path, server: dict[str, str], *extra: str, **env: str) -> tuple[Child, str]:
    return start_ui(
        tmp,
        f"http://{server['http']}",
        MODEL,
        server["grpc"],
        f"http://{server['metrics']}/metrics",
        *extra,
        **env,
    )


@pytest.fixture(scope="module")
def ui(tmp_path_factory: pytest.TempPathFactory, server: dict[str, str]) -> Iterator[str]:
    child, base = _start_ui(tmp_path_factory.mktemp("ui"), server)
    try:
        yield base
    finally:
        assert child.stop() in (0, 130), child.tail()


def _doc(base: str) -> dict[str, Any]:
    status, doc = http("GET", f"{base}/perfsweep/server")
    assert status == 200, doc
    assert isinstance(doc, dict)
    return doc


def _swarm(base: str, users: int, classes: list[str], **extra: Any) -> None:
    form = {"user_count": users, "spawn_rate": users, "user_classes": classes, **extra}
    status, answer = http("POST", f"{base}/swarm", form=form)
    assert status == 200 and answer["success"], answer


def test_page_has_the_server_tab_and_panel(ui: str) -> None:
    status, page = http("GET", ui + "/")
    assert status == 200
    assert "./perfsweep/static/panel.js" in page
    assert re.search(r'"extended_tabs":\s*\[\{"key":\s*"server",\s*"title":\s*"Server"\}\]', page)
    for name in ("TritonHttpUser", "TritonGrpcOpenLoopUser", "SpikeShape", "DiurnalShape"):
        assert name in page  # the class picker offers users and shapes
    assert "rate_per_user" in page  # perfsweep's custom parameters in the form
    status, script = http("GET", ui + "/perfsweep/static/panel.js")
    assert status == 200 and "textContent" in script


def test_other_web_pages_cannot_drive_the_dashboard(ui: str) -> None:
    request = urllib.request.Request(
        ui + "/perfsweep/config",
        data=b'{"max_queue_delay_us": 1}',
        method="POST",
        headers={"Content-Type": "application/json", "Origin": "http://evil.example"},
    )
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=10)
    assert refused.value.code == 403
    swarm = urllib.request.Request(
        ui + "/swarm", data=b"user_count=1&spawn_rate=1", headers={"Origin": "http://evil.example"}
    )
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(swarm, timeout=10)
    assert refused.value.code == 403
    rebound = urllib.request.Request(ui + "/perfsweep/server", headers={"Host": "evil.example"})
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(rebound, timeout=10)
    assert refused.value.code == 403
    assert _doc(ui)["state"] in ("ready", "stopped")  # nothing was started


def test_server_json_matches_the_servers_own_numbers(ui: str, server: dict[str, str]) -> None:
    _swarm(ui, 4, ["TritonHttpUser", "TritonGrpcUser"])
    doc = wait_until(
        lambda: (
            (d := _doc(ui))["client"]["window"]["requests"] >= 300
            and (d.get("server") or {}).get("window", {}).get("execution_count", 0) > 0
            and d
        ),
        60,
        "300 requests seen by the dashboard",
    )
    assert doc["state"] in ("running", "spawning") and doc["users"] == 4
    window = doc["server"]["window"]
    assert window["avg_batch_size"] >= 1.0
    assert sum(window["batch_sizes"].values()) == window["execution_count"]
    assert window["queue_us"] > 0 and window["compute_us"] > 0
    client = doc["client"]["window"]
    assert client["errors"] == 0 and 0 < client["p50_ms"] <= client["p99_ms"] <= client["max_ms"]
    rows = http("GET", ui + "/stats/requests")[1]["extended_stats"]
    assert rows[0]["key"] == "server"
    assert {r["metric"] for r in rows[0]["data"]} >= {"average batch size", "pending requests"}

    assert http("POST", ui + "/stop")[0] == 200
    truth = quiet_truth(f"http://{server['http']}", f"http://{server['metrics']}/metrics", MODEL)
    wait_agreement(ui, truth)
    # Every request the client recorded reached the server; at most one per user was cut off
    # when Locust stopped the users mid-request.
    recorded = _doc(ui)["client"]["since_start"]["requests"]
    assert truth["inference_count"] - 4 <= recorded <= truth["inference_count"]


def test_config_change_applies_while_load_runs(ui: str, server: dict[str, str]) -> None:
    _swarm(ui, 3, ["TritonHttpOpenLoopUser"], rate_per_user=40)
    wait_until(lambda: _doc(ui)["client"]["window"]["requests"] >= 50, 60, "open-loop traffic")
    status, answer = http(
        "POST",
        ui + "/perfsweep/config",
        body={
            "max_queue_delay_us": 3000,
            "preferred_batch_size": "4,2",
            "max_batch_size": 8,
            "instance_count": 2,
        },
    )
    assert status == 200, answer
    expected = {
        "max_batch_size": 8,
        "max_queue_delay_us": 3000,
        "preferred_batch_size": [4, 2],
        "instance_count": 2,
    }
    assert answer["config"] == expected
    _, config = http("GET", f"http://{server['http']}/v2/models/{MODEL}/config")
    assert int(config["dynamic_batching"]["max_queue_delay_microseconds"]) == 3000
    assert [int(s) for s in config["dynamic_batching"]["preferred_batch_size"]] == [4, 2]
    assert sum(int(g["count"]) for g in config["instance_group"]) == 2
    # The dashboard notices the reload and keeps reporting from the new counters.
    doc = wait_until(
        lambda: (
            (d := _doc(ui))["server_reloads"] >= 1
            and d["config"] == expected
            and (d["server"] or {}).get("window", {}).get("execution_count", 0) > 0
            and d
        ),
        30,
        "the reloaded model's numbers",
    )
    assert doc["client"]["window"]["errors"] == 0  # no request was lost to the reload
    status, refused = http("POST", ui + "/perfsweep/config", body={"preferred_batch_size": [64]})
    assert status == 400 and "exceed max_batch_size" in refused["error"]
    status, refused = http("POST", ui + "/perfsweep/config", body={"max_batch_size": 0})
    assert status == 400 and "between 1" in refused["error"]
    assert http("POST", ui + "/stop")[0] == 200


def test_failures_by_reason_match_the_server(tmp_path: Path, server: dict[str, str]) -> None:
    http_url, metrics_url = f"http://{server['http']}", f"http://{server['metrics']}/metrics"
    child, base = start_ui(tmp_path, http_url, FULL, server["grpc"], metrics_url)
    try:
        _swarm(base, 12, ["TritonHttpUser"])
        doc = wait_until(
            lambda: (
                (d := _doc(base))["client"]["window"]["errors"] >= 20
                and (d.get("server") or {})
                .get("window", {})
                .get("failures_by_reason", {})
                .get("REJECTED", 0)
                > 0
                and d
            ),
            60,
            "rejected requests",
        )
        kinds = doc["client"]["window"]["error_kinds"]
        assert kinds and all("HTTP 503: Request timeout expired" in k for k in kinds), kinds
        assert http("POST", base + "/stop")[0] == 200
        truth = quiet_truth(http_url, metrics_url, FULL)
        assert truth["failures_by_reason"]["REJECTED"] > 0
        wait_agreement(base, truth)
        recorded = _doc(base)["client"]["since_start"]
        rejected = truth["failures_by_reason"]["REJECTED"]
        # Client errors are the server's rejections (a stop may cut one request per user).
        assert rejected - 12 <= recorded["errors"] <= rejected
    finally:
        child.stop()


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        (["--web-host", "0.0.0.0"], {}, "refusing to serve the dashboard on 0.0.0.0"),
        (["--web-host", "0.0.0.0", "--web-login"], {}, "--web-login needs a password"),
    ],
)
def test_non_loopback_without_credentials_is_refused(
    tmp_path: Path, args: list[str], env: dict[str, str], message: str
) -> None:
    # The URL points nowhere: the refusal must come before anything is contacted or started.
    child = Child(
        perfsweep("ui", "--url", "http://127.0.0.1:9", "--web-port", "0", *args),
        tmp_path / "ui.log",
        env=child_env(**env),
    )
    assert child.proc.wait(60) == 2
    text = " ".join(child.tail().split())
    assert message in text and "PERFSWEEP_UI_PASSWORD" in text


def test_login_protects_the_dashboard(tmp_path: Path, server: dict[str, str]) -> None:
    child, base = _start_ui(
        tmp_path, server, "--web-login", PERFSWEEP_UI_PASSWORD="s3cret", PERFSWEEP_UI_USER="ops"
    )
    try:
        assert "login required: user 'ops'" in child.seen[-1]
        status, body = http("GET", base + "/perfsweep/server")
        assert status != 200 or not isinstance(body, dict)  # the login page, not the data
        jar = CookieJar()
        opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
        form = {"username": "ops", "password": "wrong"}
        http("POST", base + "/perfsweep/login", form=form, opener=opener)
        status, body = http("GET", base + "/perfsweep/server", opener=opener)
        assert not isinstance(body, dict)
        form["password"] = "s3cret"
        http("POST", base + "/perfsweep/login", form=form, opener=opener)
        status, body = http("GET", base + "/perfsweep/server", opener=opener)
        assert status == 200 and isinstance(body, dict) and body["model"] == MODEL
    finally:
        child.stop()


@pytest.mark.slow
def test_workers_report_exact_latencies_to_the_dashboard(
    tmp_path: Path, server: dict[str, str]
) -> None:
    child, base = _start_ui(tmp_path, server, "--workers", "2")
    try:
        wait_until(
            lambda: http("GET", base + "/worker-count")[1].get("worker_count") == 2,
            60,
            "two workers",
        )
        _swarm(base, 4, ["TritonHttpUser"])
        doc = wait_until(
            lambda: (d := _doc(base))["client"]["window"]["requests"] >= 200 and d,
            60,
            "worker ticks",
        )
        assert doc["client"]["window"]["p99_ms"] > 0
        assert http("POST", base + "/stop")[0] == 200
    finally:
        assert child.stop() in (0, 130), child.tail()


def test_managed_server_is_started_and_stopped_with_the_dashboard(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    write_sim_model(repo, MODEL, **dashboard_model())
    child = Child(
        perfsweep(
            "ui",
            "--model-repository",
            str(repo),
            "--model",
            MODEL,
            "--device",
            "sim",
            "--web-port",
            "0",
            "--log-dir",
            str(tmp_path / "ui"),
        ),
        tmp_path / "ui.log",
    )
    try:
        target = child.wait_line("perfsweep ui: target ", 120).split()[3]
        base = re.search(r"(http://\S+?)/ ", child.wait_line(UI_READY) + " ")
        assert base, child.seen
        doc = wait_until(lambda: (d := _doc(base.group(1)))["config"] and d, 30, "the model config")
        assert doc["model"] == MODEL and doc["target"] == target
        assert doc["config"]["max_batch_size"] == 8
        assert doc["config"]["max_queue_delay_us"] == 1000
        assert doc["server"]["pending_requests"] == 0  # metrics URL taken from the ready line
        assert http("GET", f"{target}/v2/health/ready")[0] == 200
    finally:
        assert child.stop() in (0, 130), child.tail()
    # SIGTERM to perfsweep ui stops Locust and the reference server it started.
    with pytest.raises(OSError):
        urllib.request.urlopen(f"{target}/v2/health/live", timeout=5)
