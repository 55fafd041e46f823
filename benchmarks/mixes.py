"""Models served together on one serialised device, and the comparison of the mix tuned as one
against each model tuned alone, on the reference server or a real Triton (the mix benchmarks:
``mix_solo_vs_joint.py``, ``mix_simulator.py``, ``mix_vs_model_analyzer.py``).

``rank`` is heavy (a large fixed cost per execution on the device, a little per item, host work
before and after it) with a loose goal; ``tag`` is cheap with a tight goal; ``embed`` sits
between. Every instance of every model holds the same device for its device part (the reference
server's simulated device on ``--device sim``; on Triton, an exclusive lock on one file that
every Python-backend instance takes), so one model's executions are every other model's wait.
Tuned alone, ``rank`` has the device to itself: a second instance overlaps its host work and its
largest batches serve the most. Served beside the others at a moderate rate, two instances split
its batches and spend the device on fixed costs, and ``tag`` waits past its goal.
"""

from __future__ import annotations

import abc
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from google.protobuf import text_format

from analyzer.target.triton import managed_triton
from tests.support.real_triton import (
    TensorSpec,
    TritonInstall,
    locked_device_source,
    sleep_model_config,
)
from tests.support.servers import ReferenceProcess, write_model, write_sim_model
from tests.support.sweeps import assemble, load, recommended, sweep


@dataclass(frozen=True)
class MixModel:
    """One model of the mix: its device time (``a_ms + b_ms`` per item), its host time before
    and again after the device part (``host_ms``: what a second instance overlaps), its input
    width, its relative share of the requests and its own p99 goal."""

    a_ms: float
    b_ms: float
    host_ms: float
    width: int
    share: float
    p99_ms: float


Models = Mapping[str, MixModel]

#: Three models on the reference server's simulated device, in the order the mix names them.
THREE = {
    "rank": MixModel(a_ms=16.0, b_ms=1.0, host_ms=8.0, width=64, share=3, p99_ms=400.0),
    "tag": MixModel(a_ms=2.0, b_ms=0.2, host_ms=0.0, width=16, share=4, p99_ms=40.0),
    "embed": MixModel(a_ms=6.0, b_ms=0.6, host_ms=0.0, width=32, share=2, p99_ms=120.0),
}

#: Two models of Python-backend on a real Triton, sharing one file lock as their device.
TWO = {name: THREE[name] for name in ("rank", "tag")}

SCENARIO = """
objective = "throughput"
[traffic]
min_rate_rps = 5.0
start_rps = 40.0
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


def mix_flag(models: Models) -> str:
    """``--mix`` of ``models``: each model's share and its own goal."""
    return ",".join(f"{name}={m.share:g}@{m.p99_ms:g}" for name, m in models.items())


def run_p99_ms(models: Models) -> float:
    """The loosest goal: the run's p99 (each model is held to its own)."""
    return max(m.p99_ms for m in models.values())


class Server(abc.ABC):
    """Where the mix is served: the models' repository, ``perfsweep run``'s server flags, and a
    fresh server on a repository tree for one measurement."""

    @abc.abstractmethod
    def write(self, repo: Path, models: Models) -> Path:
        """``repo`` with ``models`` as a user starts from: each request executed alone (no
        dynamic batching), one instance."""

    @abc.abstractmethod
    def flags(self) -> tuple[str, ...]:
        """``perfsweep run``'s flags for a managed server of this kind."""

    @abc.abstractmethod
    @contextmanager
    def serving(self, tree: Path, models: Models, work: Path) -> Iterator[str]:
        """A fresh server on ``tree`` with every model loaded: its HTTP URL."""


class SimServer(Server):
    """The reference server, ``--device sim``: every ``KIND_CPU`` instance of every simulated
    model shares one simulated device."""

    def write(self, repo: Path, models: Models) -> Path:
        for name, m in models.items():
            write_sim_model(
                repo, name, m.a_ms, m.b_ms, max_batch_size=32, host_ms=m.host_ms, width=m.width
            )
        return repo

    def flags(self) -> tuple[str, ...]:
        return ("--device", "sim")

    @contextmanager
    def serving(self, tree: Path, models: Models, work: Path) -> Iterator[str]:
        server = ReferenceProcess(
            work, repository=tree, args=tuple(f"--model={name}" for name in models), device="sim"
        )
        server.start()
        try:
            yield server.http_url
        finally:
            server.stop()


