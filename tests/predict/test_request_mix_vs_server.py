"""Requests of two shapes that may not share a batch: the simulator against the reference server.

The model has one FP32 ``[-1]`` input without ``allow_ragged_batch``, so the server (as Triton)
batches requests of equal shape only; a seeded open-loop Poisson client sends lengths 16 and 17
half and half. The simulator runs the same load as a request mix of two kinds with different
batching keys. Compared as in ``test_vs_server.py`` (same tolerance, same reasons): the batch
histograms' total-variation distance at most 0.15 and mean batch sizes within 15 %. Mixing the
shapes in one batch, as an unkeyed mix would, gives batches over 1.5x as large.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from analyzer.predict.profile import RequestKind, RequestMix
from analyzer.predict.sim_records import SimConfig
from analyzer.predict.simulator import simulate
from analyzer.predict.sources import from_statistics, from_toml
from tests.predict.test_vs_server import _mean_batch, _shares, _tv
from tests.support.servers import write_sim_model
from tests.support.traffic import open_loop_grpc

pytestmark = pytest.mark.usefixtures("serves", "quiet_machine")

RATE_RPS = 300.0
DURATION_S = 4.0
LENGTHS = (16, 17)
CONFIG = SimConfig(max_batch_size=8, max_queue_delay_us=5000, instance_count=1)


def _open_loop(grpc_url: str, model: str, seed: int) -> int:
    """Poisson arrivals at RATE_RPS for DURATION_S, each request of a length drawn 50/50."""
    import tritonclient.grpc as grpcclient

    bodies = []
    for n in LENGTHS:
        tensor = grpcclient.InferInput("INPUT0", [1, n], "FP32")
        tensor.set_data_from_numpy(np.zeros((1, n), dtype=np.float32))
        bodies.append([tensor])
    return open_loop_grpc(grpc_url, model, bodies, RATE_RPS, DURATION_S, seed)


@pytest.mark.timeout(120)
def test_unequal_shapes_batch_apart_as_on_the_server(tmp_path: Path) -> None:
    from reference_server.app import ServerOptions, ServerThread

    repo = tmp_path / "repo"
    model_dir = write_sim_model(
        repo,
        "simvar",
        device_ms=2.0,
        per_item_ms=1.0,
        max_batch_size=CONFIG.max_batch_size,
        dynamic_batching=(
            f"dynamic_batching {{ max_queue_delay_microseconds: {CONFIG.max_queue_delay_us} }}"
        ),
    )
    config = model_dir / "config.pbtxt"
    config.write_text(config.read_text().replace("dims: [ 16 ]", "dims: [ -1 ]"))
    options = ServerOptions(
        model_repositories=(repo,), models=("simvar",), device="cpu", delay_scheduler=0
    )
    server = ServerThread(options).start()
    try:
        sent = _open_loop(server.grpc_url, "simvar", seed=5)
        stats = server.core.model_statistics("simvar")
    finally:
        server.stop()
    measured = {
        int(b["batch_size"]): int(b["compute_infer"]["count"])
        for b in stats["model_stats"][0]["batch_stats"]
    }
    assert sum(b * n for b, n in measured.items()) == sent

    # The execution times this server had (as test_vs_server.py: the batcher is compared).
    observed = {
        t.batch_size: t for t in from_statistics(stats, "simvar").timings if t.executions >= 20
    }
    planted = from_toml(model_dir / "profile.toml", max_batch_size=CONFIG.max_batch_size)
    timings = tuple(observed.get(t.batch_size, t) for t in planted.timings)
    keyed = RequestMix("elements", tuple(RequestKind(n, 0.5, k) for k, n in enumerate(LENGTHS)))
    profile = replace(planted, timings=timings, mix=keyed)
    predicted = simulate(profile, CONFIG, RATE_RPS, requests=20000, seed=1).batch_sizes
    tv = _tv(measured, predicted)
    print(f"server {_shares(measured)}\nsimulator {_shares(predicted)}\nTV distance {tv:.3f}")
    assert tv <= 0.15
    assert _mean_batch(measured) == pytest.approx(_mean_batch(predicted), rel=0.15)
    # Had the simulator let the two shapes share batches, it would be far off.
    mixed = replace(keyed, kinds=tuple(replace(k, key=None) for k in keyed.kinds))
    unkeyed = simulate(replace(profile, mix=mixed), CONFIG, RATE_RPS, requests=20000, seed=1)
    assert _mean_batch(unkeyed.batch_sizes) > 1.3 * _mean_batch(measured)
