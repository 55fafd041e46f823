"""A mix of models against a real reference server: ``perfsweep load --mix`` sends each request
to a model drawn by weight, each model's requests built from its own inputs, and reports each
model's percentiles, requests and errors beside the server's own count per model.

The server serves two simulated models of different input widths (16 and 64 floats), so a
request built for one model is refused by the other: no errors means every request went to its
own model with its own inputs.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.support.servers import ReferenceProcess, write_sim_model
from tests.support.sweeps import CLI

BATCHING = "dynamic_batching { }"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, spawns: None) -> Any:
    workdir = tmp_path_factory.mktemp("mix")
    repo = workdir / "repo"
    write_sim_model(repo, "narrow", 2.0, 0.2, max_batch_size=8, dynamic_batching=BATCHING)
    write_sim_model(repo, "wide", 4.0, 0.5, max_batch_size=8, dynamic_batching=BATCHING, width=64)
    proc = ReferenceProcess(
        workdir, repository=repo, args=("--model=narrow", "--model=wide"), device="sim"
    )
    proc.start()
    try:
        yield proc
    finally:
        proc.stop()


def _load(out: Path, *flags: str) -> tuple[dict[str, Any], str]:
    done = subprocess.run(
        [*CLI, "load", "--output", str(out), *flags],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads(out.read_text()), done.stdout


def _reach(server: ReferenceProcess, form: str) -> tuple[str, ...]:
    """The flags that name the server and the protocol, in each form load takes."""
    if form == "http":
        return ("--url", server.http_url)
    if form == "grpc":  # statistics over HTTP from --url, the load to --grpc-url
        return ("--url", server.http_url, "--grpc-url", server.grpc_url, "--protocol", "grpc")
    # The form from before --grpc-url: the load to --url, statistics from --stats-url.
    return ("--url", server.grpc_url, "--protocol", "grpc", "--stats-url", server.http_url)


@pytest.mark.parametrize("form", ["http", "grpc", "grpc-old-form"])
def test_each_model_gets_its_share_with_its_own_inputs(
    server: ReferenceProcess, tmp_path: Path, form: str
) -> None:
    doc, stdout = _load(
        tmp_path / "mix.json",
        *_reach(server, form),
        *("--mix", "narrow=3,wide=1", "--rate-rps", "120"),
        *("--warmup-s", "0.5", "--window-s", "1", "--max-windows", "3"),
    )
    assert doc["environment"]["protocol"] == ("http" if form == "http" else "grpc")
    assert doc["environment"]["mix"] == {"narrow": 0.75, "wide": 0.25}
    level = doc["results"][0]
    classes = {c["name"]: c for c in level["classes"]}
    assert {c["model"] for c in classes.values()} == {"narrow", "wide"}
    narrow, wide = classes["narrow"], classes["wide"]
    assert narrow["error_count"] == wide["error_count"] == level["error_count"] == 0
    sent = narrow["request_count"] + wide["request_count"]
    assert sent == level["request_count"] >= 200
    # Drawn by weight: 3 of 4 to narrow (n >= 200: the binomial's sd is under 0.031).
    assert narrow["request_count"] / sent == pytest.approx(0.75, abs=0.1)
    # The server's own count of each model in the same windows: every request the client
    # counted reached its model (those in flight at a window's end may be counted in the next).
    stages = level["server"]["stages"]
    for name, klass in classes.items():
        counted = stages[name]["success_count"]
        assert abs(counted - klass["request_count"]) <= level["max_in_flight"], name
    assert "narrow p99" in stdout and "wide p99" in stdout


def test_a_mix_has_a_capacity_where_every_model_meets_the_goal(
    server: ReferenceProcess, tmp_path: Path
) -> None:
    doc, stdout = _load(
        tmp_path / "capacity.json",
        *("--url", server.http_url),
        *("--mix", "narrow=1,wide=1", "--find-capacity", "--p99-ms", "60"),
        *("--start-rps", "50", "--max-rps", "600", "--resolution", "0.2"),
        *("--warmup-s", "0.3", "--window-s", "0.5"),
    )
    assert doc["capacity_rps"] > 0
    # Every step measured both models, each judged on its own p99 (the console's lines).
    steps = [p for p in doc["results"] if p["mode"] == "request_rate"]
    assert steps and all({c["model"] for c in p["classes"]} == {"narrow", "wide"} for p in steps)
    assert all(c["request_count"] > 0 for p in steps for c in p["classes"])
    assert "narrow p99" in stdout and "/60 ms" in stdout


def test_a_model_at_a_rate_of_its_own_holds_it_at_every_level(
    server: ReferenceProcess, tmp_path: Path
) -> None:
    doc, _ = _load(
        tmp_path / "held.json",
        *("--url", server.http_url),
        *("--mix", "narrow=1,wide=30/s", "--find-capacity", "--p99-ms", "60"),
        *("--start-rps", "60", "--max-rps", "400", "--resolution", "0.2"),
        *("--warmup-s", "0.3", "--window-s", "1"),
    )
    assert doc["environment"]["mix_rates_rps"] == {"wide": 30.0}
    steps = [p for p in doc["results"] if p["mode"] == "request_rate"]
    assert len(steps) >= 2 and doc["capacity_rps"] > 30.0
    for step in steps:
        classes = {c["model"]: c for c in step["classes"]}
        # wide's share of each level is its own rate over the level's (the rest is narrow's).
        assert classes["wide"]["share"] == pytest.approx(30.0 / step["target"])
        sent = sum(c["request_count"] for c in classes.values())
        wide_rps = classes["wide"]["request_count"] / sent * step["offered_rps"]
        assert wide_rps == pytest.approx(30.0, rel=0.35), step["target"]
