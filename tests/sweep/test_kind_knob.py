"""``space.instance_kind``: KIND_CPU vs KIND_GPU as a searched knob.

Pure parts first (rendering, reading back, choices, encoding, the search that cannot predict
it); then a grid sweep in virtual time on a server without GPUs, which refuses a KIND_GPU group
with the reference server's own check (Triton's words): that trial fails with the server's
message, the KIND_CPU one is measured, and the recommended config says KIND_CPU.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from analyzer.config.choices import kind_choices
from analyzer.config.knobs import Knobs
from analyzer.config.model_config import apply_knobs
from analyzer.config.scenario import load_scenario
from analyzer.errors import InputError
from analyzer.predict.virtual import VirtualLoad, VirtualServer
from analyzer.rundir.results import load_summary, parse_config_text
from analyzer.search.space import SearchSpace
from analyzer.search.strategy import resolve
from analyzer.sweep.loop import run_sweep
from analyzer.target.protocol import ConfigRejectedError
from reference_server.core.config import normalize, validate_instance_groups
from reference_server.core.errors import ServerError
from tests.sweep.test_e2e_sim import make_repo


def _config(
    groups: str = "instance_group [{ count: 1 kind: KIND_GPU gpus: [0] }]",
) -> mc.ModelConfig:
    return text_format.Parse(
        'name: "m" backend: "simulated" max_batch_size: 8 '
        'input [{ name: "x" data_type: TYPE_FP32 dims: [4] }] '
        'output [{ name: "y" data_type: TYPE_FP32 dims: [4] }] ' + groups,
        mc.ModelConfig(),
    )


def test_the_kind_renders_into_the_group_and_a_cpu_group_loses_its_gpu_list() -> None:
    cpu = apply_knobs(_config(), Knobs(8, instance_count=2, instance_kind="KIND_CPU"))
    (group,) = cpu.instance_group
    assert (group.kind, list(group.gpus), group.count) == (mc.ModelInstanceGroup.KIND_CPU, [], 2)
    gpu = apply_knobs(
        _config("instance_group [{ kind: KIND_CPU }]"), Knobs(8, instance_kind="KIND_GPU")
    )
    assert gpu.instance_group[0].kind == mc.ModelInstanceGroup.KIND_GPU
    kept = apply_knobs(_config(), Knobs(8))
    assert kept.instance_group[0].kind == mc.ModelInstanceGroup.KIND_GPU  # None: the model's own


def test_dict_and_label_name_the_kind_only_when_set() -> None:
    plain = Knobs(16, 500, (16, 8), 2)
    assert "instance_kind" not in plain.to_dict()
    gpu = Knobs(16, 500, (16, 8), 2, instance_kind="KIND_GPU")
    assert gpu.label() == "mbs=16 delay=500us pref=[16,8] x2 gpu"
    for knobs in (plain, gpu, Knobs(4, instance_kind="KIND_CPU")):
        assert Knobs.from_dict(knobs.to_dict()) == knobs
    with pytest.raises(ValueError, match="instance_kind 'KIND_TPU'"):
        Knobs(4, instance_kind="KIND_TPU")


def test_choices_and_what_is_refused() -> None:
    assert kind_choices(None) == (None,)
    assert kind_choices(["KIND_GPU", "KIND_CPU", "KIND_GPU"]) == ("KIND_GPU", "KIND_CPU")
    with pytest.raises(InputError, match="unknown kind"):
        kind_choices(["KIND_MODEL"])
    two = _config("instance_group [{ kind: KIND_CPU }, { kind: KIND_GPU gpus: [0] }]")
    with pytest.raises(InputError, match="several instance groups"):
        kind_choices(["KIND_GPU", "KIND_CPU"], two)


def test_the_space_encodes_the_kind_as_one_more_dimension() -> None:
    space = SearchSpace.from_bounds(
        (1, 8), (0, 0), 1, "none", (1, 1), kind_choices=("KIND_GPU", "KIND_CPU")
    )
    assert space.param_bounds() == {"log2_mbs": (0, 3), "kind_idx": (0, 1)}
    assert space.size() == 8
    knobs = space.decode({"log2_mbs": 2, "kind_idx": 1})
    assert (knobs.max_batch_size, knobs.instance_kind) == (4, "KIND_CPU")
    assert space.encode(knobs) == {"log2_mbs": 2, "kind_idx": 1}


def test_predict_falls_back_to_tpe_when_the_kind_is_searched() -> None:
    scenario = load_scenario(None, {"space.instance_kind": ["KIND_GPU", "KIND_CPU"]}, env={})
    strategy, note = resolve(scenario, _config())
    assert strategy == "tpe"
    assert note is not None and "instance kind" in note


SCENARIO = """
objective = "throughput"
[model]
name = "tiny"
[traffic]
min_rate_rps = 5.0
start_rps = 40.0
max_rate_rps = 200.0
[goals]
p99_ms = 150.0
[space]
max_batch_size = [16, 16]
max_queue_delay_us = [0, 0]
delay_steps = 1
preferred_batch_size = "none"
instance_count = [1, 1]
instance_kind = ["KIND_GPU", "KIND_CPU"]
[budget]
trials = 2
patience = 10
warmup_s = 0.3
window_s = 0.5
min_requests = 60
capacity_resolution = 0.3
validate_top = 0
[search]
strategy = "grid"
"""


class WithoutGpus(VirtualServer):
    """The simulated server on a host without GPUs: a config with a KIND_GPU group is refused
    by the reference server's load-stage check (its config normalised first, as it loads one),
    in its words (Triton's)."""

    def load_config(self, config: mc.ModelConfig, *, wait_for_model: bool = True) -> None:
        try:
            name = config.name or self.model
            validate_instance_groups(normalize(config, model_name=name, gpu_ids=()), gpu_ids=())
        except ServerError as exc:
            raise ConfigRejectedError(f"load of {config.name!r} failed: {exc}") from exc
        super().load_config(config, wait_for_model=wait_for_model)


@pytest.mark.usefixtures("takes_seconds")
def test_a_kind_the_host_lacks_fails_its_trial_and_the_other_kind_is_chosen(
    tmp_path: Path,
) -> None:
    repo = make_repo(tmp_path)  # the e2e tests' tiny simulated model, one KIND_CPU instance
    (tmp_path / "kinds.toml").write_text(SCENARIO)
    scenario = load_scenario(
        tmp_path / "kinds.toml", {"model.repository": str(repo), "model.device": "sim"}, env={}
    )
    server = WithoutGpus.of(scenario)
    run_dir = tmp_path / "run"
    run_sweep(
        scenario,
        target=server,
        load=VirtualLoad(server, scenario),
        run_dir=run_dir,
        clock=server.clock,
    )
    summary = load_summary(run_dir)
    assert summary["trials"]["failed"] == 1 and summary["trials"]["complete"] == 1, summary
    assert summary["best"]["config"]["instance_kind"] == "KIND_CPU"
    best = parse_config_text((run_dir / summary["best"]["config_path"]).read_text())
    assert best.instance_group[0].kind == mc.ModelInstanceGroup.KIND_CPU
    (failed,) = [
        line for line in (run_dir / "trials.csv").read_text().splitlines() if "failed" in line
    ]
    # The server's refusal, as Triton words it, and the kind it refused.
    assert "KIND_GPU" in failed and "no GPUs" in failed, failed
