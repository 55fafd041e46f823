"""The reference server's dynamic batcher against the real Triton, scenario by scenario.

Every scenario runs on a fresh real Triton (Python-backend sleep model) and on a fresh reference
server (identity backend, same config and ``execute_delay_ms``). The Triton run must show what
``triton_spec.md`` §3.4/§11 B (and ``server/qa/L0_batcher``) say; the reference run must show
exactly what the Triton run showed: the same ``batch_stats``, ``execution_count``, grouping of
requests into executions, error statuses and messages, and which requests waited for the queue
delay. ``TRITONSERVER_DELAY_SCHEDULER`` holds the batcher until N requests are queued so that the
batches formed do not depend on thread timing.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.grpc import model_config_pb2 as mc

from tests.support.differential import (
    Observation,
    Send,
    key_structure,
    metric_families,
    model_series,
    run_scenario,
    settled_stats,
)
from tests.support.real_triton import (
    TensorSpec,
    TritonInstall,
    dynamic_batching,
    sleep_model_config,
)
from tests.support.servers import ServerKind, start_server

pytestmark = [pytest.mark.usefixtures("quiet_machine"), pytest.mark.triton, pytest.mark.slow]

#: Execution time of every scenario model: executions finish at least this far apart.
EXEC_MS = 500
MODEL = "batcher"


@dataclass(frozen=True)
class Scenario:
    """One batching scenario and what Triton's documented behaviour says it must produce."""

    id: str
    config: Callable[[], mc.ModelConfig]
    sends: tuple[Send, ...]
    batch_stats: dict[int, int]
    groups: tuple[tuple[int, ...], ...]
    delay_scheduler: int | None = None
    errors: dict[int, tuple[str, str]] = field(default_factory=dict)
    waited_for_delay: frozenset[int] = frozenset()


def _model(
    *,
    preferred: tuple[int, ...] = (),
    delay_us: int = 0,
    max_batch_size: int = 8,
    dims: tuple[int, ...] = (16,),
    batching: bool = True,
    exec_ms: int = EXEC_MS,
    **policy: Any,
) -> Callable[[], mc.ModelConfig]:
    def build() -> mc.ModelConfig:
        block = dynamic_batching(preferred=preferred, max_queue_delay_us=delay_us, **policy)
        return sleep_model_config(
            MODEL,
            max_batch_size=max_batch_size,
            inputs=(TensorSpec(dims=dims),),
            dynamic_batching=block if batching else None,
            execute_delay_ms=exec_ms,
        )

    return build


def _queued(count: int) -> tuple[Send, ...]:
    # Each request is seen pending before the next is sent (so arrival order = send order);
    # the last one releases the held batcher, so there is nothing to wait for.
    return (*(Send(wait_queued=True) for _ in range(count - 1)), Send())


