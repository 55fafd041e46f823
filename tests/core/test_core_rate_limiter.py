"""The rate limiter (``--rate-limit execution_count``): the pure rule, then the server.

The pure :class:`RateLimiter` is driven event by event (milliseconds, no threads); the expected
orders are the ones the real Triton 2.51 produced for the same events
(``tests/differential/test_rate_limiter_vs_triton.py`` checks them against it). The server tests
cover triton_spec checklist C: they gate executions on events, never on time, and read which
instance ran what from a wrapper around each instance's backend.
"""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from reference_server.__main__ import build_parser
from reference_server.app import ServerOptions
from reference_server.batching.rate_limiter import (
    EVERY_DEVICE,
    GLOBAL_DEVICE,
    INITIAL_EXEC_COUNT,
    InstanceLimits,
    InstanceState,
    RateLimiter,
    RateLimiterError,
    ResourceLimit,
    ResourceNeed,
    ResourcePool,
    parse_resource_limit,
)
from reference_server.core.errors import ServerError
from reference_server.core.server import InferenceServer
from tests.core.conftest import (
    Collector,
    ServerFactory,
    identity_config,
    pending,
    request,
    wait_until,
    write_model,
)

R1_GLOBAL = (ResourceNeed("R", 1, global_=True),)


def _limits(priority: int = 0, resources: tuple[ResourceNeed, ...] = R1_GLOBAL) -> InstanceLimits:
    return InstanceLimits(resources, priority)


def _names(allocations: list[tuple[object, str]]) -> str:
    return "".join(str(key) for key, _ in allocations)


# ------------------------------------------------------------------------------ the pure rule


def test_priority_two_gets_half_the_executions_in_tritons_order() -> None:
    # Models a (priority 1) and b (priority 2), one instance each, sharing global R with
    # capacity 1. One request of a runs first; then 8 of b and 8 of a wait. Real Triton 2.51
    # ran them in this order (ties go to the instance staged first).
    limiter: RateLimiter[str] = RateLimiter()
    limiter.add_instance("A", "a", _limits(1))
    limiter.add_instance("B", "b", _limits(2))
    order = _names(limiter.enqueue("A", "a0"))
    for k in range(8):
        order += _names(limiter.enqueue("B", f"b{k}"))
        order += _names(limiter.enqueue("A", f"a{k + 1}"))
    running = order[-1]
    while True:
        step = limiter.release(running)
        if not step:
            break
        order += _names(step)
        running = order[-1]
    assert order == "aabaabaabaababbbb"
    # Under saturation (the first 12 executions, both queues non-empty) a ran twice as often.
    assert (order[:12].count("a"), order[:12].count("b")) == (8, 4)
    assert limiter.exec_count("a") == INITIAL_EXEC_COUNT + 9


def test_head_of_line_blocks_an_instance_without_resources() -> None:
    # z holds R; y (priority 1) waits for R; x needs nothing but has priority 10, so it queues
    # behind y: it runs only once y was allocated and the next event came (y's release). Real
    # Triton: z, y, x one after the other.
    limiter: RateLimiter[str] = RateLimiter()
    limiter.add_instance("Z", "z", _limits(1))
    limiter.add_instance("Y", "y", _limits(1))
    limiter.add_instance("X", "x", InstanceLimits((), 10))
    assert _names(limiter.enqueue("Z", "z0")) == "z"
    assert limiter.enqueue("Y", "y0") == []
    assert limiter.enqueue("X", "x0") == []
    assert limiter.state("x") is InstanceState.STAGED
    assert _names(limiter.release("z")) == "y"  # one attempt per event: x still waits
    assert limiter.state("x") is InstanceState.STAGED
    assert _names(limiter.release("y")) == "x"


def test_instances_without_resources_run_at_once_when_nothing_blocks() -> None:
    limiter: RateLimiter[str] = RateLimiter()
    limiter.add_instance("M", ("m", 0), InstanceLimits())
    limiter.add_instance("M", ("m", 1), InstanceLimits())
    limiter.add_instance("N", "n", InstanceLimits())
    first = limiter.enqueue("M", "p0")
    second = limiter.enqueue("M", "p1")
    third = limiter.enqueue("N", "q0")
    assert [k for k, _ in first + second + third] == [("m", 0), ("m", 1), "n"]
    # Both instances of M are busy: the next payload waits for one of them.
    assert limiter.enqueue("M", "p2") == []
    assert limiter.waiting("M") == 1
    assert limiter.release(("m", 1)) == [(("m", 1), "p2")]


