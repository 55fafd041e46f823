"""A trace that records which request data each request sent is replayed with that data.

The reference server's response cache is the witness: it answers a request whose inputs it has
seen. The request data holds 300 distinct entries; a replay sends at most 150 (50 req/s, three
1 s windows). Replayed with a ``payload`` column that names
entry 0 for every request, every request after the first is a cache hit; the same times without
the column walk the data in rotation, so no request repeats one. Each replay
has a model of its own, so one's cached responses cannot answer the other's.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.servers import cached_reference_server, write_model
from tests.support.sweeps import CLI

ENTRIES = 300


def _config(name: str) -> str:
    return f"""
name: "{name}"
backend: "identity"
max_batch_size: 8
input {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] }}
output {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] }}
instance_group [{{ count: 1 kind: KIND_CPU }}]
response_cache {{ enable: true }}
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, spawns: None) -> Iterator[str]:
    root = tmp_path_factory.mktemp("trace-payloads")
    for name in ("pinned", "rotated"):
        write_model(root / "repo", name, _config(name))
    with cached_reference_server(root / "repo", 16 * 2**20) as url:
        yield url


def _load(
    url: str, model: str, trace: Path, data: Path, out: Path
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            *CLI,
            "load",
            "--url",
            url,
            "--model",
            model,
            "--trace",
            str(trace),
            "--input-data",
            str(data),
            "--request-rate",
            "50",
            "--warmup-s",
            "0",
            "--window-s",
            "1",
            "--max-windows",
            "3",
            "--output",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=180,
    )


def _hits(out: Path) -> tuple[int, int]:
    document: dict[str, Any] = json.loads(out.read_text())
    (level,) = document["results"]
    server = level["server"]
    return server["cache_hit_count"], server["cache_miss_count"]


def test_recorded_payloads_are_sent_as_recorded(server: str, tmp_path: Path) -> None:
    data = tmp_path / "data.json"
    entries = [{"INPUT0": [float(i)] * 16} for i in range(ENTRIES)]
    data.write_text(json.dumps({"data": entries}))
    times = [i * 0.01 for i in range(ENTRIES)]
    pinned = tmp_path / "pinned.csv"
    pinned.write_text("t,payload\n" + "".join(f"{t:.3f},0\n" for t in times))
    rotated = tmp_path / "rotated.csv"
    rotated.write_text("t\n" + "".join(f"{t:.3f}\n" for t in times))

    done = _load(server, "pinned", pinned, data, tmp_path / "pinned.json")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    hits, misses = _hits(tmp_path / "pinned.json")
    print(f"pinned: {hits} hits, {misses} misses")
    assert hits > 40 and misses <= 1  # one entry: only the first request could miss

    done = _load(server, "rotated", rotated, data, tmp_path / "rotated.json")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    hits, misses = _hits(tmp_path / "rotated.json")
    print(f"rotated: {hits} hits, {misses} misses")
    assert hits == 0 and misses > 40

    # An index past the data is a clear error, not a silent wrap.
    past = tmp_path / "past.csv"
    past.write_text(f"t,payload\n0,0\n0.01,{ENTRIES}\n0.02,1\n")
    done = _load(server, "pinned", past, data, tmp_path / "past.json")
    assert done.returncode != 0
    assert f"a request sends payload {ENTRIES}, but the request data holds {ENTRIES}" in (
        done.stdout + done.stderr
    )