SCENARIOS = [
    # L0_batcher test_multi_batch_use_biggest_preferred: the largest preferred prefix wins.
    Scenario(
        "use_biggest_preferred",
        _model(preferred=(2, 6), delay_us=5_000_000),
        _queued(6),
        batch_stats={6: 1},
        groups=((0, 1, 2, 3, 4, 5),),
        delay_scheduler=6,
    ),
    # §3.4: D == 0 dispatches at once but still cuts at the largest preferred prefix.
    Scenario(
        "d0_cut_at_preferred",
        _model(preferred=(4, 8), delay_us=0),
        _queued(6),
        batch_stats={4: 1, 2: 1},
        groups=((0, 1, 2, 3), (4, 5)),
        delay_scheduler=6,
    ),
    # L0_batcher test_multi_batch_delayed_use_max_batch: after the delay expired preferred
    # sizes no longer cap the batch; it grows to max_batch_size.
    Scenario(
        "delayed_use_max_batch",
        _model(preferred=(2, 6), delay_us=1_000_000),
        (Send(batch=3, wait_queued=True), Send(batch=4, wait_queued=True), Send(pause_s=2.0)),
        batch_stats={8: 1},
        groups=((0, 1, 2),),
        delay_scheduler=3,
        waited_for_delay=frozenset({0, 1}),
    ),
    # L0_batcher test_multi_batch_gt_max_preferred: both dispatched at once.
    Scenario(
        "gt_max_preferred",
        _model(preferred=(2, 6), delay_us=2_000_000),
        (Send(batch=3, wait_queued=True), Send(batch=7)),
        batch_stats={3: 1, 7: 1},
        groups=((0,), (1,)),
    ),
    # L0_batcher test_multi_batch_sum_gt_max_preferred: {3} at once, {4} after the delay.
    Scenario(
        "sum_gt_max_preferred",
        _model(preferred=(2, 6), delay_us=2_000_000),
        (Send(batch=3, wait_queued=True), Send(batch=4)),
        batch_stats={3: 1, 4: 1},
        groups=((0,), (1,)),
        waited_for_delay=frozenset({1}),
    ),
    # L0_batcher test_multi_batch_delayed_preferred_different_shape: a shape change ends the
    # batch; nothing is reordered.
    Scenario(
        "shape_mismatch_cuts_batch",
        _model(preferred=(2, 6), delay_us=5_000_000, dims=(-1,)),
        (
            Send(batch=1, item_dims=(16,), wait_queued=True),
            Send(batch=3, item_dims=(16,), wait_queued=True),
            Send(batch=1, item_dims=(8,), wait_queued=True),
            Send(batch=5, item_dims=(8,)),
        ),
        batch_stats={4: 1, 6: 1},
        groups=((0, 1), (2, 3)),
        delay_scheduler=4,
    ),
    # §3.4: max_batch_size 0 with dynamic batching: every request is its own execution.
    Scenario(
        "max_batch_size_0",
        _model(max_batch_size=0),
        _queued(3),
        batch_stats={1: 3},
        groups=((0,), (1,), (2,)),
        delay_scheduler=3,
    ),
    # §11 B1 / §3.5 prefetch: while the only instance is busy, single requests arriving one by
    # one join the batch waiting for it, which runs as one execution once the instance is free.
    Scenario(
        "prefetch_grows_waiting_batch",
        _model(delay_us=0, exec_ms=1500),
        (
            Send(),
            *(
                Send(wait_queued=True, pending=n, pause_s=0.2 if n == 1 else 0.0)
                for n in (1, 2, 3, 4, 5)
            ),
        ),
        batch_stats={1: 1, 5: 1},
        groups=((0,), (1, 2, 3, 4, 5)),
    ),
    # §3.4 wake rule: with a queue delay, once the batch waiting for the busy instance holds a
    # request, a later arrival wakes the batcher only when the queue holds the next preferred
    # size (here 8): requests 2 and 3 stay queued instead of joining batch {1}, and go out
    # together after the instance takes {1}. (Under load this splits executions into a small
    # batch and a large one; the D = 0 scenario above grows the waiting batch one by one.)
    Scenario(
        "delayed_batch_waits_for_the_next_preferred_size",
        _model(delay_us=100_000, exec_ms=550),
        (Send(), Send(pause_s=0.2), Send(pause_s=0.2), Send(pause_s=0.1)),
        batch_stats={1: 2, 2: 1},
        groups=((0,), (1,), (2, 3)),
        waited_for_delay=frozenset({0, 1, 2, 3}),
    ),
    # §11 B12: without dynamic_batching concurrent requests are never batched.
    Scenario(
        "no_dynamic_batching",
        _model(batching=False),
        (
            Send(),
            *(Send(wait_queued=True, pending=n, pause_s=0.2 if n == 1 else 0.0) for n in (1, 2)),
        ),
        batch_stats={1: 3},
        groups=((0,), (1,), (2,)),
    ),
    # §11 B19: the priority-1 request jumps the queue and completes a preferred batch with the
    # first default-level request; the bs=1 request waits for the delay.
    Scenario(
        "priority_order",
        _model(preferred=(4, 8), delay_us=2_000_000, priority_levels=2, default_priority_level=2),
        (
            Send(batch=2, wait_queued=True),
            Send(batch=1, wait_queued=True),
            Send(batch=2, priority=1),
        ),
        batch_stats={4: 1, 1: 1},
        groups=((0, 2), (1,)),
        waited_for_delay=frozenset({1}),
    ),
    # §11 B20: priority 99 (> priority_levels) silently means the default level (here 1, the
    # highest): the bs=2 request goes ahead of the two level-2 requests and completes the
    # preferred size 4 with the first one. Clamped to level 2 it would queue last and the
    # two level-2 requests would be sent together instead.
    Scenario(
        "out_of_range_priority_is_default",
        _model(preferred=(4,), delay_us=2_000_000, priority_levels=2, default_priority_level=1),
        (
            Send(batch=2, priority=2, wait_queued=True),
            Send(batch=1, priority=2, wait_queued=True),
            Send(batch=2, priority=99),
        ),
        batch_stats={4: 1, 1: 1},
        groups=((0, 2), (1,)),
        waited_for_delay=frozenset({1}),
    ),
    # §11 B16: the expired request is answered 503 by the REJECT policy; the later two run.
    Scenario(
        "timeout_reject",
        _model(preferred=(4, 8), delay_us=3_000_000, timeout_us=500_000),
        (Send(batch=1), Send(batch=2, pause_s=1.0), Send(batch=2, pause_s=0.05)),
        batch_stats={4: 1},
        groups=((1, 2),),
        errors={0: ("503", "Request timeout expired")},
    ),
    # §11 B18: allow_timeout_override lets a request shorten the default timeout: the first
    # request is rejected after 200 ms instead of running with the second one at the delay.
    Scenario(
        "timeout_override_shortens",
        _model(
            preferred=(8,), delay_us=1_000_000, timeout_us=2_000_000, allow_timeout_override=True
        ),
        (Send(timeout_us=200_000), Send(pause_s=0.5)),
        batch_stats={1: 1},
        groups=((1,),),
        errors={0: ("503", "Request timeout expired")},
        waited_for_delay=frozenset({1}),
    ),
    # §11 B18 / quirk §12.3: with default_timeout_microseconds 0 a request timeout is ignored.
    Scenario(
        "timeout_override_needs_a_default",
        _model(preferred=(8,), delay_us=1_000_000, allow_timeout_override=True),
        (Send(timeout_us=200_000),),
        batch_stats={1: 1},
        groups=((0,),),
        waited_for_delay=frozenset({0}),
    ),
    # §11 B17: with the DELAY action the expired request is not rejected but moved behind the
    # unexpired ones: the two later requests run first, the first one after the queue delay.
    Scenario(
        "timeout_delay_action",
        _model(preferred=(4, 8), delay_us=3_000_000, timeout_us=500_000, timeout_action="DELAY"),
        (Send(batch=1), Send(batch=2, pause_s=1.0), Send(batch=2, pause_s=0.05)),
        batch_stats={4: 1, 1: 1},
        groups=((1, 2), (0,)),
        waited_for_delay=frozenset({0}),
    ),
    # §11 B14: with max_queue_size 1 the second request is refused while the first waits.
    Scenario(
        "queue_full",
        _model(preferred=(8,), delay_us=2_000_000, max_queue_size=1),
        (Send(batch=1, wait_queued=True), Send(batch=1)),
        batch_stats={1: 1},
        groups=((0,),),
        errors={1: ("503", "[request id: <id_unknown>] Exceeds maximum queue size")},
        waited_for_delay=frozenset({0}),
    ),
]


