"""A planted optimum: a simulated model whose capacity per config is a formula.

``PlantedModel.p99_ms(knobs, rate)`` is a small queueing approximation of a dynamic batcher in
front of one accelerator shared by N instances (device work serialised, host work overlapped):

* a batch of ``b`` takes ``device_ms(b) = base + per_item * b + superlinear * b**2`` on the device
  (the quadratic term is the cache/memory pressure that makes very large batches inefficient),
  stretched by ``contention`` per extra instance, plus host work per batch and per item;
* the batch size a config forms at ``rate`` is a fixed point: requests that arrive while an
  instance is busy (and during the queue delay) join the next batch, up to ``max_batch_size``;
  a preferred size dispatches as soon as it is reached, so it cuts the delay short;
* p99 = batch-fill wait + service time + an M/M/1-style queueing tail that explodes as the
  utilisation approaches 1.

``capacity_rps`` runs the same bracketing/bisection
(:class:`analyzer.measure.capacity.CapacitySearch`) the real engine runs, on this noiseless formula,
so the brute-force optimum and the fake's answers come from one function. ``FakeTarget`` +
``FakeLoadGenerator`` put the formula behind the real seams (``Target`` and ``LoadGenerator``) so
the whole sweep runs in milliseconds.

A capacity search whose step is sequential (``LoadSpec.sequential``) gets sequential steps from
the fake too: the share of requests over the goal follows from the planted p99 (an exponential
tail beyond it, :func:`share_over`), each window's count over the goal is a seeded binomial draw,
and the real test (:func:`analyzer.measure.stepping.decide_windows`, independent requests) decides
PASS, FAIL or BOUNDARY; the step's ``request_count`` is the requests the test needed.
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
from google.protobuf import json_format
from tritonclient.grpc import model_config_pb2 as mc

from analyzer.config.access import PLAIN, ServerAccess
from analyzer.config.knobs import Knobs
from analyzer.errors import TargetError
from analyzer.measure.capacity import CapacityResult, CapacitySearch
from analyzer.measure.goals import meets_goals
from analyzer.measure.measurement import Measurement
from analyzer.measure.specs import CapacitySpec, LoadMode, LoadSpec
from analyzer.measure.stepping import StepRecord, StepTest, decide_windows
from analyzer.predict.profile import BatchTiming, Profile
from analyzer.predict.sim_records import SimConfig
from analyzer.predict.simulator import simulate
from analyzer.search.space import SearchSpace

#: Decay of the planted latency tail beyond p99: a goal at twice the p99 is its p99.99.
TAIL_DECAY = math.log(100.0)


def share_over(p99_ms: float, goal_ms: float) -> float:
    """Share of requests over ``goal_ms`` when the p99 is ``p99_ms`` and the tail beyond it is
    exponential in ``goal / p99`` (0.01 at the p99, 0.0001 at twice it), at most 1."""
    if not math.isfinite(p99_ms):
        return 1.0
    return min(1.0, 0.01 * math.exp(-TAIL_DECAY * (goal_ms / p99_ms - 1.0)))


def planted_step(
    test: StepTest, p99_ms: float, rate: float, rng: np.random.Generator
) -> StepRecord:
    """The sequential test on binomial windows (half a second of requests each) of ``rate``."""
    share = share_over(p99_ms, test.goal_ms)
    window = max(50, round(rate / 2))
    over: list[int] = []
    ns: list[int] = []
    while True:
        ns.append(window)
        over.append(int(rng.binomial(window, share)))
        record = decide_windows(test, over, ns, tau=1.0)
        if record.verdict.final:
            return record


@dataclass(frozen=True)
class PlantedModel:
    """Latency model of one accelerator; all times in milliseconds."""

    base_ms: float = 2.0
    per_item_ms: float = 0.35
    superlinear_ms: float = 0.004
    host_batch_ms: float = 0.8
    host_item_ms: float = 0.12
    contention: float = 0.06
    max_rps: float = 20_000.0

    def device_ms(self, batch: float, instances: int) -> float:
        """Device time of one batch, stretched by contention from other instances."""
        own = self.base_ms + self.per_item_ms * batch + self.superlinear_ms * batch * batch
        return own * (1 + self.contention * (instances - 1))

    def cycle_ms(self, batch: float, instances: int) -> float:
        """Time one instance spends on one batch (host work + device work)."""
        return self.host_batch_ms + self.host_item_ms * batch + self.device_ms(batch, instances)

    def ceiling_rps(self, batch: float, instances: int) -> float:
        """Highest rate the config can serve at this batch size (device or instances bound)."""
        per_instance = batch / self.cycle_ms(batch, instances)
        device = batch / self.device_ms(batch, instances)
        return 1000.0 * min(instances * per_instance, device)

    def batch_size(self, knobs: Knobs, rate: float) -> float:
        """Average batch formed at ``rate``.

        Two effects: requests arriving during one cycle (plus the queue delay) join the next
        batch (a fixed point), and under load the backlog grows until batches are big enough
        for the instances to keep up (the batcher self-regulates up to ``max_batch_size``).
        """
        if not knobs.dynamic_batching or knobs.max_batch_size == 1:
            return 1.0
        k = knobs.instance_count
        per_ms = rate / 1000.0
        delay_ms = knobs.max_queue_delay_us / 1000.0
        batch = 1.0
        for _ in range(50):
            window = delay_ms + self.cycle_ms(batch, k) / k
            batch = min(float(knobs.max_batch_size), max(1.0, per_ms * window))
        if knobs.preferred_batch_size and batch > knobs.preferred_batch_size[-1]:
            # Dispatching as soon as the smallest preferred size is reached caps the batch there.
            batch = float(knobs.preferred_batch_size[-1])
        for size in range(1, knobs.max_batch_size + 1):
            if size >= batch and self.ceiling_rps(size, k) >= rate / 0.8:
                return float(size)
        return float(knobs.max_batch_size) if batch < knobs.max_batch_size else batch

    def p99_ms(self, knobs: Knobs, rate: float) -> float:
        """Approximate client p99 latency at ``rate`` requests/s (inf when overloaded)."""
        batch = self.batch_size(knobs, rate)
        k = knobs.instance_count
        rho = rate / self.ceiling_rps(batch, k)
        if rho >= 1:
            return math.inf
        per_ms = rate / 1000.0
        fill = 0.0
        if knobs.dynamic_batching and knobs.max_queue_delay_us > 0 and batch > 1:
            target = (
                knobs.preferred_batch_size[-1]
                if knobs.preferred_batch_size
                else knobs.max_batch_size
            )
            fill = min(knobs.max_queue_delay_us / 1000.0, max(target - 1, 0) / per_ms)
        service = self.cycle_ms(batch, k)
        queue = 4.6 * rho / (1 - rho) * service / k
        return fill + service + queue

    def capacity_rps(
        self, knobs: Knobs, p99_goal_ms: float, spec: CapacitySpec | None = None
    ) -> float:
        """Capacity at the goal, found by the engine's own bracketing/bisection."""
        spec = spec or planted_capacity_spec(p99_goal_ms)
        search = CapacitySearch(spec)
        while (rate := search.next_rate()) is not None:
            search.record(rate, self.p99_ms(knobs, rate) <= p99_goal_ms)
        return search.capacity_rps


