"""A three-step pipeline of Triton Python-backend models, written from code (tests and
benchmarks): a cheap preprocess, a GPU-like model whose device work is serialised by a lock every
instance shares, a cheap postprocess, joined by the ensemble ``pipe``; and a BLS model ``bls``
that calls ``pre`` then ``infer`` for each request; and the comparison of the pipeline tuned as
one against its stages tuned one at a time (a test and a benchmark), on a real Triton."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from pathlib import Path

from google.protobuf import text_format

from analyzer.target.triton import managed_triton
from tests.support.real_triton import (
    SLEEP_MODEL_SOURCE,
    TensorSpec,
    TritonInstall,
    dynamic_batching,
    locked_device_source,
    sleep_model_config,
)
from tests.support.servers import write_model
from tests.support.sweeps import assemble, found, load, sweep

#: The ensemble's steps, in order.
STAGES = ("pre", "infer", "post")

ENSEMBLE = """
name: "pipe"
platform: "ensemble"
max_batch_size: 4
input [ { name: "IN" data_type: TYPE_FP32 dims: [ 16 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 16 ] } ]
ensemble_scheduling { step [
  { model_name: "pre" model_version: -1
    input_map { key: "INPUT0" value: "IN" } output_map { key: "OUTPUT0" value: "a" } },
  { model_name: "infer" model_version: -1
    input_map { key: "INPUT0" value: "a" } output_map { key: "OUTPUT0" value: "b" } },
  { model_name: "post" model_version: -1
    input_map { key: "INPUT0" value: "b" } output_map { key: "OUTPUT0" value: "OUT" } }
] }
"""

#: A BLS model: each request goes through pre, then infer, as two requests of its own.
BLS_SOURCE = '''\
"""BLS model (written by tests/support/pipelines.py): pre, then infer, per request."""

import triton_python_backend_utils as pb_utils


def _call(model, tensor):
    request = pb_utils.InferenceRequest(
        model_name=model,
        requested_output_names=["OUTPUT0"],
        inputs=[pb_utils.Tensor.from_dlpack("INPUT0", tensor)],
    )
    response = request.exec()
    if response.has_error():
        raise pb_utils.TritonModelException(response.error().message())
    return pb_utils.get_output_tensor_by_name(response, "OUTPUT0")


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            tensor = pb_utils.get_input_tensor_by_name(request, "INPUT0")
            out = _call("infer", _call("pre", tensor))
            responses.append(
                pb_utils.InferenceResponse(
                    output_tensors=[pb_utils.Tensor.from_dlpack("OUTPUT0", out)]
                )
            )
        return responses
'''


def _stage(name: str, delay_ms: float, max_batch_size: int = 8) -> str:
    config = sleep_model_config(
        name,
        max_batch_size=max_batch_size,
        inputs=(TensorSpec(dims=(16,)),),
        dynamic_batching=dynamic_batching(),
        execute_delay_ms=delay_ms,
    )
    return text_format.MessageToString(config)


def make_pipeline_repository(
    root: Path,
    *,
    host_ms: float = 1.0,
    device_ms: float = 6.0,
    per_item_ms: float = 1.0,
    edge_ms: float = 0.5,
) -> Path:
    """``root/repo`` with pre and post (``edge_ms`` an execution), infer (``host_ms`` that
    overlaps across instances, then ``device_ms + per_item_ms * batch`` under the lock file
    ``root/device.lock``), the ensemble ``pipe`` and the BLS model ``bls``."""
    repo = root / "repo"
    for name in ("pre", "post"):
        write_model(repo, name, _stage(name, edge_ms), model_source=SLEEP_MODEL_SOURCE)
    lock = locked_device_source(root / "device.lock", host_ms, device_ms, per_item_ms)
    write_model(repo, "infer", _stage("infer", 0.0), model_source=lock)
    write_model(repo, "pipe", ENSEMBLE)
    write_model(repo, "bls", _stage("bls", 0.0, max_batch_size=4), model_source=BLS_SOURCE)
    return repo


#: The scenario of every sweep of :func:`compare_joint_and_stagewise` (the joint one and each
#: stage's alone): the same goal, space and budget.
COMPARISON_SCENARIO = """
objective = "throughput"
[traffic]
min_rate_rps = 5.0
start_rps = 40.0
max_rate_rps = {max_rate_rps}
[goals]
p99_ms = {p99_ms}
max_error_rate = 0.01
[space]
max_batch_size = [4, 16]
max_queue_delay_us = [0, {max_delay_us}]
delay_steps = 4
instance_count = [1, 2]
[budget]
trials = {trials}
patience = {trials}
warmup_s = 0.5
window_s = 1.0
min_requests = 100
capacity_resolution = 0.1
validate_top = 1
validate_repeats = {validate_repeats}
validate_window_factor = 1.0
validation = "{validation}"
[search]
strategy = "{search}"
"""


@dataclass(frozen=True)
class Comparison:
    """What :func:`compare_joint_and_stagewise` sets up and measures."""

    p99_ms: float = 150.0
    max_rate_rps: float = 300.0
    max_delay_us: int = 16000
    trials: int = 8
    validate_repeats: int = 1
    search: str = "tpe"
    #: Capacity measurements of each answer, in the order A B B A ...
    rounds: int = 2
    #: The capacity search's resolution when each answer's tree is measured.
    resolution: float = 0.05

    def scenario(self) -> str:
        return COMPARISON_SCENARIO.format(
            max_rate_rps=self.max_rate_rps,
            p99_ms=self.p99_ms,
            max_delay_us=self.max_delay_us,
            trials=self.trials,
            validate_repeats=self.validate_repeats,
            # One repeat: the winner checked once at its capacity; more: the winner and the
            # baseline each measured that many times (a gain interval from repeats).
            validation="check" if self.validate_repeats == 1 else "repeats",
            search=self.search,
        )


@dataclass
class Answer:
    """One answer (the joint sweep's, or the stages' assembled): its run directories, the
    ``perfsweep run`` wall time, its repository tree and each capacity measured on it."""

    runs: dict[str, Path]
    wall_s: float
    tree: Path
    capacity_rps: list[float] = field(default_factory=list)

    @property
    def median_rps(self) -> float:
        return statistics.median(self.capacity_rps)


def triton_flags(install: TritonInstall) -> tuple[str, ...]:
    """``perfsweep run``'s flags for a managed Triton of ``install``."""
    return ("--server", "triton", "--triton-server-path", str(install.server_bin))


