"""Run directories for report tests, written by the real sweep library with the planted fake.

``ServerViewLoadGenerator`` extends the planted fake with what the Locust engine also records
(measurement windows and the server's statistics view), computed from the same planted formula,
so every section of the report has data whose values the tests can check against the files.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from analyzer.config.knobs import Knobs
from analyzer.config.scenario import Scenario, load_scenario
from analyzer.measure.measurement import Measurement, ServerView, WindowStats
from analyzer.predict import ProfileError
from analyzer.predict.profile import Profile
from analyzer.sweep.loop import run_sweep
from analyzer.sweep.state import SweepOutcome
from analyzer.target.protocol import Target
from tests.sweep.planted import FakeLoadGenerator, FakeTarget

HOSTILE = "<script>alert(1)</script>"


@dataclass
class ServerViewLoadGenerator(FakeLoadGenerator):
    """The planted fake plus three windows per level and a server view per level."""

    def _measurement(self, rate: float, knobs: Knobs, p99: float) -> Measurement:
        m = super()._measurement(rate, knobs, p99)
        model, k = self.model, knobs.instance_count
        batch = self.model.batch_size(knobs, rate)
        executions = max(1, round(m.request_count / batch))
        service_ms = model.cycle_ms(batch, k)
        lower, upper = math.floor(batch), math.ceil(batch)
        sizes = (
            {lower: executions}
            if lower == upper
            else {lower: executions // 2, upper: executions - executions // 2}
        )
        view = ServerView(
            success_count=m.request_count,
            inference_count=m.request_count,
            execution_count=executions,
            avg_batch_size=m.request_count / executions,
            queue_us=round(max(m.p50_ms - service_ms, 0.0) * 1000, 1),
            compute_input_us=round(model.host_batch_ms * 500, 1),
            compute_infer_us=round(model.device_ms(batch, k) * 1000, 1),
            compute_output_us=round(
                (model.host_batch_ms * 0.5 + model.host_item_ms * batch) * 1000, 1
            ),
            batch_sizes={s: n for s, n in sizes.items() if n},
        )
        windows = tuple(
            WindowStats(
                index=i,
                duration_s=1.0,
                request_count=m.request_count // 3,
                error_count=0,
                throughput_rps=m.throughput_rps * (1 + 0.01 * (i - 1)),
                p50_ms=m.p50_ms,
                p99_ms=m.p99_ms * (1 + 0.02 * (i - 1)),
                mean_ms=m.p50_ms,
                offered_rps=rate,
                generator_cpu_pct=20.0,
            )
            for i in range(3)
        )
        return replace(m, server=view, windows=windows)


def no_profile(target: Target, scenario: Scenario) -> Profile:
    """The profile phase of the planted target: it has no server to send batches to, so the
    sweep searches without predictions (as it does when a real server cannot be profiled)."""
    raise ProfileError("the planted target serves no requests")


def sweep_run_dir(
    root: Path,
    *,
    model: str = "planted",
    trials: int = 10,
    objective: str = "throughput",
    fail_loads: set[int] | None = None,
    seed: int = 0,
    min_throughput_rps: float = 0.0,
    load_class: type[ServerViewLoadGenerator] | None = None,
    device: str = "sim",
) -> SweepOutcome:
    """A complete run directory written by ``run_sweep`` against the planted fake."""
    overrides = {
        "model.name": model,
        "objective": objective,
        "goals.p99_ms": 25.0,
        "goals.min_throughput_rps": min_throughput_rps,
        "budget.trials": trials,
        "budget.patience": trials,
        "budget.validate_top": 2,
        "budget.validate_repeats": 2,
        "space.max_batch_size": [1, 32],
        "space.instance_count": [1, 3],
        "traffic.min_rate_rps": 10.0,
        "traffic.max_rate_rps": 5000.0,
        "run.seed": seed,
        "run.report": False,  # the tests render the report they check
    }
    if objective == "latency":
        overrides["traffic.rate_rps"] = 300.0
    scenario = load_scenario(None, overrides, env={})
    target = FakeTarget(model=model, fail_loads=fail_loads or set(), device=device)
    load = (load_class or ServerViewLoadGenerator)(target, seed=seed)
    return run_sweep(scenario, target=target, load=load, run_dir=root, profiler=no_profile)


@pytest.fixture(scope="session")
def planted_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One run directory of the planted sweep (shared: tests must not modify it)."""
    root = tmp_path_factory.mktemp("report") / "planted-run"
    sweep_run_dir(root, fail_loads={5, 6})  # load and its retry: one failed trial
    return root


@pytest.fixture(scope="session")
def hostile_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run whose model name (and so failure messages) is a script tag; some trials infeasible."""
    root = tmp_path_factory.mktemp("report") / "hostile-run"
    # A throughput floor some configs (and the baseline) miss: infeasible trials, no gain.
    sweep_run_dir(root, model=HOSTILE, trials=8, fail_loads={3, 4}, min_throughput_rps=285.0)
    return root
