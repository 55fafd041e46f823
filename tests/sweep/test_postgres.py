"""Two workers share one study in a real PostgreSQL (started by the test, torn down after).

Each worker is its own process with its own target (a fake one here: the point is the shared
Optuna storage, not the server) and its own run directory, as on two machines.
"""

from __future__ import annotations

import multiprocessing
import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.support.servers import wait_until

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

PG_BIN = Path("/usr/lib/postgresql")


def _pg_bin() -> Path | None:
    for name in ("initdb", "pg_ctl"):
        if shutil.which(name) is None:
            break
    else:
        return Path(shutil.which("initdb") or "").parent
    versions = sorted(PG_BIN.glob("*/bin/initdb")) if PG_BIN.is_dir() else []
    return versions[-1].parent if versions else None


def _as_postgres(cmd: list[str]) -> list[str]:
    if os.geteuid() != 0:
        return cmd
    runner = shutil.which("runuser")
    if runner is None:
        pytest.skip("running as root without runuser: cannot start PostgreSQL as a non-root user")
    return [runner, "-u", "postgres", "--", *cmd]


@pytest.fixture(scope="module")
def postgres_url(spawns: None) -> Iterator[str]:
    """A throwaway PostgreSQL cluster on a free loopback port, trust auth."""
    bindir = _pg_bin()
    if bindir is None:
        pytest.skip("PostgreSQL binaries (initdb, pg_ctl) not found; install Debian's postgresql")
    root = Path(tempfile.mkdtemp(prefix="perfsweep-pg-"))
    if os.geteuid() == 0:
        shutil.chown(root, "postgres", "postgres")
    data = root / "data"
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    subprocess.run(
        _as_postgres([str(bindir / "initdb"), "-D", str(data), "-A", "trust", "-U", "postgres"]),
        check=True,
        capture_output=True,
        timeout=120,
    )
    options = f"-c listen_addresses=127.0.0.1 -p {port} -k {root}"
    subprocess.run(
        _as_postgres(
            [
                str(bindir / "pg_ctl"),
                "-D",
                str(data),
                "-o",
                options,
                "-w",
                "-t",
                "60",
                "-l",
                str(root / "log"),
                "start",
            ]
        ),
        check=True,
        capture_output=True,
        timeout=90,
    )
    try:
        yield f"postgresql://postgres@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run(
            _as_postgres([str(bindir / "pg_ctl"), "-D", str(data), "-m", "immediate", "stop"]),
            capture_output=True,
            timeout=60,
        )
        shutil.rmtree(root, ignore_errors=True)


def _worker(url: str, study: str, out: str, seed: int, trials: int, mine: Any, other: Any) -> None:
    from analyzer.config.scenario import load_scenario
    from analyzer.measure.capacity import CapacityResult
    from analyzer.measure.specs import CapacitySpec
    from analyzer.sweep.loop import run_sweep
    from tests.sweep.planted import FakeLoadGenerator, FakeTarget

    @dataclass
    class Meeting(FakeLoadGenerator):
        """The first trial's capacity search (after the baseline's) waits until the other
        worker has begun its own: both then hold a trial of the study, however long a spawned
        worker takes to import on a busy machine (the first alone finished all ten before)."""

        searches: int = 0

        def find_capacity(self, spec: CapacitySpec) -> CapacityResult:
            self.searches += 1
            if self.searches == 2:
                mine.set()
                if not other.wait(120):
                    raise RuntimeError("the other worker never began a trial")
            return super().find_capacity(spec)

    scenario = load_scenario(
        None,
        {
            "goals.p99_ms": 15.0,
            "space.max_batch_size": [1, 32],
            "space.instance_count": [1, 3],
            "traffic.min_rate_rps": 5.0,
            "traffic.max_rate_rps": 5000.0,
            "budget.trials": trials,
            "budget.patience": 100,
            "budget.validate_top": 0,
            "run.storage": url,
            "run.study_name": study,
            "run.seed": seed,
            "run.output_dir": out,
        },
        env={},
    )
    target = FakeTarget()
    run_sweep(scenario, target=target, load=Meeting(target, delay_s=0.3, seed=seed))


def test_two_workers_share_one_study_without_duplicates_or_losses(
    postgres_url: str, tmp_path: Path
) -> None:
    import optuna

    trials = 10
    ctx = multiprocessing.get_context("spawn")
    began = [ctx.Event(), ctx.Event()]
    workers = [
        ctx.Process(
            target=_worker,
            args=(
                postgres_url,
                "shared",
                str(tmp_path / f"w{i}"),
                i,
                trials,
                began[i],
                began[1 - i],
            ),
        )
        for i in range(2)
    ]
    storage = postgres_url.replace("postgresql://", "postgresql+psycopg2://")

    def seeded() -> bool:
        summaries = optuna.get_all_study_summaries(storage=storage)
        return any(s.study_name == "shared" and s.n_trials > 0 for s in summaries)

    workers[0].start()
    wait_until(seeded, 120, "the first worker to create the study and enqueue its seeds")
    workers[1].start()
    for w in workers:
        w.join(timeout=240)
        assert w.exitcode == 0

    study = optuna.load_study(
        study_name="shared", storage=postgres_url.replace("postgresql://", "postgresql+psycopg2://")
    )
    finished = [t for t in study.trials if t.state.is_finished()]
    numbers_in_study = sorted(t.number for t in finished)
    per_worker = [
        sorted(int(p.parent.name) for p in (tmp_path / f"w{i}").glob("*/trials/*/measurement.json"))
        for i in range(2)
    ]
    assert all(per_worker), "both workers ran trials"
    assert not set(per_worker[0]) & set(per_worker[1]), "no trial ran on both workers"
    assert sorted(per_worker[0] + per_worker[1]) == numbers_in_study, (
        "every study trial has exactly one record"
    )
    # Each worker checks the shared count before asking, so at most one extra trial per extra worker.
    assert trials <= len(numbers_in_study) <= trials + 1
    assert not [t for t in study.trials if t.state.name == "RUNNING"]