def test_lowest_exec_count_times_priority_is_staged_first() -> None:
    limiter: RateLimiter[str] = RateLimiter()
    limiter.add_instance("M", "slow", InstanceLimits((), 3))
    limiter.add_instance("M", "fast", InstanceLimits((), 1))
    assert limiter.enqueue("M", "p0") == [("fast", "p0")]  # 2 x 1 < 2 x 3
    for count in range(3, 6):  # fast: 3, 4, 5 executions -> scores 3, 4, 5 < 6
        limiter.release("fast")
        assert limiter.exec_count("fast") == count
        assert limiter.enqueue("M", f"p{count}") == [("fast", f"p{count}")]
    limiter.release("fast")  # 6 x 1 = 6 = 2 x 3: the tie goes to slow (available first)
    assert limiter.enqueue("M", "p6") == [("slow", "p6")]


def test_priority_zero_counts_as_one() -> None:
    limiter: RateLimiter[str] = RateLimiter()
    limiter.add_instance("M", "zero", InstanceLimits((), 0))
    limiter.add_instance("M", "two", InstanceLimits((), 2))
    assert limiter.enqueue("M", "p") == [("zero", "p")]


def test_a_resource_is_held_for_the_whole_execution() -> None:
    limiter: RateLimiter[str] = RateLimiter()
    limiter.add_instance("A", "a", _limits(resources=(ResourceNeed("R", 2),)))
    limiter.add_instance("B", "b", _limits(resources=(ResourceNeed("R", 1),)))
    assert limiter.pool.capacity("R", 0) == 2
    assert _names(limiter.enqueue("A", "a0")) == "a"
    assert limiter.pool.in_use("R", 0) == 2
    assert limiter.enqueue("B", "b0") == []
    assert _names(limiter.release("a")) == "b"
    assert limiter.pool.in_use("R", 0) == 1


def test_default_capacity_is_the_largest_need() -> None:
    # The example of Triton's rate_limiter.md: A [R1: 4, R2: 4], B [R2: 5, R3: 10, R4: 5],
    # C [R1: 1, R3: 7, R4: 2] on one device.
    pool = ResourcePool()
    pool.add("A", {(0, "R1"): 4, (0, "R2"): 4})
    pool.add("B", {(0, "R2"): 5, (0, "R3"): 10, (0, "R4"): 5})
    pool.add("C", {(0, "R1"): 1, (0, "R3"): 7, (0, "R4"): 2})
    assert [pool.capacity(n, 0) for n in ("R1", "R2", "R3", "R4")] == [4, 5, 10, 5]
    pool.remove("B")
    assert [pool.capacity(n, 0) for n in ("R2", "R3", "R4")] == [4, 7, 2]


def test_explicit_capacities_follow_tritons_device_rules() -> None:
    # rate_limiter.md: --rate-limit-resource=R1:10 --rate-limit-resource=R2:5:0
    # --rate-limit-resource=R2:8:1 --rate-limit-resource=R3:2, R3 global.
    pool = ResourcePool(
        [
            ResourceLimit("R1", 10),
            ResourceLimit("R2", 5, 0),
            ResourceLimit("R2", 8, 1),
            ResourceLimit("R3", 2),
        ]
    )
    pool.add("i0", {(0, "R1"): 1, (0, "R2"): 1, (GLOBAL_DEVICE, "R3"): 1})
    pool.add("i1", {(1, "R1"): 1, (1, "R2"): 1})
    assert [pool.capacity("R1", d) for d in (0, 1)] == [10, 10]
    assert [pool.capacity("R2", d) for d in (0, 1)] == [5, 8]
    assert pool.capacity("R3", GLOBAL_DEVICE) == 2
    # A global resource takes the largest value given for its name, whatever the device.
    assert ResourcePool([ResourceLimit("G", 3, 0), ResourceLimit("G", 7, 1)]).capacity("G") == 7


