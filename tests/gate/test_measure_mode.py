"""Measure-and-gate behind its seams: fake targets and generators, no sockets.

Checks the interleaving order, re-measuring invalid repeats, and that a target that dies during
the measurement is a target failure (exit 3), not a failed gate.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from typing import Any

import pytest

from analyzer.errors import TargetError
from analyzer.gate.inputs import from_measurements
from analyzer.gate.measuring import GateGenerator, measure_targets
from analyzer.gate.plan import INVALID_RETRIES, MeasurePlan
from analyzer.gate.verdict import Criteria, Outcome, evaluate
from analyzer.measure.measurement import Measurement
from analyzer.measure.specs import LoadMode, LoadSpec
from analyzer.target.remote import RemoteTarget

PLAN = MeasurePlan(LoadSpec(LoadMode.REQUEST_RATE, 20.0), repeats=3)


class FakeTarget(RemoteTarget):
    """A remote target that never touches the network; ``dies_after`` checks, it stops answering."""

    def __init__(self, name: str, dies_after: int | None = None) -> None:
        super().__init__(f"http://{name}.invalid", "m")
        self.name = name
        self.dies_after = dies_after
        self.checks = 0
        self.started = self.stopped = False

    def start(self) -> None:
        self.started = True

    def stop(self) -> None:
        self.stopped = True

    def ensure_alive(self) -> None:
        self.checks += 1
        if self.dies_after is not None and self.checks > self.dies_after:
            raise TargetError(f"the server at {self.url} stopped answering")


class FakeGenerator:
    """Planted results: p99 = ``p99_ms`` + 0.1 ms x seed; the first ``invalid`` calls are invalid."""

    def __init__(self, target: FakeTarget, log: list[str], p99_ms: float, invalid: int) -> None:
        self.target, self.log, self.p99_ms, self.invalid = target, log, p99_ms, invalid

    def measure(self, spec: LoadSpec) -> Measurement:
        self.log.append(f"{self.target.name}:{spec.seed}")
        valid = self.invalid <= 0
        self.invalid -= 1
        p99 = self.p99_ms + 0.1 * spec.seed
        return Measurement(
            mode=spec.mode, target=spec.target, throughput_rps=spec.target, p50_ms=p99 / 2,
            p90_ms=p99, p95_ms=p99, p99_ms=p99, request_count=100, error_count=0, stable=True,
            valid=valid, send_lag_p99_ms=0.0, server=None,
        )  # fmt: skip

    def drain(self, timeout_s: float) -> bool:
        return True


def factory(log: list[str], p99: dict[str, float], invalid: dict[str, int] | None = None) -> Any:
    def make(target: FakeTarget) -> AbstractContextManager[GateGenerator]:
        gen = FakeGenerator(target, log, p99[target.name], (invalid or {}).get(target.name, 0))
        return nullcontext(gen)

    return make


def test_rounds_alternate_and_seeds_are_paired() -> None:
    log: list[str] = []
    cand, base = FakeTarget("cand"), FakeTarget("base")
    c, b = measure_targets(
        PLAN, cand, base, factory(log, {"cand": 30.0, "base": 10.0}), echo=log.append
    )
    measured = [entry for entry in log if ":" in entry and "repeat" not in entry]
    assert measured == ["base:0", "cand:0", "cand:1", "base:1", "base:2", "cand:2"]
    assert [m.p99_ms for m in c] == [30.0, 30.1, 30.2]
    assert cand.started and cand.stopped and base.started and base.stopped
    # The planted 3x slowdown in p99 is a significant regression with 3 repeats a side.
    report = evaluate(
        from_measurements(c, "cand", {}),
        Criteria(max_regression=0.05),
        from_measurements(b, "base", {}),
    )
    outcomes = {r.name: r.outcome for r in report.results}
    assert outcomes["p99_ms regression <= 5%"] is Outcome.FAIL
    assert outcomes["throughput_rps regression <= 5%"] is Outcome.PASS


def test_without_a_live_baseline_only_the_candidate_is_measured() -> None:
    log: list[str] = []
    c, b = measure_targets(
        PLAN, FakeTarget("cand"), None, factory(log, {"cand": 5.0}), echo=lambda _: None
    )
    assert (len(c), b) == (3, [])
    assert log == ["cand:0", "cand:1", "cand:2"]


def test_invalid_repeats_are_measured_again_then_kept() -> None:
    log: list[str] = []
    messages: list[str] = []
    c, _ = measure_targets(
        MeasurePlan(PLAN.spec, repeats=2),
        FakeTarget("cand"),
        None,
        factory(log, {"cand": 5.0}, invalid={"cand": 1 + INVALID_RETRIES + 1}),
        echo=messages.append,
    )
    # Repeat 1: every attempt invalid, the last one is kept; repeat 2: one retry, then valid.
    assert log == ["cand:0"] * (1 + INVALID_RETRIES) + ["cand:1", "cand:1"]
    assert [m.valid for m in c] == [False, True]
    assert sum("measuring again" in m for m in messages) == INVALID_RETRIES + 1
    assert "invalid measurement" in from_measurements(c, "cand", {}).notes[0]


def test_a_target_that_dies_is_a_target_failure() -> None:
    cand = FakeTarget("cand", dies_after=1)
    with pytest.raises(TargetError) as info:
        measure_targets(PLAN, cand, None, factory([], {"cand": 5.0}), echo=lambda _: None)
    assert info.value.exit_code == 3
    assert cand.stopped  # stopped even though the measurement failed
