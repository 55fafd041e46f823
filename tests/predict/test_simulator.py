"""The simulator on planted profiles with known answers (pure, milliseconds to seconds)."""

from __future__ import annotations

import pytest

from analyzer.predict import ExtrapolationError
from analyzer.predict.capacity import capacity
from analyzer.predict.profile import BatchTiming, Profile
from analyzer.predict.sim_records import SimConfig
from analyzer.predict.simulator import simulate


def constant(ms: float, largest: int = 8, per_item_ms: float = 0.0) -> Profile:
    """A device whose execution takes ms + per_item_ms * b, all of it device time."""
    return Profile(
        model="planted",
        provenance="planted test profile",
        source="test",
        timings=tuple(
            BatchTiming(b, 0.0, ms + per_item_ms * b, 0.0) for b in range(1, largest + 1)
        ),
    )


def test_no_batching_is_an_md1_queue() -> None:
    # M/D/1: mean wait in queue = rho * D / (2 (1 - rho)); latency = wait + D.
    d_ms, rate = 10.0, 50.0
    rho = rate * d_ms / 1000.0
    expected = d_ms + rho * d_ms / (2 * (1 - rho))  # 15 ms
    pred = simulate(
        constant(d_ms, 1), SimConfig(1, dynamic_batching=False), rate, requests=60000, seed=3
    )
    assert pred.mean_ms == pytest.approx(expected, rel=0.04)
    assert pred.batch_sizes == {1: 60000}
    assert not pred.saturated


def test_dynamic_batching_with_mbs_1_is_the_same_queue() -> None:
    d_ms, rate = 10.0, 50.0
    plain = simulate(constant(d_ms, 1), SimConfig(1, dynamic_batching=False), rate, seed=5)
    batched = simulate(constant(d_ms, 1), SimConfig(1), rate, seed=5)
    assert batched.mean_ms == pytest.approx(plain.mean_ms, rel=1e-9)


def test_long_queue_delay_fills_the_preferred_size() -> None:
    # 1000 req/s, a 1 s delay: four requests arrive within a few ms, so a batch waits for
    # its preferred size 4 and never for the delay (except the last one, at the end).
    pred = simulate(constant(1.0, 4), SimConfig(4, 1_000_000, (4,)), 1000.0, requests=4000)
    assert pred.batch_sizes[4] >= 999
    assert sum(n for b, n in pred.batch_sizes.items() if b != 4) <= 1


def test_queue_delay_zero_at_low_load_runs_batches_of_one() -> None:
    pred = simulate(constant(1.0, 8), SimConfig(8), 10.0, requests=2000)
    assert pred.batch_sizes.get(1, 0) / sum(pred.batch_sizes.values()) > 0.98
    assert pred.p50_ms == pytest.approx(1.0, abs=0.01)


def test_delay_is_waited_when_the_preferred_size_is_not_reached() -> None:
    # 10 req/s with a 5 ms delay and preferred 8: every request waits the delay, alone.
    pred = simulate(constant(1.0, 8), SimConfig(8, 5000, (8,)), 10.0, requests=2000)
    assert pred.p50_ms == pytest.approx(6.0, abs=0.01)


def test_a_queue_delay_under_load_splits_executions_into_small_and_full_batches() -> None:
    # Triton's wake rule (Scheduler.arrival_wakes): with a delay, arrivals do not join the batch
    # waiting for a busy instance one by one, so under load a small batch alternates with a
    # full one; without a delay the waiting batch grows with each arrival. Seen on Triton 2.51
    # at 450 req/s, max batch 16, two instances: 25 % of executions at 16 with 2 ms, 3 % with 0.
    profile = constant(10.0, 16, per_item_ms=1.0)
    full = {}
    for delay_us in (0, 2000):
        pred = simulate(profile, SimConfig(16, delay_us, instance_count=2), 450.0, requests=8000)
        full[delay_us] = pred.batch_sizes.get(16, 0) / sum(pred.batch_sizes.values())
        small = sum(n for b, n in pred.batch_sizes.items() if b <= 2)
        full[f"small {delay_us}"] = small / sum(pred.batch_sizes.values())
    assert full[2000] > 0.2 and full[0] < 0.05
    assert full["small 2000"] > 3 * full["small 0"]