def test_too_low_or_uncovered_capacity_refuses_the_instance_with_tritons_message() -> None:
    pool = ResourcePool([ResourceLimit("R", 1)])
    with pytest.raises(RateLimiterError) as low:
        pool.add("i", {(0, "R"): 2})
    assert low.value.message == (
        'Resource count for "R" is limited to 1 which will prevent scheduling of one or more '
        "model instances, the minimum required count is 2"
    )
    with pytest.raises(RateLimiterError, match='"other" is limited to 0 '):
        pool.add("j", {(0, "other"): 1})
    # Names are case-sensitive, as in Triton 2.51: "r" does not cover "R".
    with pytest.raises(RateLimiterError, match='"R" is limited to 0 '):
        ResourcePool([ResourceLimit("r", 5)]).add("k", {(0, "R"): 1})
    # A device-specific value covers only its device.
    with pytest.raises(RateLimiterError, match='"R" is limited to 0 '):
        ResourcePool([ResourceLimit("R", 10, 10)]).add("k", {(0, "R"): 4})
    assert pool.capacity("R", 0) == 1  # refused instances leave nothing behind
    pool.add("ok", {(0, "R"): 1})


def test_global_and_per_device_use_of_one_name_conflicts() -> None:
    limiter: RateLimiter[str] = RateLimiter()
    limiter.add_instance("A", "a", _limits(resources=(ResourceNeed("R", 1, global_=True),)))
    with pytest.raises(RateLimiterError) as conflict:
        limiter.add_instance("B", "b", _limits(resources=(ResourceNeed("R", 1),)))
    assert conflict.value.message == (
        'Resource "R" is present as both global and device-specific resource in the model '
        "configuration."
    )


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("R:2", ResourceLimit("R", 2, EVERY_DEVICE)),
        ("gpu_mem:4:1", ResourceLimit("gpu_mem", 4, 1)),
        ("Mixed:0", ResourceLimit("Mixed", 0)),
    ],
)
def test_parse_resource_limit(text: str, expected: ResourceLimit) -> None:
    assert parse_resource_limit(text) == expected
    assert parse_resource_limit(expected.flag()) == expected


@pytest.mark.parametrize("text", ["R", "R:x", "R:1:2:3", "R:1:gpu", ":"])
def test_parse_resource_limit_refuses_with_tritons_format_message(text: str) -> None:
    with pytest.raises(RateLimiterError) as exc:
        parse_resource_limit(text)
    assert exc.value.message == (
        "--rate-limit-resource option format is '<resource_name>:<count>:<device>' or "
        f"'<resource_name>:<count>'. Got {text}"
    )


# ------------------------------------------------------------------------------ the server


class Tracker:
    """Wraps every instance's backend: which instance runs, how many at once, a start gate."""

    def __init__(self) -> None:
        self.order: list[str] = []
        self.running = 0
        self.max_running = 0
        self.gate = threading.Event()
        self.gate.set()
        self.together: threading.Barrier | None = None
        self._lock = threading.Lock()

    def attach(self, server: InferenceServer, model: str) -> None:
        runtime = server._lookup(model)
        for instance in runtime.instances:
            inner = instance.backend.execute
            name = f"{model}/{instance.spec.name}"

            def execute(requests: list, inner=inner, name=name) -> list:  # type: ignore[type-arg]
                with self._lock:
                    self.order.append(name)
                    self.running += 1
                    self.max_running = max(self.max_running, self.running)
                try:
                    assert self.gate.wait(30), "gate never opened"
                    if self.together is not None:
                        self.together.wait(30)
                    return list(inner(requests))
                finally:
                    with self._lock:
                        self.running -= 1

            instance.backend.execute = execute  # type: ignore[method-assign]


def _group(priority: int, resources: str, count: int = 1, name: str = "") -> str:
    label = f'name: "{name}" ' if name else ""
    return (
        f"{{ {label}count: {count} kind: KIND_CPU "
        f"rate_limiter {{ resources [{resources}] priority: {priority} }} }}"
    )


def _model(root: Path, name: str, *groups: str, batching: str = "") -> None:
    write_model(
        root, name, identity_config(name, f"instance_group [{', '.join(groups)}]\n{batching}")
    )


R_GLOBAL = '{ name: "R" global: true count: 1 }'
R_DEVICE = '{ name: "R" count: 1 }'


@pytest.fixture
def tracker() -> Iterator[Tracker]:
    t = Tracker()
    yield t
    t.gate.set()