def ensemble_capacity(
    install: TritonInstall, repo: Path, work: Path, comparison: Comparison
) -> float:
    """The ensemble's capacity at the goal: Triton started on ``repo``, ``perfsweep load
    --find-capacity`` on ``pipe``."""
    triton = managed_triton("pipe", repo, work, install.server_bin, 180.0)
    triton.start()
    try:
        doc = load(
            triton.url,
            work / "capacity.json",
            *("--model", "pipe", "--find-capacity", "--p99-ms", str(comparison.p99_ms)),
            *("--max-rps", str(comparison.max_rate_rps)),
            *("--resolution", str(comparison.resolution)),
        )
        return float(doc["capacity_rps"])
    finally:
        triton.stop()


def compare_joint_and_stagewise(
    install: TritonInstall, repo: Path, work: Path, comparison: Comparison
) -> dict[str, Answer]:
    """The pipeline ``pipe`` of ``repo`` tuned as one (``joint``: every composing model's knobs
    in one search, the load to the ensemble, the goal its end-to-end p99) and its stages tuned
    one at a time (``stagewise``: each composing model swept alone with the same scenario, the
    answers assembled); each answer is what its search found (:func:`found`: a winner whose gain
    a run's few validation repeats could not call significant counts, on either side, since one
    side keeping its original config by that rule and the other not compares the rule's noise,
    not the searches); then one instrument measures both trees: Triton started on each,
    :func:`ensemble_capacity`, ``rounds`` times each in the order A B B A ... so that drift of
    the machine hits both alike."""
    scenario = comparison.scenario()
    server = triton_flags(install)
    joint_dir, joint_s = sweep(repo, work / "joint", scenario, *server, "--model", "pipe")
    alone: dict[str, Path] = {}
    stagewise_s = 0.0
    for stage in STAGES:
        alone[stage], seconds = sweep(
            repo, work / f"alone-{stage}", scenario, *server, "--model", stage
        )
        stagewise_s += seconds
    answers = {
        "joint": Answer(
            {"pipe": joint_dir},
            joint_s,
            assemble(repo, {s: found(joint_dir, s) for s in STAGES}, work / "tree-joint"),
        ),
        "stagewise": Answer(
            alone,
            stagewise_s,
            assemble(repo, {s: found(alone[s]) for s in STAGES}, work / "tree-stagewise"),
        ),
    }
    order = ["joint", "stagewise", "stagewise", "joint"] * ((comparison.rounds + 1) // 2)
    for i, which in enumerate(order[: 2 * comparison.rounds]):
        answer = answers[which]
        answer.capacity_rps.append(
            ensemble_capacity(install, answer.tree, work / f"measure-{i}", comparison)
        )
    return answers
