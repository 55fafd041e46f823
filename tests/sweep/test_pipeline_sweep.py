"""`perfsweep run --model <ensemble>` tunes a pipeline: every composing model's knobs in one search,
load to the ensemble, one config.pbtxt per composing model, every stage restored on a shared
server; a BLS model is tuned with the composing models it names; and the pipelines it cannot
tune are refused before anything is loaded.

A three-step ensemble (a cheap preprocess, a model with a batch-dependent device time, a cheap
postprocess) of simulated models, swept in virtual time (``--server virtual`` in the test
process: the reference server's simulated device, the pipeline's stages chained in the
simulator), tiny budgets: these tests pin the plumbing; the quality of a pipeline's answer is the
benchmark's. The refusals run the command as a user does, against the managed reference server
it would start.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from tritonclient.grpc import model_config_pb2 as mc

from analyzer.config.model_config import knobs_of
from analyzer.config.pipeline import JointKnobs
from analyzer.config.scenario import Scenario, load_scenario
from analyzer.measure.capacity import CapacityResult
from analyzer.measure.specs import CapacitySpec
from analyzer.predict.virtual import VirtualLoad, VirtualServer
from analyzer.rundir.results import load_summary, load_trial_record, parse_config_text
from analyzer.sweep.loop import run_sweep
from reference_server.core.config import validate
from tests.support.servers import write_model, write_sim_model
from tests.support.sweeps import small_scenario, virtual_sweep

STAGES = ("pre", "infer", "post")

#: A BLS model (its code calls pre, then infer, per request): its config, which the sweep
#: never loads; its composing models are named with --composing-models.
BLS = """
name: "bls"
backend: "python"
max_batch_size: 4
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] } ]
instance_group [ { kind: KIND_CPU count: 1 } ]
"""


@pytest.fixture(autouse=True)
def _simulate_in_this_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """The predict phase's simulations in one process, not a pool: no child process, and the
    same answers (each group of configs is searched alike whatever the number of workers)."""
    for module in ("analyzer.search.strategy", "analyzer.sweep.predictions"):
        monkeypatch.setattr(f"{module}.sim_workers", lambda: 1)


def _ensemble(steps: tuple[str, ...] = STAGES, max_batch_size: int = 4) -> str:
    tensors = ["IN", *(f"t{i}" for i in range(len(steps) - 1)), "OUT"]
    body = ",\n".join(
        f'{{ model_name: "{model}" model_version: -1 '
        f'input_map {{ key: "INPUT0" value: "{tensors[i]}" }} '
        f'output_map {{ key: "OUTPUT0" value: "{tensors[i + 1]}" }} }}'
        for i, model in enumerate(steps)
    )
    return f"""
