"""Three models served together on one simulated device, and the comparison of the mix tuned as
one against each model tuned alone (tests and benchmarks).

``rank`` is heavy (a large fixed cost per execution, a little per item) with a loose goal;
``tag`` is cheap with a tight goal; ``embed`` sits between. Every instance of every model holds
the same simulated device (``KIND_CPU`` on ``--device sim``) for its device part, so one model's
batch is every other model's wait. Tuned alone, ``rank`` has the device to itself and its
largest batches serve the most; served beside ``tag``, a batch of that size holds the device
longer than ``tag``'s goal.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path

from tests.support.pipelines import assemble, recommended
from tests.support.servers import ReferenceProcess, write_sim_model
from tests.support.sweeps import CLI


@dataclass(frozen=True)
class SimModel:
    """One model of the mix: its simulated device time (``a_ms + b_ms`` per item), its host
    time before and again after the device part (``host_ms``: what a second instance overlaps),
    its input width, its relative share of the requests and its own p99 goal."""

    a_ms: float
    b_ms: float
    host_ms: float
    width: int
    share: float
    p99_ms: float


#: The three models, the order the mix names them.
MODELS = {
    "rank": SimModel(a_ms=16.0, b_ms=1.0, host_ms=8.0, width=64, share=3, p99_ms=400.0),
    "tag": SimModel(a_ms=2.0, b_ms=0.2, host_ms=0.0, width=16, share=4, p99_ms=40.0),
    "embed": SimModel(a_ms=6.0, b_ms=0.6, host_ms=0.0, width=32, share=2, p99_ms=120.0),
}

#: The loosest goal: the run's p99 (each model is held to its own).
RUN_P99_MS = max(m.p99_ms for m in MODELS.values())

SCENARIO = """
objective = "throughput"
[traffic]
min_rate_rps = 5.0
start_rps = {start_rps}
max_rate_rps = {max_rate_rps}
[goals]
p99_ms = {p99_ms}
max_error_rate = 0.01
[space]
max_batch_size = [4, 32]
max_queue_delay_us = [0, 4000]
delay_steps = 2
instance_count = [1, 2]
[budget]
trials = {trials}
patience = {trials}
warmup_s = 0.5
window_s = 1.0
min_requests = 100
capacity_resolution = 0.1
validate_top = 1
validate_repeats = 1
validate_window_factor = 1.0
validation = "check"
"""


def write_mix_repository(repo: Path) -> Path:
    """``repo`` with the three models as a user starts from: each request executed alone (no
    dynamic batching), one instance."""
    for name, m in MODELS.items():
        write_sim_model(
            repo, name, m.a_ms, m.b_ms, max_batch_size=32, host_ms=m.host_ms, width=m.width
        )
    return repo


def mix_flag() -> str:
    """``--mix`` of the three: each model's share and its own goal."""
    return ",".join(f"{name}={m.share:g}@{m.p99_ms:g}" for name, m in MODELS.items())


def scenario(trials: int, max_rate_rps: float, *, start_rps: float = 40.0) -> str:
    return SCENARIO.format(
        trials=trials, max_rate_rps=max_rate_rps, p99_ms=RUN_P99_MS, start_rps=start_rps
    )


def sweep(repo: Path, work: Path, text: str, *flags: str) -> Path:
    """``perfsweep run`` on a managed reference server (``--device sim``) over ``repo``: its run
    directory (RuntimeError with its output when it fails)."""
    work.mkdir(parents=True, exist_ok=True)
    (work / "scenario.toml").write_text(text)
    run_dir = work / "run"
    done = subprocess.run(
        [
            *CLI,
            *("run", "--scenario", str(work / "scenario.toml"), "--run-dir", str(run_dir)),
            *("--model-repository", str(repo), "--device", "sim", "--no-report", *flags),
        ],
        capture_output=True,
        text=True,
        timeout=900,
    )
    if done.returncode != 0:
        raise RuntimeError(
            f"perfsweep run {flags} failed:\n{done.stdout[-3000:]}{done.stderr[-3000:]}"
        )
    return run_dir


def solo_trees(repo: Path, work: Path, trials: int, max_rate_rps: float) -> Path:
    """Each model tuned alone (the device to itself, its own goal), the answers assembled into
    one repository tree."""
    configs = {}
    for name, m in MODELS.items():
        run_dir = sweep(
            repo,
            work / f"alone-{name}",
            scenario(trials, max_rate_rps),
            *("--model", name, "--p99-ms", f"{m.p99_ms:g}"),
        )
        configs[name] = recommended(run_dir)
    return assemble(repo, configs, work / "tree-solo")


def joint_tree(repo: Path, work: Path, trials: int, max_rate_rps: float) -> tuple[Path, Path]:
    """The three tuned together (``--mix``): its run directory and its repository tree."""
    run_dir = sweep(repo, work / "joint", scenario(trials, max_rate_rps), "--mix", mix_flag())
    tree = assemble(
        repo, {name: recommended(run_dir, name) for name in MODELS}, work / "tree-joint"
    )
    return run_dir, tree


@dataclass(frozen=True)
class MixLevel:
    """One ``perfsweep load`` level of the mix: each model's p99 and errors."""

    rate_rps: float
    p99_ms: dict[str, float]
    errors: dict[str, int]

    def misses(self) -> list[str]:
        """The models over their own goal (or with errors)."""
        return [
            name
            for name, m in MODELS.items()
            if self.p99_ms[name] > m.p99_ms or self.errors[name] > 0
        ]


def load_mix(tree: Path, work: Path, rate_rps: float, *, window_s: float = 3.0) -> MixLevel:
    """The reference server started on ``tree`` (all three models), and ``perfsweep load`` of
    the mix at ``rate_rps``."""
    work.mkdir(parents=True, exist_ok=True)
    server = ReferenceProcess(
        work, repository=tree, args=tuple(f"--model={name}" for name in MODELS), device="sim"
    )
    server.start()
    try:
        out = work / "load.json"
        done = subprocess.run(
            [
                *CLI,
                *("load", "--url", server.http_url, "--mix", mix_flag(), "--output", str(out)),
                *("--request-rate", f"{rate_rps:g}", "--warmup-s", "1", "--window-s"),
                *(f"{window_s:g}", "--max-windows", "3"),
            ],
            capture_output=True,
            text=True,
            timeout=300,
        )
        if done.returncode != 0:
            raise RuntimeError(
                f"perfsweep load failed:\n{done.stdout[-3000:]}{done.stderr[-3000:]}"
            )
    finally:
        server.stop()
    level = json.loads(out.read_text())["results"][0]
    classes = {c["model"]: c for c in level["classes"]}
    return MixLevel(
        rate_rps,
        {name: float(c["p99_ms"]) for name, c in classes.items()},
        {name: int(c["error_count"]) for name, c in classes.items()},
    )


__all__ = [
    "MODELS",
    "MixLevel",
    "SimModel",
    "joint_tree",
    "load_mix",
    "mix_flag",
    "scenario",
    "solo_trees",
    "write_mix_repository",
]