def _send(server: InferenceServer, model: str, collector: Collector, rid: str) -> None:
    server.submit(request(model, 1.0, rid), collector.callback(rid))


def test_rate_limit_off_ignores_resources(
    tmp_path: Path, make_server: ServerFactory, tracker: Tracker
) -> None:
    # C1: with the default --rate-limit=off two models that need R (capacity 1) run together;
    # the barrier passes only if both executions are inside execute() at the same time.
    _model(tmp_path, "a", _group(1, R_GLOBAL))
    _model(tmp_path, "b", _group(1, R_GLOBAL))
    server = make_server()
    assert server.rate_limiter is None
    tracker.together = threading.Barrier(2)
    for model in ("a", "b"):
        tracker.attach(server, model)
    collector = Collector()
    _send(server, "a", collector, "a")
    _send(server, "b", collector, "b")
    collector.wait(2)
    assert tracker.max_running == 2
    assert all(not isinstance(r, ServerError) for r in collector.results.values())


def test_two_models_sharing_a_resource_never_overlap(
    tmp_path: Path, make_server: ServerFactory, tracker: Tracker
) -> None:
    # C2: R has capacity 1 (the largest need); executions of a and b take turns.
    _model(tmp_path, "a", _group(1, R_GLOBAL))
    _model(tmp_path, "b", _group(1, R_GLOBAL))
    server = make_server(rate_limit="execution_count")
    for model in ("a", "b"):
        tracker.attach(server, model)
    collector = Collector()
    for k in range(6):
        _send(server, "a" if k % 2 else "b", collector, str(k))
    collector.wait(6)
    assert tracker.max_running == 1
    assert len(tracker.order) == 6


def test_plenty_of_resource_lets_them_run_together(
    tmp_path: Path, make_server: ServerFactory, tracker: Tracker
) -> None:
    _model(tmp_path, "a", _group(1, R_GLOBAL))
    _model(tmp_path, "b", _group(1, R_GLOBAL))
    server = make_server(
        rate_limit="execution_count", rate_limit_resources=(ResourceLimit("R", 2),)
    )
    tracker.together = threading.Barrier(2)
    for model in ("a", "b"):
        tracker.attach(server, model)
    collector = Collector()
    _send(server, "a", collector, "a")
    _send(server, "b", collector, "b")
    collector.wait(2)
    assert tracker.max_running == 2


def test_priorities_one_and_two_execute_two_to_one(
    tmp_path: Path, make_server: ServerFactory, tracker: Tracker
) -> None:
    # C3, within one model: two instances sharing R (capacity 1), priority 1 and 2. The first
    # execution is held until 29 more requests wait, so the order is the pure rule's.
    _model(
        tmp_path,
        "m",
        _group(1, R_GLOBAL, name="p1"),
        _group(2, R_GLOBAL, name="p2"),
    )
    server = make_server(rate_limit="execution_count")
    tracker.attach(server, "m")
    tracker.gate.clear()
    collector = Collector()
    _send(server, "m", collector, "0")
    wait_until(lambda: tracker.running == 1, 20, "one execution running")
    for k in range(1, 30):
        _send(server, "m", collector, str(k))
    wait_until(lambda: pending(server, "m") == 29, 20, "29 requests pending")
    tracker.gate.set()
    collector.wait(30)
    order = "".join("a" if name.endswith("p1_0") else "b" for name in tracker.order)
    expected: RateLimiter[int] = RateLimiter()
    expected.add_instance("m", "a", _limits(1))
    expected.add_instance("m", "b", _limits(2))
    planned = _names(expected.enqueue("m", 0))
    for k in range(1, 30):
        planned += _names(expected.enqueue("m", k))
    while len(planned) < 30:
        planned += _names(expected.release(planned[-1]))
    assert order == planned
    assert (order.count("a"), order.count("b")) == (20, 10)
    assert tracker.max_running == 1
    stats = server.model_statistics("m")["model_stats"][0]
    assert stats["execution_count"] == 30


