"""The response cache against the real Triton 2.51 (``--cache-config local``), same requests.

Statistics (success, queue, compute, cache_hit/cache_miss counts, inference and execution
counts, batch_stats) and the per-model cache counters must agree, including Triton's key quirk:
the same input bytes under another shape are a hit. Triton refreshes its server-wide
``nv_cache_*`` gauges once a second, so those are not compared.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from reference_server.core.config import config_to_text
from reference_server.core.server import CoreOptions, InferenceServer
from reference_server.core.types import InferRequest
from tests.support.differential import settled_stats
from tests.support.real_triton import RealTriton, TensorSpec, TritonInstall, sleep_model_config
from tests.support.servers import for_reference, write_model

pytestmark = [pytest.mark.triton, pytest.mark.slow]

#: (value, shape) of each request, in order: miss, hit, miss, hit, hit (same bytes, other shape).
REQUESTS = [(1.0, (1, 16)), (1.0, (1, 16)), (2.0, (1, 16)), (1.0, (1, 16)), (1.0, (2, 8))]
PER_MODEL = (
    "nv_cache_num_hits_per_model",
    "nv_cache_num_misses_per_model",
    "nv_inference_count",
    "nv_inference_exec_count",
    "nv_inference_request_success",
)


def _counts(stats: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {k: v["count"] for k, v in stats["inference_stats"].items()}
    out["inference_count"] = stats["inference_count"]
    out["execution_count"] = stats["execution_count"]
    out["batch_stats"] = [
        (b["batch_size"], b["compute_infer"]["count"]) for b in stats["batch_stats"]
    ]
    return out


def _series(text: str) -> dict[str, float]:
    values = {}
    for line in text.splitlines():
        name = line.split("{", 1)[0]
        if name in PER_MODEL and 'model="c"' in line:
            values[name] = float(line.rsplit(" ", 1)[1])
    return values


def test_cache_statistics_and_metrics_match(triton_install: TritonInstall, tmp_path: Path) -> None:
    cfg = sleep_model_config("c", inputs=(TensorSpec(dims=(-1,)),))
    cfg.response_cache.enable = True
    caches = triton_install.server_bin.parent.parent / "caches"
    with RealTriton(
        triton_install,
        tmp_path / "triton",
        models=(cfg,),
        extra_args=("--cache-config=local,size=1048576", f"--cache-directory={caches}"),
    ) as triton:
        for value, shape in REQUESTS:
            body = {
                "inputs": [
                    {
                        "name": "INPUT0",
                        "shape": list(shape),
                        "datatype": "FP32",
                        "data": [value] * 16,
                    }
                ]
            }
            status, payload = triton.http_status("POST", "/v2/models/c/infer", body)
            assert status == 200, payload
        # The Python backend counts an executed request after answering it: wait for the
        # counts of all requests (two misses executed, one item each) before reading either side.
        expected_stats = _counts(settled_stats(triton, "c", successes=len(REQUESTS), items=2))
        expected_series = _series(triton.metrics_text())

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        write_model(root, "c", config_to_text(for_reference(cfg)))
        server = InferenceServer(
            CoreOptions(model_repositories=(root,), startup_models=("c",), cache_size_bytes=1 << 20)
        )
        server.start()
        try:
            for value, shape in REQUESTS:
                data = np.full(shape, value, dtype=np.float32)
                server.infer_sync(InferRequest("c", inputs={"INPUT0": data}), timeout_s=10)
            stats = _counts(server.model_statistics("c")["model_stats"][0])
            series = _series(server.metrics_text())
        finally:
            server.stop()

    assert expected_stats["cache_hit"] == 3 and expected_stats["cache_miss"] == 2
    assert stats == expected_stats
    assert series == expected_series
