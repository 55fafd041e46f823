"""Open-loop traffic for comparing a server with the simulator (the probe test and
``benchmarks/simulator_vs_server.py``): Poisson arrivals sent at their due times over gRPC
(``tritonclient``'s ``async_infer``), whatever the server's pace."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Sequence
from typing import Any


def open_loop_grpc(
    grpc_url: str,
    model: str,
    bodies: Sequence[list[Any]],
    rate_rps: float,
    duration_s: float,
    seed: int,
) -> int:
    """Send Poisson arrivals at ``rate_rps`` for ``duration_s``, each request one of ``bodies``
    (lists of ``InferInput``; drawn at random when there are several), wait for every answer and
    return how many were sent. Fails the test on any error or an answer that never comes."""
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(grpc_url)
    rng = random.Random(seed)
    done = threading.Semaphore(0)
    errors: list[object] = []

    def callback(result: object, error: object) -> None:
        if error is not None:
            errors.append(error)
        done.release()

    sent = 0
    start = time.monotonic()
    due = 0.0
    while True:
        due += rng.expovariate(rate_rps)
        if due > duration_s:
            break
        wait = start + due - time.monotonic()
        if wait > 0:
            time.sleep(wait)  # the scenario: Poisson arrivals at their due times
        body = bodies[0] if len(bodies) == 1 else rng.choice(bodies)
        client.async_infer(model, body, callback)
        sent += 1
    for _ in range(sent):
        assert done.acquire(timeout=30), "a response never came"
    client.close()
    assert not errors, errors[:3]
    return sent


def fp32_bodies(*lengths: int) -> list[list[Any]]:
    """One request body per length: ``INPUT0``, FP32 zeros of shape ``[1, n]``."""
    import numpy as np
    import tritonclient.grpc as grpcclient

    bodies = []
    for n in lengths:
        tensor = grpcclient.InferInput("INPUT0", [1, n], "FP32")
        tensor.set_data_from_numpy(np.zeros((1, n), dtype=np.float32))
        bodies.append([tensor])
    return bodies