def test_two_instances_on_one_device_serialise_device_work() -> None:
    # All device time: a second instance adds nothing, so saturation stays at 100 req/s.
    over = simulate(constant(10.0, 1), SimConfig(1, instance_count=2), 150.0, requests=4000)
    assert over.saturated
    assert over.throughput_rps == pytest.approx(100.0, rel=0.05)


def test_host_work_overlaps_across_instances() -> None:
    host = Profile(
        model="planted",
        provenance="planted",
        source="test",
        timings=(BatchTiming(1, 5.0, 5.0, 0.0),),
    )
    one = simulate(host, SimConfig(1, instance_count=1), 150.0, requests=4000)
    two = simulate(host, SimConfig(1, instance_count=2), 150.0, requests=4000)
    assert one.saturated and one.throughput_rps == pytest.approx(100.0, rel=0.05)
    assert not two.saturated  # device bound at 200 req/s


def test_overlap_in_compute_infer_is_run_as_host_work() -> None:
    # 10 ms of compute_infer, 5 of it host work that overlaps (a Python backend's statistics):
    # with the overlap known, two instances are device-bound at 200 req/s, not 100.
    hidden = Profile(
        model="planted",
        provenance="planted",
        source="test",
        timings=(BatchTiming(1, 0.0, 10.0, 0.0),),
        overlap_ms=5.0,
    )
    two = simulate(hidden, SimConfig(1, instance_count=2), 150.0, requests=4000)
    assert not two.saturated
    assert hidden.peak_rps(1, 2) == pytest.approx(200.0)


def test_capacity_brackets_the_goal() -> None:
    profile = constant(2.0, 16, per_item_ms=0.25)
    config = SimConfig(16, 500)
    cap = capacity(profile, config, 20.0)
    assert cap.at_capacity is not None and cap.at_capacity.p99_ms <= 20.0
    assert cap.upper_rps > cap.capacity_rps
    above = simulate(profile, config, cap.upper_rps, requests=3000)
    assert above.p99_ms > 20.0 or above.saturated
    # Batching raises capacity over the same device without it.
    plain = capacity(profile, SimConfig(16, dynamic_batching=False), 20.0)
    assert cap.capacity_rps > 2 * plain.capacity_rps


def test_same_seed_same_answer_and_jitter_is_applied() -> None:
    jittery = Profile(
        model="planted",
        provenance="planted",
        source="test",
        timings=(BatchTiming(1, 0.0, 5.0, 0.0),),
        jitter=0.2,
    )
    a = simulate(jittery, SimConfig(1, dynamic_batching=False), 100.0, seed=7)
    b = simulate(jittery, SimConfig(1, dynamic_batching=False), 100.0, seed=7)
    assert a == b
    steady = simulate(constant(5.0, 1), SimConfig(1, dynamic_batching=False), 100.0, seed=7)
    assert a.p99_ms > steady.p99_ms


def test_refuses_batch_sizes_beyond_the_profile() -> None:
    with pytest.raises(ExtrapolationError, match="covers batch sizes 1-8"):
        simulate(constant(1.0, 8), SimConfig(16), 100.0)
    # Without dynamic batching only batch 1 is executed: a profile of batch 1 suffices.
    simulate(constant(1.0, 1), SimConfig(16, dynamic_batching=False), 10.0, requests=200)


def test_a_start_at_the_answer_needs_two_simulated_rates() -> None:
    profile = constant(2.0, 16, per_item_ms=0.25)
    config = SimConfig(16, 500)
    cold = capacity(profile, config, 20.0)
    warm = capacity(profile, config, 20.0, start_rps=cold.capacity_rps)
    assert len(cold.steps) >= 6
    assert len(warm.steps) == 2
    assert warm.capacity_rps == cold.capacity_rps
    assert warm.upper_rps == pytest.approx(cold.capacity_rps * 1.02)