name: "pipe"
platform: "ensemble"
max_batch_size: {max_batch_size}
input [ {{ name: "IN" data_type: TYPE_FP32 dims: [ 16 ] }} ]
output [ {{ name: "OUT" data_type: TYPE_FP32 dims: [ 16 ] }} ]
ensemble_scheduling {{ step [ {body} ] }}
"""


def make_repo(root: Path, steps: tuple[str, ...] = STAGES) -> Path:
    repo = root / "repo"
    write_sim_model(
        repo, "pre", 0.3, 0.02, max_batch_size=16, dynamic_batching="dynamic_batching { }"
    )
    write_sim_model(
        repo, "infer", 4.0, 0.5, max_batch_size=16, dynamic_batching="dynamic_batching { }"
    )
    write_sim_model(
        repo, "post", 0.3, 0.02, max_batch_size=16, dynamic_batching="dynamic_batching { }"
    )
    write_model(repo, "pipe", _ensemble(steps))
    write_model(repo, "bls", BLS)
    return repo


def scenario_file(
    tmp_path: Path, trials: int = 2, validate_top: int = 1, model: str = "pipe"
) -> Path:
    path = tmp_path / f"{model}.toml"
    path.write_text(
        small_scenario(
            trials, max_rate_rps=300.0, p99_ms=150.0, model=model, validate_top=validate_top
        )
    )
    return path


def command(tmp_path: Path, run_dir: Path, trials: int = 2, validate_top: int = 1) -> list[str]:
    """``perfsweep run`` of the ensemble as a child process."""
    scenario = scenario_file(tmp_path, trials, validate_top)
    return [
        *(sys.executable, "-c", "from analyzer.cli import main; main()", "run"),
        *("--scenario", str(scenario), "--model", "pipe", "--run-dir", str(run_dir)),
    ]


@pytest.mark.usefixtures("takes_seconds")
def test_a_managed_ensemble_is_tuned_stage_by_stage_in_one_search(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    repo = make_repo(tmp_path)
    run_dir = tmp_path / "run"
    done = virtual_sweep(
        monkeypatch,
        capsys,
        *("--scenario", str(scenario_file(tmp_path)), "--model", "pipe"),
        *("--run-dir", str(run_dir), "--model-repository", str(repo), "--device", "sim"),
        "--report",
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    summary = load_summary(run_dir)
    # Every record holds one knob set per composing model, in step order; the ensemble's own
    # config is never one of them (it has no batcher).
    baseline = summary["baseline"]["config"]
    assert list(baseline["stages"]) == list(STAGES)
    for n in range(2):
        record = load_trial_record(run_dir / "trials" / f"{n:03d}" / "measurement.json")
        knobs = JointKnobs.from_dict(record["config"])
        assert knobs.names == STAGES
        # Each stage's max batch size is at least the ensemble's 4 (Triton's rule).
        assert min(k.max_batch_size for _, k in knobs.stages) >= 4
        for stage in STAGES:  # the configs the trial loaded, one per stage
            written = parse_config_text(
                (run_dir / "trials" / f"{n:03d}" / stage / "config.pbtxt").read_text()
            )
            assert written.name == stage and knobs_of(written) == knobs.stage(stage)
        assert not (run_dir / "trials" / f"{n:03d}" / "pipe").exists()
        # The load went to the ensemble: the server counted every request the generator did.
        point = record["measurement"]["best"]
        if point is not None:
            assert point["server"]["success_count"] >= point["request_count"] > 0
    assert summary["trials"]["complete"] == 2
    assert summary["best"]["meets_goals"]
    best = summary["best"]["config"]["stages"]
    if summary["recommendation"]["config"] == "best":
        # A drop-in repository tree: one config.pbtxt per composing model.
        assert summary["files"]["best_config"] == "best"
        for stage in STAGES:
            config = parse_config_text((run_dir / "best" / stage / "config.pbtxt").read_text())
            validate(config)
            assert config.name == stage and knobs_of(config).to_dict() == best[stage]
            assert config.parameters["profile"].string_value == "profile.toml"
    # Every window read the stages' own statistics with the ensemble's: the report and the
    # console show them at the operating point and name the stage that limits the pipeline
    # (infer: its executions take ten times the others').
    number = summary["best"]["trial_number"]
    folder = run_dir / ("baseline" if number < 0 else f"trials/{number:03d}")
    best_point = load_trial_record(folder / "measurement.json")["measurement"]["best"]
    stages = best_point["server"]["stages"]
    assert list(stages) == list(STAGES) and stages["infer"]["execution_count"] > 0
    report = (run_dir / "report.html").read_text()
    assert 'id="stages-best"' in report and "limits capacity" in report
    row = report[report.index('id="stages-best"') :]
    row = row[: row.index("limits capacity")]
    assert row[row.rindex("<tr") :].startswith('<tr class="limit"><td class="l">infer<')
    assert "best by stage: pre " in " ".join(done.stdout.split())
    # The console names each stage's knobs; trials.csv joins them in step order.
    assert "pre: mbs=" in done.stdout and " | infer: mbs=" in done.stdout
    header, first = (run_dir / "trials.csv").read_text().splitlines()[:2]
    assert header.startswith("number,") and first.count("/") >= 8  # 4 knob columns x 3 stages


@pytest.mark.usefixtures("takes_seconds")
def test_a_pipeline_is_predicted_stage_by_stage_and_its_predicted_best_measured_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--search predict`` on an ensemble: each composing model's profile taken on its own,
    the stages chained in the simulator over a pruned product of their spaces, the predicted
    best measured first, and every measured config's prediction error reported."""
    repo = make_repo(tmp_path)
    run_dir = tmp_path / "run"
    done = virtual_sweep(
        monkeypatch,
        capsys,
        *("--scenario", str(scenario_file(tmp_path, validate_top=0)), "--model", "pipe"),
        *("--run-dir", str(run_dir), "--model-repository", str(repo), "--device", "sim"),
        *("--search", "predict"),
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "searching with tpe" not in done.stdout
    profile = json.loads((run_dir / "profile.json").read_text())["pipeline"]
    assert profile["stages"] == list(STAGES)
    for stage in STAGES:  # each composing model's own profile, taken on its own
        probed = json.loads((run_dir / "profile-stages" / f"{stage}.json").read_text())
        assert probed["model"] == stage
    predictions = json.loads((run_dir / "predictions.json").read_text())
    configs = [JointKnobs.from_dict(c["config"]) for c in predictions["configs"]]
    assert len(configs) == 27 and all(k.names == STAGES for k in configs)
    assert list(predictions["profile"]["stages"]) == list(STAGES)
    best = max(predictions["configs"], key=lambda c: c["capacity_rps"])
    first = load_trial_record(run_dir / "trials" / "000" / "measurement.json")
    assert first["prediction"]["capacity_rps"] == best["capacity_rps"]
    assert first["config"] == best["config"]
    summary = load_summary(run_dir)
    assert summary["search_strategy"] == "predict"
    assert summary["best"]["meets_goals"]


@pytest.mark.usefixtures("takes_seconds")
def test_a_bls_model_is_tuned_with_its_named_composing_models(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A BLS model calls its composing models from its code, which no config states: named
    with --composing-models, they are tuned together while the load goes to the BLS model,
    whose own config is never loaded."""
    repo = make_repo(tmp_path)
    run_dir = tmp_path / "run"
    done = virtual_sweep(
        monkeypatch,
        capsys,
        *("--scenario", str(scenario_file(tmp_path, validate_top=0, model="bls"))),
        *("--model", "bls", "--composing-models", "pre,infer", "--run-dir", str(run_dir)),
        *("--model-repository", str(repo), "--device", "sim"),
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    summary = load_summary(run_dir)
    assert list(summary["baseline"]["config"]["stages"]) == ["pre", "infer"]
    folder = run_dir / "trials" / "000"
    record = load_trial_record(folder / "measurement.json")
    assert JointKnobs.from_dict(record["config"]).names == ("pre", "infer")
    assert sorted(p.name for p in folder.iterdir() if p.is_dir()) == ["infer", "pre"]
    point = record["measurement"]["best"]
    # The load went to the BLS model; its composing models served its calls.
    assert point is not None
    assert point["server"]["success_count"] >= point["request_count"] > 0
    stages = point["server"]["stages"]
    assert list(stages) == ["pre", "infer"]
    assert all(stages[s]["success_count"] >= point["request_count"] for s in stages)
    assert "pre: mbs=" in done.stdout and " | infer: mbs=" in done.stdout


# -- a killed sweep of a shared server ----------------------------------------------------------


@dataclass
class KilledInTrial(VirtualLoad):
    """Virtual load that keeps the run directory and the server's configs as a kill -9 during
    trial ``trial``'s capacity search leaves them (run.json still running, the trial without
    its measurement, the server on the trial's configs; nothing restored), then stops the
    sweep. The copy is ``kept``; the configs ``left``."""

    run_dir: Path = Path()
    kept: Path = Path()
    trial: int = 1
    left: dict[str, mc.ModelConfig] = field(default_factory=dict)

    def find_capacity(self, spec: CapacitySpec) -> CapacityResult:
        if not self.left and (self.run_dir / "trials" / f"{self.trial:03d}").exists():
            shutil.copytree(self.run_dir, self.kept)
            self.left = {name: self.server.configs[name] for name in STAGES}
            raise KeyboardInterrupt  # the sweep ends here; what it did after is thrown away
        return super().find_capacity(spec)


def shared_virtual_server(scenario: Scenario) -> VirtualServer:
    """The simulated server as a ``--url`` server: it outlives the sweep, which must give it
    back, and a lease in the study keeps two workers off it."""
    server = VirtualServer.of(scenario)
    server.shared, server.url = True, "http://127.0.0.1:8000"
    return server


def test_a_killed_sweep_of_a_shared_server_resumes_and_gives_every_stage_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """kill -9 during trial 1 leaves the server on trial 1's stage configs; ``--resume`` takes
    the originals from the run directory (not from the server), finishes, and loads them back."""
    repo = make_repo(tmp_path)
    scenario = load_scenario(
        scenario_file(tmp_path, trials=2, validate_top=0),
        {"model.repository": str(repo), "model.device": "sim", "run.report": False},
        env={},
    )
    run_dir = tmp_path / "run"
    server = shared_virtual_server(scenario)
    before = {stage: server.config_of(stage) for stage in STAGES}
    killed = KilledInTrial(server, scenario, run_dir=run_dir, kept=tmp_path / "at-kill")
    run_sweep(scenario, target=server, load=killed, run_dir=run_dir, clock=server.clock)
    # Trial 0 is the pipeline as found; trial 1 changes it.
    assert killed.left and any(killed.left[s] != before[s] for s in STAGES)
    assert json.loads((killed.kept / "run.json").read_text())["status"] == "running"
    assert not (killed.kept / "trials" / "001" / "measurement.json").exists()
    shutil.rmtree(run_dir)
    shutil.copytree(killed.kept, run_dir)
    # The server the resumed run finds: the killed run's trial-1 configs still loaded.
    server = shared_virtual_server(scenario)
    for config in killed.left.values():
        server.load_config(config)
    # The killed process no longer runs: its lease on the server is stale.
    monkeypatch.setattr("analyzer.target.leases._pid_running", lambda pid: False)
    run_sweep(
        scenario,
        target=server,
        load=VirtualLoad(server, scenario),
        run_dir=run_dir,
        resume=True,
        clock=server.clock,
    )
    summary = load_summary(run_dir)
    assert summary["trials"]["complete"] == 2 and summary["trials"]["interrupted"] == 1
    left = summary["left_on_server"]
    assert left["config"] == "original" and left["models"] == list(STAGES)
    assert "composing models' (pre, infer, post) original config" in left["detail"]
    for stage in STAGES:
        assert server.config_of(stage) == before[stage], stage


@pytest.mark.usefixtures("spawns")
@pytest.mark.slow
@pytest.mark.parametrize(
    ("case", "needle"),
    [
        ("decoupled", "step 2 of ensemble 'pipe' calls 'talk', a decoupled model"),
        (
            "missing",
            "step 2 of ensemble 'pipe' calls model 'nosuch', which is not in the repository",
        ),
        ("stateful", "step 2 of ensemble 'pipe' calls 'state', a sequence-batched"),
    ],
)
def test_a_pipeline_that_cannot_be_tuned_is_refused_before_anything_starts(
    tmp_path: Path, case: str, needle: str
) -> None:
    repo = make_repo(tmp_path)
    step = {"decoupled": "talk", "missing": "nosuch", "stateful": "state"}[case]
    if case == "decoupled":
        write_sim_model(repo, "talk", 1.0, max_batch_size=16)
        text = (repo / "talk" / "config.pbtxt").read_text()
        (repo / "talk" / "config.pbtxt").write_text(
            text + "model_transaction_policy { decoupled: true }\n"
        )
    if case == "stateful":
        write_sim_model(repo, "state", 1.0, max_batch_size=16)
        text = (repo / "state" / "config.pbtxt").read_text()
        (repo / "state" / "config.pbtxt").write_text(text + "sequence_batching { }\n")
    write_model(repo, "pipe", _ensemble(("pre", step, "post")))
    run_dir = tmp_path / "run"
    done = subprocess.run(
        [*command(tmp_path, run_dir), "--model-repository", str(repo), "--device", "sim"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-2000:]
    said = " ".join((done.stdout + done.stderr).split())
    assert needle in said and "--composing-models" in said, said
    assert not run_dir.exists(), "refused before a server started or a run was written"
