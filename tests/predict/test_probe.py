"""The profile phase against the reference server on the simulated device.

The server is its own process (``python -m reference_server --device sim``, started with
:class:`tests.support.servers.ReferenceProcess`) serving a 16-float model on the simulated
backend with the bundled ``resnet50_sim`` profile (device table 4-32 ms, host phases, jitter
3 %). :func:`analyzer.predict.probe.probe` drives it through a :class:`RemoteTarget`.

1. The probed per-batch-size times match the profile's planted ones: ``compute_infer`` within
   [0.95 x planted - 0.05 ms, 1.1 x planted + 0.6 ms] (a sleep never ends early but overshoots by
   what the OS scheduler adds, up to ~0.6 ms on this busy 2-core machine; 3 % jitter over six
   executions), ``compute_input`` a little wider (request gathering, lock hand-over); two instances on one device interfere as the
   serialised device implies (ratio ~1.4 at batch 8).
2. The simulator on the *probed* profile against the same server: the batch-size histogram of
   an open-loop Poisson run (two instances, preferred sizes, a queue delay) within the same
   tolerance as ``benchmarks/simulator_vs_server.py`` (total-variation distance <= 0.15, mean
   batch within 15 %).
3. The probe's premise on a real Triton (marked ``triton``): the same configs form exactly one
   batch of each size per burst there too (Python-backend sleep model).
"""

from __future__ import annotations

import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from tritonclient.grpc import model_config_pb2 as mc

from analyzer.errors import TargetError
from analyzer.predict import ProfileError
from analyzer.predict.probe import _Sender, probe
from analyzer.predict.probe_plan import ProbePlan, geometric_sizes, probe_config
from analyzer.predict.sim_records import SimConfig
from analyzer.predict.simulator import simulate
from analyzer.predict.sources import from_toml
from analyzer.target.remote import RemoteTarget
from analyzer.target.transport import MockTransport, Request, Response
from tests.support.batch_histograms import batch_counts, mean_batch, shares, tv_distance
from tests.support.real_triton import (
    RealTriton,
    dynamic_batching,
    locked_device_source,
    sleep_model_config,
)
from tests.support.servers import ReferenceProcess
from tests.support.traffic import fp32_bodies, open_loop_grpc

# Timing against tight bounds: run alone (tests/support/quiet.py).
pytestmark = pytest.mark.usefixtures("quiet_machine")

MODEL = "simres"
MAX_BATCH = 16
#: About half the device busy at the config below: a client hiccup on this shared machine
#: does not pile up into batches far above the usual sizes.
RATE_RPS = 250.0
REFUSED = ConnectionRefusedError(111, "Connection refused")


def _write_model(repo: Path) -> None:
    model_dir = repo / MODEL
    (model_dir / "1").mkdir(parents=True)
    (model_dir / "config.pbtxt").write_text(
        textwrap.dedent(
            f"""\
            name: "{MODEL}"
            backend: "simulated"
            max_batch_size: {MAX_BATCH}
            input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] }} ]
            output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] }} ]
            instance_group [ {{ kind: KIND_CPU count: 1 }} ]
            parameters {{ key: "profile" value: {{ string_value: "resnet50_sim" }} }}
            """
        )
    )


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, spawns: None) -> Iterator[ReferenceProcess]:
    workdir = tmp_path_factory.mktemp("probe")
    repo = workdir / "repo"
    _write_model(repo)
    proc = ReferenceProcess(workdir, repository=repo, args=(f"--model={MODEL}",), device="sim")
    proc.start()
    try:
        yield proc
    finally:
        proc.stop()


@pytest.fixture(scope="module")
def written_config(server: ReferenceProcess) -> mc.ModelConfig:
    """The model's config as the repository has it (read before any probe changed it)."""
    return RemoteTarget(server.http_url, MODEL).model_config()


@pytest.fixture
def target(server: ReferenceProcess, written_config: mc.ModelConfig) -> RemoteTarget:
    """A target on the model as written: a probe leaves the model on its last probe config, so
    the written config is loaded again first."""
    remote = RemoteTarget(server.http_url, MODEL)
    remote.start()
    remote.load_config(written_config)
    return remote