def test_explicit_capacity_below_a_need_fails_the_load(
    tmp_path: Path, make_server: ServerFactory
) -> None:
    # C4, with the reply Triton 2.51 gives.
    _model(tmp_path, "r", _group(1, '{ name: "R" count: 2 }'))
    server = make_server(
        models=(), rate_limit="execution_count", rate_limit_resources=(ResourceLimit("R", 1),)
    )
    with pytest.raises(ServerError) as exc:
        server.load_model("r")
    assert exc.value.message == (
        "load failed for model 'r': version 1 is at UNAVAILABLE state: Invalid argument: "
        'Resource count for "R" is limited to 1 which will prevent scheduling of one or more '
        "model instances, the minimum required count is 2;\n"
    )
    assert server.load_errors()["r"].startswith('Invalid argument: Resource count for "R"')


def test_uncovered_resource_has_capacity_zero(tmp_path: Path, make_server: ServerFactory) -> None:
    _model(tmp_path, "r", _group(1, '{ name: "R" count: 1 }'))
    server = make_server(
        models=(), rate_limit="execution_count", rate_limit_resources=(ResourceLimit("S", 4),)
    )
    with pytest.raises(ServerError, match='"R" is limited to 0 which'):
        server.load_model("r")


def test_global_and_per_device_declarations_conflict(
    tmp_path: Path, make_server: ServerFactory
) -> None:
    # C5: the second model declares R per device while the first declared it global.
    _model(tmp_path, "g", _group(1, R_GLOBAL))
    _model(tmp_path, "d", _group(1, R_DEVICE))
    server = make_server(models=("g",), rate_limit="execution_count")
    with pytest.raises(ServerError, match='Resource "R" is present as both global and device'):
        server.load_model("d")
    assert server.model_ready("g")
    server.unload_model("g")
    limiter = server.rate_limiter
    assert limiter is not None
    wait_until(
        lambda: limiter.capacity("R", GLOBAL_DEVICE) == 0, 20, "R to be used up"
    )  # g drained and left
    server.load_model("d")  # g is gone: no conflict any more
    assert server.model_ready("d")


def test_batches_held_by_the_rate_limiter_are_not_capped(
    tmp_path: Path, make_server: ServerFactory, tracker: Tracker
) -> None:
    # §3.5/§3.11: with max_batch_size 1 every request is its own batch. Rate limiting off, a
    # busy instance lets 2 batches form ahead and the rest stay queued; on, all are formed.
    results = {}
    for rate_limit in ("off", "execution_count"):
        name = f"m_{rate_limit}"
        write_model(tmp_path, name, identity_config(name, "dynamic_batching { }", max_batch_size=1))
        server = make_server(models=(name,), rate_limit=rate_limit)
        local = Tracker()
        local.gate.clear()
        local.attach(server, name)
        collector = Collector()
        _send(server, name, collector, "0")
        wait_until(lambda local=local: local.running == 1, 20, "one execution running")
        for k in range(1, 6):
            _send(server, name, collector, str(k))
        wait_until(lambda server=server, name=name: pending(server, name) == 5, 20, "5 pending")
        scheduler = server._lookup(name).scheduler
        # Once the batcher has formed what it may: 3 requests left queued (off) or none.
        wait_until(
            lambda s=scheduler, r=rate_limit: s.queued_count() == (3 if r == "off" else 0),
            20,
            "the scheduler queue to hold what the rate limiter does not",
        )
        results[rate_limit] = scheduler.queued_count()
        local.gate.set()
        collector.wait(6)
    assert results == {"off": 3, "execution_count": 0}


def test_without_prefetch_one_batch_waits_per_idle_instance(
    tmp_path: Path, make_server: ServerFactory, tracker: Tracker
) -> None:
    # Priority levels turn prefetching off: while R is held, the model's one idle instance gets
    # one batch (bound in the rate limiter) and the rest stay queued, where priority 1 still
    # overtakes priority 2 (the differential test shows Triton doing the same).
    _model(tmp_path, "h", _group(1, R_GLOBAL))
    write_model(
        tmp_path,
        "m",
        identity_config(
            "m",
            f"instance_group [{_group(1, R_GLOBAL)}]\n"
            "dynamic_batching { priority_levels: 2 default_priority_level: 2 }",
            max_batch_size=1,
        ),
    )
    server = make_server(rate_limit="execution_count")
    tracker.attach(server, "h")
    tracker.attach(server, "m")
    tracker.gate.clear()
    collector = Collector()
    _send(server, "h", collector, "h")
    wait_until(lambda: tracker.running == 1, 20, "one execution running")
    scheduler = server._lookup("m").scheduler
    server.submit(request("m", 1.0, "a", priority=2), collector.callback("a"))
    wait_until(
        lambda: pending(server, "m") == 1 and scheduler.queued_count() == 0,
        20,
        "one request pending, none in the scheduler queue",
    )  # bound
    for rid, priority in (("b", 2), ("c", 2), ("d", 1)):
        server.submit(request("m", 1.0, rid, priority=priority), collector.callback(rid))
    wait_until(lambda: pending(server, "m") == 4, 20, "4 requests pending")
    assert scheduler.queued_count() == 3  # no batch formed for them: no idle instance
    tracker.gate.set()
    collector.wait(5)
    assert collector.order == ["h", "a", "d", "b", "c"]