def _observe(
    kind: ServerKind, scenario: Scenario, workdir: Path, install: TritonInstall | None
) -> Observation:
    config = scenario.config()
    with start_server(
        kind,
        workdir / kind,
        [config],
        delay_scheduler=scenario.delay_scheduler,
        triton_install=install,
    ) as server:
        return run_scenario(server, MODEL, config, scenario.sends)


def _expected_failures(scenario: Scenario) -> int:
    # Timeout rejections count in `fail`; queue-full refusals never reach the scheduler.
    return sum(1 for status, message in scenario.errors.values() if "timeout" in message)


@pytest.fixture(scope="module")
def triton_observations() -> dict[str, Observation]:
    """Triton's observation per scenario, shared by the two tests of a scenario."""
    return {}


def _triton_observation(
    scenario: Scenario,
    cache: dict[str, Observation],
    install: TritonInstall,
    workdir: Path,
) -> Observation:
    if scenario.id not in cache:
        cache[scenario.id] = _observe("triton", scenario, workdir, install)
    return cache[scenario.id]


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda s: s.id)
def test_triton_matches_documented_batching(
    scenario: Scenario,
    triton_install: TritonInstall,
    triton_observations: dict[str, Observation],
    tmp_path: Path,
) -> None:
    observed = _triton_observation(scenario, triton_observations, triton_install, tmp_path)
    assert observed.batch_stats == scenario.batch_stats
    assert observed.execution_count == sum(scenario.batch_stats.values())
    assert observed.groups == scenario.groups
    assert observed.errors == scenario.errors
    assert observed.fail_count == _expected_failures(scenario)
    assert observed.waited_for_delay == scenario.waited_for_delay


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda s: s.id)
def test_reference_batches_like_triton(
    scenario: Scenario,
    triton_install: TritonInstall,
    triton_observations: dict[str, Observation],
    tmp_path: Path,
) -> None:
    reference = _observe("reference", scenario, tmp_path, None)
    triton = _triton_observation(scenario, triton_observations, triton_install, tmp_path)
    assert reference == triton, (
        f"reference server differs from Triton in {scenario.id}:\n"
        f"  reference: {reference}\n  triton:    {triton}"
    )


# ---------------------------------------------------------------------------------------------
# Repository, statistics and metrics: same fields and names on both servers