def planted_capacity_spec(p99_goal_ms: float) -> CapacitySpec:
    """The capacity-search settings the planted tests use."""
    from analyzer.measure.specs import Goals

    return CapacitySpec(
        goals=Goals(p99_ms=p99_goal_ms, max_error_rate=0.01), start_rps=10.0, max_rps=20_000.0
    )


def brute_force(
    model: PlantedModel, space: SearchSpace, p99_goal_ms: float
) -> tuple[Knobs, float, dict[Knobs, float]]:
    """Every grid point's capacity; returns (best knobs, best capacity, all capacities)."""
    table = {}
    for params in space.points():
        knobs = space.decode(params)
        table[knobs] = model.capacity_rps(knobs, p99_goal_ms)
    best = max(table, key=lambda k: table[k])
    return best, table[best], table


def knobs_from_config(config: mc.ModelConfig) -> Knobs:
    """Read the knobs back out of a ModelConfig (what a server would apply)."""
    batching = config.HasField("dynamic_batching")
    count = config.instance_group[0].count if config.instance_group else 1
    return Knobs(
        max_batch_size=config.max_batch_size,
        max_queue_delay_us=config.dynamic_batching.max_queue_delay_microseconds if batching else 0,
        preferred_batch_size=tuple(config.dynamic_batching.preferred_batch_size)
        if batching
        else (),
        instance_count=count,
        dynamic_batching=batching,
    )


