"""The simulator against the real reference server on the simulated device.

The server runs in-process (``ServerThread``) with a jitter-free simulated model; a seeded
open-loop Poisson client sends batch-1 requests over gRPC for a few seconds; the server's
batch-size histogram (its statistics extension's ``batch_stats``) is compared with the
simulator's at the same rate and config, on the execution times the server's statistics
measured in that run (the model's profile TOML for sizes it ran fewer than 20 times): the
batcher is compared, not this machine's sleep overshoot.

Tolerance: the total-variation distance between the two histograms (shares of executions)
at most 0.15, and the server's mean batch size from 15 % below the simulator's to 25 % above. The server adds what the simulator leaves out
(thread hand-overs, sleep overshoot of a few hundred µs per phase, the client's send jitter),
which shifts a few batches by one size; a batcher that diverged (e.g. no prefetching, or
ignoring the delay) moves far more than that.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from analyzer.predict.sim_records import SimConfig
from analyzer.predict.simulator import simulate
from analyzer.predict.sources import from_statistics, from_toml
from tests.support.servers import write_sim_model
from tests.support.traffic import open_loop_grpc

pytestmark = pytest.mark.usefixtures("serves", "quiet_machine")

RATE_RPS = 300.0
DURATION_S = 4.0
CONFIG = SimConfig(max_batch_size=8, max_queue_delay_us=2000, instance_count=1)


def _shares(hist: dict[int, int]) -> dict[int, float]:
    total = sum(hist.values())
    return {b: n / total for b, n in hist.items()}


def _tv(a: dict[int, int], b: dict[int, int]) -> float:
    sa, sb = _shares(a), _shares(b)
    return 0.5 * sum(abs(sa.get(k, 0.0) - sb.get(k, 0.0)) for k in set(sa) | set(sb))


def _mean_batch(hist: dict[int, int]) -> float:
    return sum(b * n for b, n in hist.items()) / sum(hist.values())


def _open_loop(grpc_url: str, model: str, rate: float, duration_s: float, seed: int) -> int:
    import tritonclient.grpc as grpcclient

    inputs = [grpcclient.InferInput("INPUT0", [1, 16], "FP32")]
    inputs[0].set_data_from_numpy(np.zeros((1, 16), dtype=np.float32))
    return open_loop_grpc(grpc_url, model, [inputs], rate, duration_s, seed)


@pytest.mark.timeout(120)
def test_batch_histogram_matches_the_server(tmp_path: Path) -> None:
    from reference_server.app import ServerOptions, ServerThread

    repo = tmp_path / "repo"
    model_dir = write_sim_model(
        repo,
        "simlin",
        device_ms=2.0,
        per_item_ms=1.0,
        max_batch_size=CONFIG.max_batch_size,
        instances=CONFIG.instance_count,
        dynamic_batching=(
            f"dynamic_batching {{ max_queue_delay_microseconds: {CONFIG.max_queue_delay_us} }}"
        ),
    )
    options = ServerOptions(
        model_repositories=(repo,), models=("simlin",), device="cpu", delay_scheduler=0
    )
    server = ServerThread(options).start()
    try:
        before = server.core.model_statistics("simlin")
        sent = _open_loop(server.grpc_url, "simlin", RATE_RPS, DURATION_S, seed=11)
        after = server.core.model_statistics("simlin")
    finally:
        server.stop()
    assert not before["model_stats"][0]["batch_stats"]
    measured = {
        int(b["batch_size"]): int(b["compute_infer"]["count"])
        for b in after["model_stats"][0]["batch_stats"]
    }
    assert sum(b * n for b, n in measured.items()) == sent

    # The same statistics make a profile: device time per batch size as configured. A sleep
    # never ends early but overshoots by what the OS scheduler adds (0.6 ms seen on this
    # busy 2-core machine), hence the one-sided bound.
    stats_profile = from_statistics(after, "simlin", server="reference server")
    observed = {t.batch_size: t for t in stats_profile.timings if t.executions >= 20}
    for t in observed.values():
        configured = 2.0 + 1.0 * t.batch_size
        assert configured - 0.05 <= t.infer_ms <= configured * 1.3 + 0.5

    # The batcher is what is compared, so the simulator runs the execution times this server
    # had in this run (the sizes it ran often enough; the planted ones elsewhere): a busy
    # machine that stretches every sleep (seen: 17 % larger batches than the planted times
    # predict, one run in a suite) moves both sides alike.
    planted = from_toml(model_dir / "profile.toml", max_batch_size=CONFIG.max_batch_size)
    profile = replace(
        planted,
        timings=tuple(observed.get(t.batch_size, t) for t in planted.timings),
    )
    predicted = simulate(profile, CONFIG, RATE_RPS, requests=20000, seed=1).batch_sizes
    tv = _tv(measured, predicted)
    print(f"server {_shares(measured)}\nsimulator {_shares(predicted)}\nTV distance {tv:.3f}")
    assert tv <= 0.15
    # Mean batch sizes: one-sided slack. A batcher timer that fires late and a client that
    # bunches its sends (it shares the GIL with the server's threads) only ever make batches
    # larger: +16 % was seen in a quiet full-suite run. Below, 15 % still catches a batcher
    # that ignores the queue delay (1.39 simulated against 1.63); above, 25 % one that waits
    # twice as long (2.20).
    ratio = _mean_batch(measured) / _mean_batch(predicted)
    assert 0.85 <= ratio <= 1.25, ratio