#: GET config fields that perfsweep writes or reads; they must render identically.
CONFIG_FIELDS = ("name", "max_batch_size", "input", "output", "dynamic_batching", "version_policy")


def _config_view(config: dict[str, Any]) -> dict[str, Any]:
    view = {key: config.get(key) for key in CONFIG_FIELDS}
    view["instance_group"] = [
        {key: group[key] for key in ("name", "kind", "count", "gpus", "passive")}
        for group in config["instance_group"]
    ]
    view["parameters"] = config.get("parameters")
    return view


def _override_and_probe(
    kind: ServerKind, workdir: Path, install: TritonInstall | None
) -> dict[str, Any]:
    base = sleep_model_config("probe", max_batch_size=8)
    override = sleep_model_config(
        "probe",
        max_batch_size=8,
        instance_count=2,
        dynamic_batching=dynamic_batching(
            preferred=(4, 8),
            max_queue_delay_us=500,
            priority_levels=2,
            default_priority_level=1,
            timeout_us=1_000_000,
            allow_timeout_override=True,
            max_queue_size=16,
        ),
    )
    with start_server(kind, workdir / kind, [base], triton_install=install) as server:
        before = json.loads(server.http_status("GET", "/v2/models/probe/config")[1])
        server.load_model("probe", override)
        after = json.loads(server.http_status("GET", "/v2/models/probe/config")[1])
        client = httpclient.InferenceServerClient(server.http_url)
        try:
            data = np.ones((2, 16), dtype=np.float32)
            tensor = httpclient.InferInput("INPUT0", [2, 16], "FP32")
            tensor.set_data_from_numpy(data)
            client.infer("probe", [tensor])
        finally:
            client.close()
        return {
            "before": _config_view(before),
            "after": _config_view(after),
            "stats": settled_stats(server, "probe", successes=1, items=2),
            "metrics": server.metrics_text(),
        }


@pytest.fixture(scope="module")
def probes(
    triton_install: TritonInstall, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, dict[str, Any]]:
    workdir = tmp_path_factory.mktemp("probe")
    return {
        "triton": _override_and_probe("triton", workdir, triton_install),
        "reference": _override_and_probe("reference", workdir, None),
    }


def test_config_override_changes_instances_and_batching_on_triton(
    probes: dict[str, dict[str, Any]],
) -> None:
    triton = probes["triton"]
    assert triton["before"]["instance_group"][0]["count"] == 1
    assert (
        "dynamic_batching" not in triton["before"] or triton["before"]["dynamic_batching"] is None
    )
    after = triton["after"]
    assert after["instance_group"][0]["count"] == 2
    assert after["dynamic_batching"]["preferred_batch_size"] == [4, 8]
    assert after["dynamic_batching"]["max_queue_delay_microseconds"] == 500


def test_config_json_matches_triton_before_and_after_override(
    probes: dict[str, dict[str, Any]],
) -> None:
    for phase in ("before", "after"):
        assert probes["reference"][phase] == probes["triton"][phase], phase


def test_statistics_json_has_tritons_shape(probes: dict[str, dict[str, Any]]) -> None:
    triton, reference = probes["triton"]["stats"], probes["reference"]["stats"]
    assert key_structure(reference) == key_structure(triton)
    for stats in (triton, reference):
        assert stats["inference_count"] == 2
        assert stats["execution_count"] == 1
        assert stats["batch_stats"][0]["batch_size"] == 2


def test_per_model_metric_families_match_triton(probes: dict[str, dict[str, Any]]) -> None:
    triton = metric_families(probes["triton"]["metrics"])
    reference = metric_families(probes["reference"]["metrics"])
    per_model = {name: kind for name, kind in triton.items() if name.startswith("nv_inference")}
    assert len(per_model) >= 10, sorted(triton)
    assert {name: reference.get(name) for name in per_model} == per_model
    # The same series exist for the model: every counter, and all four failure reasons. The
    # reference also exports nv_model_load_duration_secs, which Triton added after 2.51 (the
    # spec follows 2.73), and its own perfsweep_model_device_info (which device ran the model);
    # nothing else may differ.
    ours = model_series(probes["reference"]["metrics"], "probe")
    theirs = model_series(probes["triton"]["metrics"], "probe")
    assert theirs <= ours
    extra = {series.split("{")[0] for series in ours - theirs}
    assert extra <= {"nv_model_load_duration_secs", "perfsweep_model_device_info"}
    for sample in (
        'nv_inference_count{model="probe",version="1"} 2',
        'nv_inference_exec_count{model="probe",version="1"} 1',
    ):
        assert sample in probes["triton"]["metrics"]
        assert sample in probes["reference"]["metrics"]