def test_geometric_sizes_end_at_max_batch_size() -> None:
    assert geometric_sizes(16) == (1, 2, 4, 8, 16)
    assert geometric_sizes(12) == (1, 2, 4, 8, 12)
    assert geometric_sizes(1) == (1,)


def test_probe_config_forces_one_batch_size() -> None:
    base = mc.ModelConfig(name="m", max_batch_size=8)
    base.instance_group.add(count=3)
    base.dynamic_batching.preferred_batch_size.extend([2, 8])
    config = probe_config(base, 4, 2)
    assert list(config.dynamic_batching.preferred_batch_size) == [4]
    assert config.max_batch_size == 4  # a batch that reached 4 must not grow while it waits
    assert config.dynamic_batching.max_queue_delay_microseconds >= 1_000_000
    assert config.instance_group[0].count == 2
    assert list(base.dynamic_batching.preferred_batch_size) == [2, 8]  # base untouched
    # A group on two GPUs would run its count on each: the probe keeps one device.
    spread = mc.ModelConfig(name="m", max_batch_size=8)
    spread.instance_group.add(count=1, kind=mc.ModelInstanceGroup.KIND_GPU, gpus=[0, 1])
    assert list(probe_config(spread, 4, 2).instance_group[0].gpus) == [0]


@pytest.mark.timeout(180)
def test_probed_times_match_the_planted_profile(
    server: ReferenceProcess, target: RemoteTarget
) -> None:
    profile = probe(target, ProbePlan(bursts=6, instances=2))
    planted = from_toml("resnet50_sim", max_batch_size=MAX_BATCH)
    assert profile.source == "probe"
    assert [t.batch_size for t in profile.timings] == [1, 2, 4, 8, 16]
    for t in profile.timings:
        want = planted.timing(t.batch_size)
        # The interference probe's size (the median, 4) gets twice the bursts.
        assert t.executions == (12 if t.batch_size == 4 else 6)
        print(
            f"b={t.batch_size}: infer {t.infer_ms:.2f} (planted {want.infer_ms:.2f}), "
            f"input {t.input_ms:.2f} (planted {want.input_ms:.2f})"
        )
        assert 0.95 * want.infer_ms - 0.05 <= t.infer_ms <= 1.1 * want.infer_ms + 0.6
        # The input phase also holds the request gathering and the device lock's hand-over.
        assert 0.95 * want.input_ms - 0.05 <= t.input_ms <= 1.2 * want.input_ms + 1.0
    # Two batches of 8 at once on one device: one waits for the other's 22.5 ms device phase.
    # Planted: (27.05 + 49.55) / 2 / 27.05 = 1.42.
    assert 1.2 <= profile.interference[2] <= 1.7
    # The reference server reports host work in compute_input/output, so what the device
    # serialises is all of compute_infer: (next to) no overlap hidden in it. The overlap is a
    # difference of two means of executions, so its noise grows with their length: the bound
    # is a tenth of the device phase at the interference probe's size (4).
    assert profile.overlap_ms <= 0.1 * planted.timing(4).infer_ms, profile.provenance
    assert 0 < profile.jitter < 0.2
    assert "probed:" in profile.provenance

    # The simulator on the probed profile, against the same server at a rate and config.
    config = SimConfig(
        max_batch_size=MAX_BATCH,
        max_queue_delay_us=3000,
        preferred_batch_size=(8, 16),
        instance_count=2,
    )
    base = target.model_config()
    run = probe_config(base, 8, 2)
    run.max_batch_size = MAX_BATCH
    run.dynamic_batching.preferred_batch_size.append(16)
    run.dynamic_batching.max_queue_delay_microseconds = config.max_queue_delay_us
    target.load_config(run)
    before = batch_counts(server.model_stats(MODEL))
    sent = open_loop_grpc(server.grpc_url, MODEL, fp32_bodies(16), RATE_RPS, 4.0, seed=5)
    after = batch_counts(server.model_stats(MODEL))
    measured = {b: n - before.get(b, 0) for b, n in after.items() if n - before.get(b, 0) > 0}
    assert sum(b * n for b, n in measured.items()) == sent
    predicted = simulate(profile, config, RATE_RPS, requests=20000, seed=1).batch_sizes
    tv = tv_distance(measured, predicted)
    print(f"server {shares(measured)}\nsimulator {shares(predicted)}\nTV distance {tv:.3f}")
    assert tv <= 0.15
    assert mean_batch(measured) == pytest.approx(mean_batch(predicted), rel=0.15)