@pytest.mark.parametrize("start_factor", [0.5, 0.9, 1.1, 3.0])
def test_a_start_away_from_the_answer_brackets_it(start_factor: float) -> None:
    profile = constant(2.0, 16, per_item_ms=0.25)
    config = SimConfig(16, 500)
    cold = capacity(profile, config, 20.0)
    warm = capacity(profile, config, 20.0, start_rps=cold.capacity_rps * start_factor)
    # Both answers lie in a bracket of one resolution around the passing/failing boundary.
    assert warm.capacity_rps == pytest.approx(cold.capacity_rps, rel=0.03)
    assert warm.upper_rps - warm.capacity_rps <= 0.02 * warm.capacity_rps * (1 + 1e-6)
    assert warm.at_capacity is not None and warm.at_capacity.p99_ms <= 20.0
    assert len(warm.steps) <= len(cold.steps) + 4  # a start 2x off costs a few more


def test_an_unreachable_goal_has_no_capacity_with_or_without_a_start() -> None:
    # Every execution takes 10 ms: a 5 ms goal fails at any rate, the lowest included.
    profile = constant(10.0, 4)
    for start in (None, 30.0):
        cap = capacity(profile, SimConfig(4), 5.0, start_rps=start)
        assert cap.capacity_rps == 0.0 and cap.at_capacity is None
        assert cap.steps[-1][0] == pytest.approx(profile.peak_rps(4) * 0.01)


@pytest.mark.usefixtures("takes_seconds")
def test_capacities_of_a_space_match_one_search_each() -> None:
    from analyzer.predict.capacity import capacities

    profile = constant(2.0, 16, per_item_ms=0.25)
    configs = [
        SimConfig(mbs, delay, (), instances)
        for mbs in (1, 4, 16)
        for delay in (0, 500, 2000)
        for instances in (1, 2)
    ]
    got = capacities(profile, configs, 20.0)
    assert set(got) == set(configs)
    for config in configs:
        alone = capacity(profile, config, 20.0)
        assert got[config].capacity_rps == pytest.approx(alone.capacity_rps, rel=0.03)
    # max_batch_size 1: the delay changes nothing, so one search serves every delay.
    ones = {id(got[SimConfig(1, d, (), 2)]) for d in (0, 500, 2000)}
    assert len(ones) == 1


def test_capacities_refuse_an_uncovered_config_before_simulating() -> None:
    from analyzer.predict.capacity import capacities

    with pytest.raises(ExtrapolationError):
        capacities(constant(1.0, 8), [SimConfig(4), SimConfig(16)], 20.0)


@pytest.mark.usefixtures("spawns")
def test_capacities_in_worker_processes_give_the_same_answers() -> None:
    from analyzer.predict.capacity import capacities

    profile = constant(2.0, 8, per_item_ms=0.25)
    configs = [
        SimConfig(mbs, delay, (), n) for mbs in (2, 8) for delay in (0, 1000) for n in (1, 2)
    ]
    one = capacities(profile, configs, 20.0, requests=1500)
    two = capacities(profile, configs, 20.0, requests=1500, workers=2)
    assert {c: p.to_dict() for c, p in one.items()} == {c: p.to_dict() for c, p in two.items()}


@pytest.mark.usefixtures("takes_seconds")
def test_a_ceiling_caps_the_search_and_costs_one_rate_where_it_passes() -> None:
    from analyzer.predict.capacity import capacities

    profile = constant(2.0, 16, per_item_ms=0.25)
    configs = [SimConfig(mbs, delay, (), 1) for mbs in (1, 4, 16) for delay in (0, 2000)]
    free = capacities(profile, configs, 20.0)
    ceiling = 0.5 * max(p.capacity_rps for p in free.values())
    capped = capacities(profile, configs, 20.0, ceiling_rps=ceiling)
    assert any(p.capacity_rps >= ceiling for p in free.values())
    assert any(p.capacity_rps < ceiling for p in free.values())
    for config in configs:
        if free[config].capacity_rps >= ceiling:
            # Passes at the ceiling: the answer is the ceiling; searched alone, from one rate.
            assert capped[config].capacity_rps == ceiling
            alone = capacity(profile, config, 20.0, ceiling_rps=ceiling)
            assert (alone.capacity_rps, len(alone.steps)) == (ceiling, 1)
        else:
            assert capped[config].capacity_rps == pytest.approx(free[config].capacity_rps, rel=0.03)
    rates = sum(len(p.steps) for p in {id(p): p for p in capped.values()}.values())
    assert rates < sum(len(p.steps) for p in {id(p): p for p in free.values()}.values())