def test_unload_drains_requests_waiting_for_resources(
    tmp_path: Path, make_server: ServerFactory, tracker: Tracker
) -> None:
    _model(tmp_path, "a", _group(1, R_GLOBAL))
    _model(tmp_path, "b", _group(1, R_GLOBAL))
    server = make_server(rate_limit="execution_count")
    tracker.attach(server, "a")
    tracker.attach(server, "b")
    tracker.gate.clear()
    collector = Collector()
    _send(server, "a", collector, "a0")
    wait_until(lambda: tracker.running == 1, 20, "one execution running")
    for k in range(3):
        _send(server, "b", collector, f"b{k}")
    wait_until(lambda: pending(server, "b") == 3, 20, "3 requests of b pending")
    server.unload_model("b")
    tracker.gate.set()
    collector.wait(4)
    assert all(not isinstance(r, ServerError) for r in collector.results.values())


def test_reload_keeps_serving_under_rate_limiting(
    tmp_path: Path, make_server: ServerFactory
) -> None:
    _model(tmp_path, "a", _group(1, R_GLOBAL))
    server = make_server(rate_limit="execution_count")
    assert server.infer_sync(request("a", 2.0), 10).outputs["OUTPUT0"].tolist() == [[2.0] * 4]
    _model(tmp_path, "a", _group(2, R_GLOBAL, count=2))
    server.load_model("a")
    for value in (3.0, 4.0, 5.0):
        assert server.infer_sync(request("a", value), 10).outputs["OUTPUT0"].tolist() == [
            [value] * 4
        ]


# ------------------------------------------------------------------------------ the edges


def test_command_line_flags() -> None:
    args = build_parser().parse_args(
        [
            "--rate-limit",
            "EXECUTION_COUNT",
            "--rate-limit-resource=R:2",
            "--rate-limit-resource",
            "G:1:0",
        ]
    )
    assert args.rate_limit == "execution_count"
    assert args.rate_limit_resources == ["R:2", "G:1:0"]
    assert build_parser().parse_args([]).rate_limit == "off"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--rate-limit=sometimes"])


def test_server_options_refuse_bad_values() -> None:
    with pytest.raises(ServerError, match="invalid argument for --rate-limit"):
        ServerOptions(rate_limit="sometimes")
    with pytest.raises(ServerError, match="--rate-limit-resource option format"):
        ServerOptions(rate_limit="execution_count", rate_limit_resources=("R",))
    ServerOptions(rate_limit="Execution_Count", rate_limit_resources=("R:1:0",))


@pytest.mark.usefixtures("spawns")
def test_python_m_reference_server_applies_the_flags(tmp_path: Path) -> None:
    # End to end through the CLI: a capacity below the need fails startup with exit 2 and
    # Triton's reason; a malformed value is refused before anything starts.
    _model(tmp_path, "r", _group(1, '{ name: "R" count: 2 }'))
    base = [sys.executable, "-m", "reference_server", f"--model-repository={tmp_path}"]
    ports = ["--http-port=0", "--grpc-port=0", "--metrics-port=0", "--device=cpu"]
    low = subprocess.run(
        [*base, *ports, "--rate-limit", "execution_count", "--rate-limit-resource=R:1"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert low.returncode == 2, low.stderr
    assert 'Resource count for "R" is limited to 1 which will prevent scheduling' in low.stderr
    bad = subprocess.run(
        [*base, *ports, "--rate-limit-resource", "R"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert bad.returncode == 2
    assert "--rate-limit-resource option format is" in bad.stderr