@dataclass
class FakeTarget:
    """A Target whose 'server' is a ModelConfig in memory.

    ``fail_loads`` makes the n-th config load (1-based) raise, to test failed trials.
    """

    model: str = "planted"
    base_max_batch_size: int = 8
    fail_loads: set[int] = field(default_factory=set)
    url: str = "http://127.0.0.1:1"
    device: str = "sim"
    access: ServerAccess = PLAIN
    #: A server the sweep does not own (``--url``): it must be left on a known config.
    shared: bool = False
    current: mc.ModelConfig = field(default_factory=mc.ModelConfig)
    loads: list[mc.ModelConfig] = field(default_factory=list)
    started: bool = False

    def __post_init__(self) -> None:
        self.current = mc.ModelConfig(
            name=self.model, backend="simulated", max_batch_size=self.base_max_batch_size
        )
        self.current.instance_group.add(count=1, kind=mc.ModelInstanceGroup.KIND_GPU)

    def start(self) -> None:
        self.started = True

    def stop(self) -> None:
        self.started = False

    def model_config(self) -> mc.ModelConfig:
        copy = mc.ModelConfig()
        copy.CopyFrom(self.current)
        return copy

    def config_of(self, name: str) -> mc.ModelConfig | None:
        return self.model_config() if name == self.model else None

    def load_config(self, config: mc.ModelConfig, *, wait_for_model: bool = True) -> None:
        # Round-trip through the JSON override, as the HTTP load API would.
        text = json_format.MessageToJson(config, preserving_proto_field_name=True)
        parsed = json_format.Parse(text, mc.ModelConfig())
        self.loads.append(parsed)
        if len(self.loads) in self.fail_loads:
            raise TargetError(f"load of {self.model} failed: planted failure #{len(self.loads)}")
        for size in parsed.dynamic_batching.preferred_batch_size:
            assert size <= parsed.max_batch_size, "an invalid config reached the server"
        self.current = parsed

    def ensure_alive(self) -> None:
        return None

    def describe(self) -> dict[str, Any]:
        return {"kind": "fake", "url": self.url, "device": self.device}


