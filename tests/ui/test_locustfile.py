"""A plain ``locust -f scenarios/locustfile.py`` against a real reference server."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.ui.support import (
    MODEL,
    REPO_ROOT,
    UI_READY,
    Child,
    dashboard_model,
    http,
    reference_server,
    wait_until,
    write_sim_model,
)

pytestmark = [pytest.mark.usefixtures("spawns"), pytest.mark.timeout(180)]

LOCUSTFILE = str(REPO_ROOT / "scenarios" / "locustfile.py")
SHAPES = str(REPO_ROOT / "scenarios" / "shapes.py")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    root = tmp_path_factory.mktemp("locustfile")
    write_sim_model(root / "repo", MODEL, **dashboard_model())
    with reference_server(root / "repo", root / "server.log") as fields:
        yield fields


def _locust(*args: str) -> list[str]:
    return [sys.executable, "-m", "locust", "-f", *args]


def test_headless_run_counts_requests(tmp_path: Path, server: dict[str, str]) -> None:
    # Model discovery (no --triton-model) and every user class: HTTP/gRPC, closed/open loop.
    child = Child(
        _locust(
            LOCUSTFILE,
            "--host",
            f"http://{server['http']}",
            "--grpc-url",
            server["grpc"],
            "--headless",
            "-u",
            "4",
            "-r",
            "4",
            "-t",
            "4s",
            "--json",
            "--only-summary",
        ),
        tmp_path / "locust.log",
    )
    assert child.proc.wait(90) == 0, child.tail()
    stats = json.loads(child.stdout())
    assert stats and stats[0]["name"] == MODEL
    assert stats[0]["num_requests"] > 50 and stats[0]["num_failures"] == 0


def test_web_mode_binds_loopback_and_serves_the_server_tab(
    tmp_path: Path, server: dict[str, str]
) -> None:
    # Locust's default --web-host is every interface; the locustfile narrows it to loopback.
    child = Child(
        _locust(
            f"{LOCUSTFILE},{SHAPES}",
            "--class-picker",
            "--host",
            f"http://{server['http']}",
            "--web-port",
            "0",
            "--triton-model",
            MODEL,
            "--metrics-url",
            f"http://{server['metrics']}/metrics",
        ),
        tmp_path / "locust.log",
    )
    try:
        line = child.wait_line(UI_READY, 60)
        assert line.startswith(UI_READY + "http://127.0.0.1:")
        base = line[len(UI_READY) :].split("/ ")[0]
        form = {
            "user_count": 2,
            "spawn_rate": 2,
            "user_classes": ["TritonHttpOpenLoopUser"],
            "shape_class": "SteadyShape",
            "rate_per_user": 25,
        }
        status, answer = http("POST", base + "/swarm", form=form)
        assert status == 200 and "SteadyShape" in answer["message"]
        doc = wait_until(
            lambda: (
                (d := http("GET", base + "/perfsweep/server")[1])["client"]["window"]["requests"]
                >= 40
                and d
            ),
            60,
            "open-loop requests",
        )
        assert doc["users"] == 2 and doc["model"] == MODEL
        assert doc["server"]["window"]["execution_count"] > 0
        http("POST", base + "/stop")
    finally:
        child.stop()


def test_web_mode_refuses_other_interfaces_without_login(tmp_path: Path) -> None:
    child = Child(
        _locust(LOCUSTFILE, "--host", "http://127.0.0.1:9", "--web-host", "0.0.0.0"),
        tmp_path / "locust.log",
    )
    assert child.proc.wait(60) == 2
    assert "refusing to serve the dashboard on 0.0.0.0" in child.tail()


def test_the_request_data_reaches_the_users(tmp_path: Path, server: dict[str, str]) -> None:
    # perfsweep ui --batch-size 2 passes the request data as --perfsweep-input: every request of
    # every user class then carries two samples (the server counts two inferences each).
    def counts() -> tuple[int, int]:
        status, doc = http("GET", f"http://{server['http']}/v2/models/{MODEL}/stats")
        assert status == 200
        stats = doc["model_stats"][0]
        return int(stats["inference_stats"]["success"]["count"]), int(stats["inference_count"])

    before = counts()
    child = Child(
        _locust(
            LOCUSTFILE,
            "--host",
            f"http://{server['http']}",
            "--grpc-url",
            server["grpc"],
            "--triton-model",
            MODEL,
            "--perfsweep-input",
            json.dumps({"inputs": {"batch_size": 2, "mode": "random"}}),
            "--headless",
            "-u",
            "2",
            "-r",
            "2",
            "-t",
            "3s",
            "--only-summary",
        ),
        tmp_path / "locust.log",
    )
    assert child.proc.wait(90) == 0, child.tail()
    after = counts()
    requests, inferences = after[0] - before[0], after[1] - before[1]
    assert requests > 10 and inferences == 2 * requests
