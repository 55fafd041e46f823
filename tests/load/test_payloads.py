"""The engine's payload options on a real reference server: repeats, unique payloads and shapes.

The witness of repeats is the server's response cache (``--cache-size``, ``response_cache``
enabled): a request whose input bytes the cache holds is a hit, so the hit share of the
requests sent is the share of the traffic that repeated an earlier payload.
"""

from __future__ import annotations

import json
import urllib.request
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

from tests.load.child import run_module
from tests.support.servers import cached_reference_server, write_model

pytestmark = pytest.mark.slow

MODELS = ("repeats", "fresh", "mix")


def _config(name: str) -> str:
    return f"""
name: "{name}"
backend: "identity"
max_batch_size: 8
input {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] }}
output {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] }}
response_cache {{ enable: true }}
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, spawns: None) -> Iterator[str]:
    root = tmp_path_factory.mktemp("payloads")
    for name in MODELS:
        write_model(root / "repo", name, _config(name))
    with cached_reference_server(root / "repo", 256 * 2**20) as url:
        yield url


def _cache_counts(url: str, model: str) -> tuple[int, int]:
    with urllib.request.urlopen(f"http://{url}/v2/models/{model}/stats", timeout=30) as resp:
        stats = json.loads(resp.read())["model_stats"][0]["inference_stats"]
    return int(stats["cache_hit"]["count"]), int(stats["cache_miss"]["count"])


def _load(url: str, model: str, options: dict[str, Any], users: int = 4) -> dict[str, Any]:
    spec = {
        "url": url,
        "model": model,
        "options": {"shapes": {"INPUT0": [16]}, **options},
        "level": {
            "mode": "concurrency",
            "target": users,
            "warmup_s": 0.3,
            "window_s": 1.0,
            "max_windows": 2,
            "stable_windows": 2,
            "seed": 3,
        },
    }
    return run_module("tests.load.payload_driver", stdin=json.dumps(spec), timeout_s=240.0)


def test_repeat_ratio_is_the_share_of_cache_hits_on_the_wire(server: str) -> None:
    answer = _load(server, "repeats", {"unique_payloads": 4000, "repeat_ratio": 0.9})
    hits, misses = _cache_counts(server, "repeats")
    sent = hits + misses
    assert answer["measurement"]["error_count"] == 0
    assert answer["unique"] == 4000 and answer["rotation"] == 40000
    # One request object per distinct payload, shared by the repeats (built once per process).
    assert answer["distinct_request_objects"] == 4000
    assert answer["shared_by_clients"]
    assert 500 < sent < answer["rotation"], "the rotation was walked once, in part"
    # Four users share one walk through the rotation: each payload is sent once, and a tenth
    # of the slots are new payloads; per-user walks would have made nearly every request a hit.
    assert 0.85 < hits / sent < 0.95, (hits, misses)


def test_without_repeats_no_request_hits_the_cache(server: str) -> None:
    answer = _load(server, "fresh", {"unique_payloads": 20000})
    hits, misses = _cache_counts(server, "fresh")
    assert answer["measurement"]["error_count"] == 0
    assert 500 < misses < 20000
    assert hits == 0


def test_a_distribution_sends_each_payload_with_its_own_shape(server: str) -> None:
    distribution = [
        {"shapes": {"INPUT0": [4]}, "weight": 3.0},
        {"shapes": {"INPUT0": [32]}, "weight": 1.0},
    ]
    answer = _load(
        server, "mix", {"unique_payloads": 400, "distribution": distribution, "batch_size": 2}
    )
    assert answer["measurement"]["error_count"] == 0
    shapes = Counter(tuple(request["INPUT0"]) for request in answer["wire"])
    assert set(shapes) == {(2, 4), (2, 32)}, shapes
    assert 0.65 < shapes[(2, 4)] / len(answer["wire"]) < 0.85, shapes
    hits, misses = _cache_counts(server, "mix")
    assert hits + misses > 100