@pytest.mark.timeout(60)
def test_a_budget_too_small_for_batch_1_is_refused(target: RemoteTarget) -> None:
    with pytest.raises(ProfileError, match="no execution of batch size 1"):
        probe(target, ProbePlan(max_requests=1))


@pytest.mark.timeout(60)
def test_a_cut_probe_covers_the_sizes_it_finished(target: RemoteTarget) -> None:
    # 1+2+4 sizes with a warm-up and two bursts each = 21 requests; size 8 needs 16 more.
    profile = probe(target, ProbePlan(bursts=2, instances=1, max_requests=25))
    assert profile.max_batch_size == 4
    assert "cut short" in profile.provenance


@pytest.mark.timeout(180)
def test_perfsweep_predict_probes_a_live_server_and_leaves_its_config(
    server: ReferenceProcess, target: RemoteTarget, tmp_path: Path
) -> None:
    import json
    import subprocess
    import sys

    before = server.http_status("GET", f"/v2/models/{MODEL}/config")
    saved = tmp_path / "probed.json"
    out = subprocess.run(
        [
            *(sys.executable, "-c", "from analyzer.cli import main; main()", "predict"),
            *("--url", server.http_url, "--model", MODEL, "--p99-ms", "60"),
            *("--max-queue-delay-us", "2000", "--save-profile", str(saved), "--json"),
        ],
        capture_output=True,
        text=True,
        timeout=150,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["profile"]["source"] == "probe"
    assert [t["batch_size"] for t in doc["profile"]["timings"]] == [1, 2, 4, 8, 16]
    # The server's own config (max_batch_size 16, one instance) with the flag's delay.
    assert doc["config"]["max_batch_size"] == MAX_BATCH
    assert doc["config"]["instance_count"] == 1
    assert doc["config"]["max_queue_delay_us"] == 2000
    assert "the server's current config" in doc["config_source"]
    assert doc["capacity"]["capacity_rps"] > 0
    assert json.loads(saved.read_text())["source"] == "probe"
    # Left as found: the probe configs (one batch size, a long delay) are gone.
    assert server.http_status("GET", f"/v2/models/{MODEL}/config") == before


def test_url_without_model_is_refused() -> None:
    from analyzer.errors import InputError
    from analyzer.predict.planner import PlanRequest, plan

    with pytest.raises(InputError, match="--url needs --model"):
        plan(PlanRequest(url="http://127.0.0.1:1", p99_ms=60.0))


@pytest.mark.triton
@pytest.mark.timeout(240)
def test_probe_forms_exact_batches_on_real_triton(real_triton: RealTriton) -> None:
    # Triton's Python backend sleeping 3 ms + 1 ms per item: the probe's premise (max_batch_size
    # = preferred = b with a long delay forms exactly one batch of b per burst) holds there too.
    real_triton.add_model(
        sleep_model_config(
            "probe_sleep",
            max_batch_size=8,
            execute_delay_ms=3.0,
            execute_delay_ms_per_item=1.0,
            dynamic_batching=dynamic_batching(max_queue_delay_us=100),
        )
    )
    real_triton.load_model("probe_sleep")
    target = RemoteTarget(real_triton.http_url, "probe_sleep")
    target.start()
    profile = probe(target, ProbePlan(bursts=4, instances=2))
    assert [t.batch_size for t in profile.timings] == [1, 2, 4, 8]
    for t in profile.timings:
        # Every burst was one execution of exactly its size (the median size, 4, has twice the
        # bursts: the interference probe compares with it).
        assert t.executions == (8 if t.batch_size == 4 else 4), t
        planted = 3.0 + 1.0 * t.batch_size
        # compute_infer holds the sleep and the Python stub's hand-over (about a millisecond).
        assert planted - 0.05 <= t.infer_ms <= 1.2 * planted + 2.0, t
    assert "triton" in profile.provenance
    # Two Python-backend instances run in parallel (no shared device): little interference,
    # so most of compute_infer is work that overlaps across instances.
    assert 0.7 <= profile.interference[2] <= 1.5
    assert profile.overlap_ms >= 0.5 * profile.timing(4).infer_ms, profile.provenance


@pytest.mark.triton
@pytest.mark.timeout(240)
def test_probe_finds_host_work_inside_compute_infer_on_real_triton(
    real_triton: RealTriton, tmp_path: Path
) -> None:
    # Triton reports the whole execute() as compute_infer; 3 ms of it (sleep outside the lock)
    # overlaps across instances, the 8 ms + 1 ms per item under the lock does not. Without the
    # overlap the simulator would give a second instance nothing; with all of it, 2x.
    real_triton.add_model(
        sleep_model_config("probe_locked", max_batch_size=8, dynamic_batching=dynamic_batching()),
        model_source=locked_device_source(tmp_path / "device.lock", 3.0, 8.0, 1.0),
    )
    real_triton.load_model("probe_locked")
    target = RemoteTarget(real_triton.http_url, "probe_locked")
    target.start()
    profile = probe(target, ProbePlan(instances=2))
    infer = profile.timing(4).infer_ms  # the planted 3 + 8 + 4 ms and the stub's hand-over
    assert 15.0 <= infer <= 20.0, profile.timings
    # The planted 3 ms (measured 1.5-3.6 ms on this 2-core machine, 10 probes; the stub's own
    # hand-over is partly serialised), far from none (0) and from all of it (~16 ms).
    assert 0.5 <= profile.overlap_ms <= 7.0, profile.provenance


class _FakeTarget:
    """Only what probe() reads before it sends anything."""

    model = "m"
    url = "http://127.0.0.1:1"

    def __init__(self, config: mc.ModelConfig) -> None:
        self.config = config

    def model_config(self) -> mc.ModelConfig:
        return self.config


@pytest.mark.parametrize(
    ("config", "why"),
    [
        (mc.ModelConfig(name="m", max_batch_size=0), "max_batch_size 0"),
        (
            mc.ModelConfig(
                name="m", max_batch_size=8, sequence_batching=mc.ModelSequenceBatching()
            ),
            "sequence-batched",
        ),
        (  # the oldest strategy is tunable, but a probe cannot send its sequence ids
            mc.ModelConfig(
                name="m",
                max_batch_size=8,
                sequence_batching=mc.ModelSequenceBatching(
                    oldest=mc.ModelSequenceBatching.StrategyOldest(max_candidate_sequences=4)
                ),
            ),
            "need sequence ids",
        ),
    ],
)
def test_models_the_probe_cannot_batch_are_refused(config: mc.ModelConfig, why: str) -> None:
    with pytest.raises(ProfileError, match=why):
        probe(_FakeTarget(config))  # type: ignore[arg-type]


def test_probe_inferences_go_through_the_transport() -> None:
    answers = {1: Response(200, b"{}"), 2: Response(400, b"bad input"), 3: REFUSED}

    def handle(request: Request) -> Response:
        answer = answers[int(request.headers["Inference-Header-Content-Length"])]
        if isinstance(answer, BaseException):
            raise answer
        return answer

    transport = MockTransport(handle)
    bodies = {0: (b"a", 1), 1: (b"b", 2), 2: (b"c", 3)}
    sender = _Sender("http://server.invalid:8000", "m", bodies, 7.0, transport)
    sender.infer(0)
    sent = transport.requests[0]
    assert (sent.method, sent.url, sent.content, sent.timeout_s) == (
        "POST",
        "http://server.invalid:8000/v2/models/m/infer",
        b"a",
        7.0,
    )
    assert sent.headers["Content-Type"] == "application/octet-stream"
    with pytest.raises(TargetError, match=r"probe inference refused \(400\): bad input"):
        sender.infer(1)
    with pytest.raises(TargetError, match=r"to server.invalid:8000 failed: .*refused"):
        sender.infer(2)