@pytest.mark.usefixtures("takes_seconds")
def test_a_latency_offset_calibrated_on_measured_points_predicts_them() -> None:
    from dataclasses import replace

    from analyzer.predict.capacity import latency_offset

    profile = constant(2.0, 8, per_item_ms=0.25)
    configs = [SimConfig(8, 1000), SimConfig(4), SimConfig(1, dynamic_batching=False)]
    # A server measured 7 ms slower than the simulator at every operating point (network,
    # protocol, a busy generator): the offset is 7 ms, the median over the points.
    points = [(c, 150.0, simulate(profile, c, 150.0, requests=3000).p99_ms + 7.0) for c in configs]
    points.append(
        (SimConfig(8), 150.0, simulate(profile, SimConfig(8), 150.0, requests=3000).p99_ms + 50)
    )
    offset = latency_offset(profile, points)
    assert offset == pytest.approx(7.0, abs=1e-6)
    shifted = replace(profile, latency_offset_ms=offset)
    for config, rate, measured in points[:3]:
        assert simulate(shifted, config, rate, requests=3000).p99_ms == pytest.approx(measured)
    # A capacity at goal G with the offset is the capacity at G - offset without it.
    assert capacity(shifted, SimConfig(8, 1000), 20.0).capacity_rps == pytest.approx(
        capacity(profile, SimConfig(8, 1000), 13.0).capacity_rps, rel=0.03
    )
    # Points the profile cannot simulate are skipped: none left, no offset.
    assert latency_offset(profile, [(SimConfig(16), 100.0, 5.0)]) is None
    assert latency_offset(profile, [(SimConfig(4), 1e6, 5.0)]) is None  # saturated


def test_the_latency_offset_travels_with_the_profile() -> None:
    from dataclasses import replace

    from analyzer.predict.profile import Profile

    profile = replace(constant(2.0, 4), latency_offset_ms=3.5)
    assert Profile.from_dict(profile.to_dict()) == profile
    legacy = profile.to_dict()
    del legacy["latency_offset_ms"]  # a profile.json written before the offset
    assert Profile.from_dict(legacy).latency_offset_ms == 0.0


def test_the_simulator_draws_the_scenarios_arrivals() -> None:
    from analyzer.measure.arrivals import parse_arrival

    profile = constant(10.0, 1)
    config = SimConfig(1, dynamic_batching=False)
    # Poisson by name is the default stream, request for request.
    assert simulate(profile, config, 50, requests=3000) == simulate(
        profile, config, 50, requests=3000, arrival=parse_arrival("poisson")
    )
    # D/D/1 at half load: nobody ever waits.
    even = simulate(profile, config, 50, requests=3000, arrival=parse_arrival("constant"))
    assert even.p99_ms == pytest.approx(10.0) and even.mean_ms == pytest.approx(10.0)
    # On/off bursts at the same mean rate (x1.8 for 1 s, x0.2): the bursts queue at 90 % load.
    poisson = simulate(profile, config, 50, requests=6000)
    bursts = simulate(profile, config, 50, requests=6000, arrival=parse_arrival("mmpp:1.8@1,0.2@1"))
    assert bursts.p99_ms > 2 * poisson.p99_ms
    # A stream that arrived in bursts is not saturated for serving them late: its throughput
    # is compared with what arrived.
    assert not bursts.saturated