@dataclass
class FakeLoadGenerator:
    """A LoadGenerator answering from the planted formula for the target's current config.

    ``noise`` is the relative jitter on measured p99 (seeded), so the sweep faces noisy trials.
    """

    target: FakeTarget
    model: PlantedModel = field(default_factory=PlantedModel)
    noise: float = 0.03
    seed: int = 0
    calls: int = 0
    #: Wall time each capacity search takes (lets concurrent workers overlap in tests).
    delay_s: float = 0.0
    #: Every LoadSpec passed to ``measure`` (warm-ups included), in order.
    measured: list[LoadSpec] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)
        # Apart from the p99 noise, so sequential and fixed-window sweeps see the same p99s.
        self._step_rng = np.random.default_rng(self.seed)

    def _measurement(self, rate: float, knobs: Knobs, p99: float) -> Measurement:
        finite = math.isfinite(p99)
        p99_seen = p99 * (1 + self._rng.uniform(-self.noise, self.noise)) if finite else 60_000.0
        throughput = (
            rate
            if finite
            else self.model.ceiling_rps(self.model.batch_size(knobs, rate), knobs.instance_count)
        )
        return Measurement(
            mode=LoadMode.REQUEST_RATE,
            target=rate,
            throughput_rps=throughput,
            p50_ms=p99_seen / 2,
            p90_ms=p99_seen * 0.8,
            p95_ms=p99_seen * 0.9,
            p99_ms=p99_seen,
            request_count=max(1, int(rate * 3)),
            error_count=0,
            stable=True,
            valid=True,
            send_lag_p99_ms=0.0,
            server=None,
            offered_rps=rate,
            duration_s=3.0,
        )

    def measure(self, spec: LoadSpec) -> Measurement:
        self.calls += 1
        self.measured.append(spec)
        knobs = knobs_from_config(self.target.current)
        m = self._measurement(spec.target, knobs, self.model.p99_ms(knobs, spec.target))
        if spec.sequential is not None:  # one sequential step (the validation check)
            record = planted_step(spec.sequential, m.p99_ms, spec.target, self._step_rng)
            m = replace(m, step=record, request_count=record.n, duration_s=record.n / spec.target)
        return m

    def find_capacity(self, spec: CapacitySpec) -> CapacityResult:
        self.calls += 1
        if self.delay_s:
            time.sleep(self.delay_s)
        knobs = knobs_from_config(self.target.current)
        search = CapacitySearch(spec)
        points = []
        best = None
        test = spec.step.sequential
        if test is not None:
            test = replace(test, goal_ms=spec.goals.p99_ms)
        while (rate := search.next_rate()) is not None:
            m = self._measurement(rate, knobs, self.model.p99_ms(knobs, rate))
            if test is not None:
                record = planted_step(test, m.p99_ms, rate, self._step_rng)
                m = replace(m, step=record, request_count=record.n, duration_s=record.n / rate)
            ok, _ = meets_goals(m, spec.goals)
            points.append(m)
            if ok and (best is None or rate > best.target):
                best = m
            boundary = ok and m.step is not None and m.step.verdict.value == "boundary"
            search.record(rate, ok, boundary=boundary)
        return CapacityResult(
            goals=spec.goals,
            capacity_rps=search.capacity_rps,
            points=tuple(points),
            best=best,
            bracketed=search.bracketed,
            at_boundary=search.at_boundary,
        )


@dataclass(frozen=True)
class SimulatedDevice(PlantedModel):
    """A planted device whose latency *is* the simulator's (``analyzer.predict.simulator``) on
    a planted profile, so ``--search predict`` faces a device on which its prediction is right.

    ``scale`` stretches every execution (a device slower than its profile: the prediction is
    wrong by that factor).
    """

    profile: Profile | None = None
    scale: float = 1.0
    requests: int = 3000

    def _sim(self, knobs: Knobs) -> tuple[Profile, SimConfig]:
        assert self.profile is not None
        profile = self.profile
        if self.scale != 1.0:
            profile = replace(
                profile,
                timings=tuple(
                    replace(
                        t,
                        input_ms=t.input_ms * self.scale,
                        infer_ms=t.infer_ms * self.scale,
                        output_ms=t.output_ms * self.scale,
                    )
                    for t in profile.timings
                ),
            )
        return profile, SimConfig.from_knobs(knobs)

    def p99_ms(self, knobs: Knobs, rate: float) -> float:
        profile, config = self._sim(knobs)
        if rate >= profile.peak_rps(config.largest_batch, config.instance_count):
            return math.inf
        p = simulate(profile, config, rate, requests=self.requests, seed=0)
        return math.inf if p.saturated else p.p99_ms

    def batch_size(self, knobs: Knobs, rate: float) -> float:
        return float(SimConfig.from_knobs(knobs).largest_batch)

    def ceiling_rps(self, batch: float, instances: int) -> float:
        assert self.profile is not None
        return self.profile.peak_rps(max(1, int(batch)), instances) / self.scale


def planted_profile(max_batch_size: int = 16) -> Profile:
    """A GPU-like profile: 2 ms + 0.5 ms per item on the device, a little host work."""
    return Profile(
        model="planted",
        provenance="planted: 2 ms + 0.5 ms/item on the device, 0.1 ms host work each side",
        source="toml",
        timings=tuple(
            BatchTiming(b, 0.1, 2.0 + 0.5 * b, 0.1) for b in range(1, max_batch_size + 1)
        ),
    )