@dataclass
class TritonServer(Server):
    """A real Triton of ``install``: each model a Python-backend model that sleeps its host
    time, then its device time under an exclusive lock on ``repo/../device.lock`` (one file for
    every instance of every model: one device)."""

    install: TritonInstall

    def write(self, repo: Path, models: Models) -> Path:
        lock = repo.parent / "device.lock"
        for name, m in models.items():
            config = sleep_model_config(
                name, max_batch_size=32, inputs=(TensorSpec(dims=(m.width,)),)
            )
            # The source sleeps its host time once, before the device part: both halves.
            source = locked_device_source(lock, 2 * m.host_ms, m.a_ms, m.b_ms)
            write_model(repo, name, text_format.MessageToString(config), model_source=source)
        return repo

    def flags(self) -> tuple[str, ...]:
        return ("--server", "triton", "--triton-server-path", str(self.install.server_bin))

    @contextmanager
    def serving(self, tree: Path, models: Models, work: Path) -> Iterator[str]:
        first, *others = models
        triton = managed_triton(
            first, tree, work, self.install.server_bin, 180.0, also_load=tuple(others)
        )
        triton.start()
        try:
            yield triton.url
        finally:
            triton.stop()


def scenario(models: Models, trials: int, max_rate_rps: float) -> str:
    return SCENARIO.format(trials=trials, max_rate_rps=max_rate_rps, p99_ms=run_p99_ms(models))


def solo_tree(
    server: Server, models: Models, repo: Path, work: Path, trials: int, max_rate_rps: float
) -> tuple[dict[str, Path], Path]:
    """Each model tuned alone (the device to itself, its own goal): each model's run directory,
    and the answers assembled into one repository tree."""
    runs = {}
    for name, m in models.items():
        runs[name], _ = sweep(
            repo,
            work / f"alone-{name}",
            scenario(models, trials, max_rate_rps),
            *server.flags(),
            *("--model", name, "--p99-ms", f"{m.p99_ms:g}"),
        )
    tree = assemble(
        repo, {name: recommended(run) for name, run in runs.items()}, work / "tree-solo"
    )
    return runs, tree


def joint_tree(
    server: Server, models: Models, repo: Path, work: Path, trials: int, max_rate_rps: float
) -> tuple[Path, Path]:
    """The models tuned together (``--mix``): its run directory and its repository tree."""
    text = scenario(models, trials, max_rate_rps)
    run_dir, _ = sweep(repo, work / "joint", text, *server.flags(), "--mix", mix_flag(models))
    tree = assemble(
        repo, {name: recommended(run_dir, name) for name in models}, work / "tree-joint"
    )
    return run_dir, tree


@dataclass(frozen=True)
class MixLevel:
    """One ``perfsweep load`` level of the mix: each model's p99 and errors."""

    rate_rps: float
    p99_ms: dict[str, float]
    errors: dict[str, int]

    def misses(self, models: Models) -> list[str]:
        """The models over their own goal (or with errors)."""
        return [
            name
            for name, m in models.items()
            if self.p99_ms[name] > m.p99_ms or self.errors[name] > 0
        ]


def _load(server: Server, models: Models, tree: Path, work: Path, *flags: str) -> dict[str, Any]:
    """A fresh ``server`` on ``tree``, and one ``perfsweep load`` of the mix with ``flags``:
    its output document."""
    work.mkdir(parents=True, exist_ok=True)
    with server.serving(tree, models, work) as url:
        return load(url, work / "load.json", "--mix", mix_flag(models), *flags)


def load_mix(server: Server, models: Models, tree: Path, work: Path, rate_rps: float) -> MixLevel:
    """A fresh ``server`` on ``tree``, and ``perfsweep load`` of the mix at ``rate_rps``."""
    doc = _load(
        server,
        models,
        tree,
        work,
        *("--rate-rps", f"{rate_rps:g}", "--warmup-s", "1", "--window-s", "3"),
        *("--max-windows", "3"),
    )
    classes = {c["model"]: c for c in doc["results"][0]["classes"]}
    return MixLevel(
        rate_rps,
        {name: float(c["p99_ms"]) for name, c in classes.items()},
        {name: int(c["error_count"]) for name, c in classes.items()},
    )


def mix_capacity(
    server: Server, models: Models, tree: Path, work: Path, *, max_rps: float, resolution: float
) -> float:
    """A fresh ``server`` on ``tree``, and the mix's capacity (``perfsweep load
    --find-capacity``: the largest rate of the whole mix at which every model meets its own
    goal; 0 when none does)."""
    doc = _load(
        server,
        models,
        tree,
        work,
        *("--find-capacity", "--start-rps", "20", "--max-rps", f"{max_rps:g}"),
        *("--resolution", f"{resolution:g}"),
    )
    return float(doc.get("capacity_rps") or 0.0)


__all__ = [
    "THREE",
    "TWO",
    "MixLevel",
    "MixModel",
    "Models",
    "Server",
    "SimServer",
    "TritonServer",
    "joint_tree",
    "load_mix",
    "mix_capacity",
    "mix_flag",
    "scenario",
    "solo_tree",
]
