"""A text classifier on a real Triton: INT64 ``[-1]`` token ids and mask, a batch padded to its
longest sentence, and a corpus of sentences of mixed lengths as a perf_analyzer data file.

Shared by the tests and the benchmarks that need a variable-length model whose batches form
only where Triton lets requests of different shapes share one (``allow_ragged_batch``).
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Sequence
from pathlib import Path

from tritonclient.grpc import model_config_pb2 as mc

from tests.support.real_triton import TensorSpec, sleep_model_config

PADDED_SEQUENCE_SOURCE = '''\
"""Transformer-like model (written by benchmarks/simulator_vs_server.py): a batch of token
sequences runs padded to its longest member.

Each execute() sleeps (or, with BURN, spins) BASE_MS + PER_TOKEN_MS * rows * longest, where rows is the batch's items
(the requests' batch dims summed) and longest the longest sequence (dim 1) of any request in
it: what padding a ragged batch to one length costs a transformer. Input k is returned as
output k.

With DEVICE_LOCK (a file every instance opens), that device part runs holding an exclusive
flock on it, so the instances (separate stub processes) queue for one device; HOST_MS per
request of the batch is slept before it, outside the lock: host work that overlaps across
instances.
"""

import fcntl
import time

import triton_python_backend_utils as pb_utils

BASE_MS = {base_ms!r}
PER_TOKEN_MS = {per_token_ms!r}
NAMES = {names!r}
BURN = {burn!r}
HOST_MS = {host_ms!r}
DEVICE_LOCK = {device_lock!r}


class TritonPythonModel:
    def initialize(self, args):
        self.device = open(DEVICE_LOCK, "a+") if DEVICE_LOCK else None

    def finalize(self):
        if self.device is not None:
            self.device.close()

    def _device(self, seconds):
        if BURN:  # the work keeps a core busy, as a model on the CPU does
            end = time.perf_counter() + seconds
            while time.perf_counter() < end:
                pass
        else:
            time.sleep(seconds)

    def execute(self, requests):
        rows = 0
        longest = 0
        for r in requests:
            shape = pb_utils.get_input_tensor_by_name(r, NAMES[0][0]).shape()
            rows += shape[0]
            longest = max(longest, shape[1])
        seconds = (BASE_MS + PER_TOKEN_MS * rows * longest) / 1000.0
        if HOST_MS:
            time.sleep(HOST_MS * len(requests) / 1000.0)
        if self.device is None:
            self._device(seconds)
        else:
            fcntl.flock(self.device, fcntl.LOCK_EX)
            try:
                self._device(seconds)
            finally:
                fcntl.flock(self.device, fcntl.LOCK_UN)
        return [
            pb_utils.InferenceResponse(
                output_tensors=[
                    pb_utils.Tensor.from_dlpack(out, pb_utils.get_input_tensor_by_name(r, name))
                    for name, out in NAMES
                ]
            )
            for r in requests
        ]
'''


def padded_sequence_model(
    name: str,
    *,
    base_ms: float,
    per_token_ms: float,
    max_batch_size: int = 8,
    inputs: Sequence[str] = ("INPUT_IDS", "ATTENTION_MASK"),
    allow_ragged_batch: bool = True,
    burn: bool = False,
    host_ms: float = 0.0,
    device_lock: str | None = None,
) -> tuple[mc.ModelConfig, str]:
    """A text-classifier-like Python-backend model and its ``model.py``
    (:data:`PADDED_SEQUENCE_SOURCE`): INT64 ``[-1]`` inputs (token ids and mask), each echoed
    as its output, executing ``base_ms + per_token_ms * rows * longest sequence`` per batch.
    With ``allow_ragged_batch`` requests of different lengths share a batch (the model pads);
    without it Triton batches only requests of equal shapes. No dynamic batching, one instance:
    the model's own config, as a sweep's baseline measures it. ``burn``: the execution keeps a
    core busy for its time (a model on the CPU: instances beyond the free cores add nothing)
    instead of sleeping (a device the instances queue for). ``device_lock``: a file whose
    exclusive lock the device part holds, so the instances share one device; ``host_ms``: host
    work per request before it, which overlaps across instances."""
    specs = [
        TensorSpec(n, dims=(-1,), data_type="TYPE_INT64", allow_ragged_batch=allow_ragged_batch)
        for n in inputs
    ]
    config = sleep_model_config(name, max_batch_size=max_batch_size, inputs=specs)
    source = PADDED_SEQUENCE_SOURCE.format(
        base_ms=float(base_ms),
        per_token_ms=float(per_token_ms),
        names=[(s.name, s.output_name) for s in specs],
        burn=burn,
        host_ms=float(host_ms),
        device_lock=device_lock,
    )
    return config, source


def sentence_lengths(count: int = 40, seed: int = 7) -> list[int]:
    """Token counts of a planted corpus: log-normal (median ~45), 12 to 300, both ends present."""
    rng = random.Random(seed)
    tail = [int(min(300, max(12, math.exp(rng.gauss(3.8, 0.8))))) for _ in range(count - 2)]
    lengths = [12, 300, *tail]
    rng.shuffle(lengths)
    return lengths


def write_data_file(path: Path, lengths: list[int], seed: int = 7) -> None:
    """A perf_analyzer ``--input-data`` file: one entry per sentence (ids and mask)."""
    rng = random.Random(seed)
    entries = [
        {"INPUT_IDS": [rng.randrange(1000, 30000) for _ in range(n)], "ATTENTION_MASK": [1] * n}
        for n in lengths
    ]
    path.write_text(json.dumps({"data": entries}))


#: A sweep of the text model over its data file (``{data}``): open loop, p99 <= 200 ms, the
#: space :func:`text_scenario` bounds; ``{extra}`` adds ``[space]`` keys (``ragged_batch``).
TEXT_SCENARIO = """
objective = "throughput"
[model]
name = "{model}"
[input]
data_file = "{data}"
[traffic]
min_rate_rps = 5.0
start_rps = 40.0
max_rate_rps = 1000.0
[goals]
p99_ms = 200.0
max_error_rate = 0.01
[space]
max_batch_size = [{mbs_low}, 8]
max_queue_delay_us = [0, {delay_high}]
delay_steps = {delay_steps}
preferred_batch_size = "none"
instance_count = [{instances_low}, {instances_high}]
{extra}
[budget]
trials = {trials}
warmup_s = 0.5
window_s = 0.5
min_requests = 60
capacity_resolution = 0.1
validate_top = {validate_top}
[search]
strategy = "{strategy}"
profile_time_s = 20.0
"""


def text_scenario(
    data: Path,
    *,
    model: str = "textcls",
    ragged: str | None = None,
    trials: int = 20,
    wide: bool = True,
    validate_top: int = 2,
    instances: tuple[int, int] | None = None,
    strategy: str = "predict",
) -> str:
    """:data:`TEXT_SCENARIO` for ``data``. ``wide``: max batch 1-8, delays 0-20 ms, 1-2
    instances (what a user would search); else the one config max batch 8, no delay, two
    instances. ``instances``: other instance bounds; ``ragged``: ``space.ragged_batch`` (None:
    the model's own setting); ``strategy``: ``search.strategy``."""
    low, high = instances or ((1, 2) if wide else (2, 2))
    return TEXT_SCENARIO.format(
        model=model,
        data=data,
        mbs_low=1 if wide else 8,
        delay_high=20000 if wide else 0,
        delay_steps=3 if wide else 1,
        instances_low=low,
        instances_high=high,
        extra=f'ragged_batch = "{ragged}"' if ragged else "",
        trials=trials,
        validate_top=validate_top,
        strategy=strategy,
    )
