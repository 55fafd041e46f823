"""Predictions that respect a shared device, on a planted profile with a known device time.

The planted model: a Python-backend text model whose ``compute_infer`` holds both its host work
(1 ms per request of the batch, which overlaps across instances) and its device work
(``0.5 + 0.03 x tokens x batch`` ms, which the instances' one device serialises). The
interference probe measured, at batch 4 and the data's median size (100 tokens), the serialised
share of that execution and the host work it implies (4 ms): taken as a constant at batch 1 it
would erase most of the device's time and predict more than twice what the device can serve;
taken per request (1 ms at batch 1) it is the planted model's own.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from analyzer.predict.capacity import capacity
from analyzer.predict.profile import BatchTiming, Profile, RequestKind, RequestMix, SizeClass
from analyzer.predict.sim_records import SimConfig

BATCHES = (1, 2, 4, 8)
SIZES = (12, 100, 200)
IO_MS = 0.1  # compute_input and compute_output each


def host_ms(batch: int) -> float:
    return 1.0 * batch


def device_ms(batch: int, tokens: int) -> float:
    return 0.5 + 0.03 * tokens * batch


def timings(tokens: int) -> tuple[BatchTiming, ...]:
    return tuple(
        BatchTiming(b, IO_MS, host_ms(b) + device_ms(b, tokens), IO_MS, 100) for b in BATCHES
    )


#: Every request its own shape (different lengths never share a batch), 12 tokens most often.
MIX = RequestMix(
    "tokens", (RequestKind(12, 0.4, 0), RequestKind(100, 0.3, 1), RequestKind(200, 0.3, 2))
)


def true_serial_rps(largest: int) -> float:
    """The planted device's serial throughput at the data's sizes: the best batch size's
    requests per second of device time alone (keyed: a batch holds one size)."""
    return max(
        1000.0 * b / sum(k.share * device_ms(b, k.size) for k in MIX.kinds)
        for b in range(1, largest + 1)
        if b in BATCHES
    )


def shared_profile(per_request: bool) -> Profile:
    ref = BatchTiming(4, IO_MS, host_ms(4) + device_ms(4, 100), IO_MS)
    share = device_ms(4, 100) / ref.total_ms
    overlap = ref.infer_ms - share * ref.total_ms  # what the probe's Overlap computes
    assert overlap == pytest.approx(4.0)
    return Profile(
        model="textcls",
        provenance="planted: host 1 ms per request, device 0.5 + 0.03 x tokens x batch ms",
        source="probe",
        timings=(),
        classes=tuple(SizeClass(s, timings(s)) for s in SIZES),
        mix=MIX,
        interference={4: 1.0 + share * 3 / 2},
        overlap_ms=overlap,
        serial_share=share,
        overlap_batch=4 if per_request else None,
    )


PLAIN = SimConfig(max_batch_size=1, dynamic_batching=False, instance_count=4)
BATCHED = SimConfig(max_batch_size=8, max_queue_delay_us=2_000, instance_count=4)


@pytest.mark.parametrize("config", [PLAIN, BATCHED], ids=["no batching", "batches of 8"])
def test_instances_sharing_a_device_are_never_predicted_above_its_serial_throughput(
    config: SimConfig,
) -> None:
    profile = shared_profile(per_request=True)
    assert profile.shares_device
    largest = config.largest_items()
    bound = profile.device_rps(largest)
    assert bound is not None
    # The profile's bound is the planted device's.
    truth = true_serial_rps(largest)
    assert bound == pytest.approx(truth, rel=1e-6)
    predicted = capacity(profile, config, p99_ms=500.0, requests=3000, seed=3).capacity_rps
    assert 0.7 * truth < predicted <= bound
    assert profile.peak_rps(largest, config.instance_count) <= bound
    # The overlap taken as a constant, whatever the batch: the same profile predicts well
    # above what the device can serve (the failure this guards against).
    constant = shared_profile(per_request=False)
    loose = constant.device_rps(largest)
    assert loose is not None and loose > 1.3 * truth
    unbound = capacity(constant, config, p99_ms=500.0, requests=3000, seed=3).capacity_rps
    assert unbound > 1.2 * truth


def test_host_work_still_overlaps_across_instances() -> None:
    # Batches of 8 at one instance: the host work (8 ms a batch) runs beside the device's, so
    # more instances serve more, up to the device's bound.
    profile = shared_profile(per_request=True)
    one = capacity(profile, replace(BATCHED, instance_count=1), p99_ms=500.0, seed=3)
    four = capacity(profile, BATCHED, p99_ms=500.0, seed=3)
    bound = profile.device_rps(8)
    assert bound is not None
    assert one.capacity_rps * 1.05 < four.capacity_rps <= bound


def test_a_one_size_profile_is_predicted_as_before() -> None:
    # One request size: the overlap was measured at the data's own size; the share changes
    # nothing, and the bound is the simulator's own.
    base = Profile(
        model="m",
        provenance="planted",
        source="probe",
        timings=timings(100),
        interference={4: 1.5},
        overlap_ms=4.0,
    )
    shared = replace(base, serial_share=0.7, overlap_batch=4)
    for config in (PLAIN, BATCHED):
        largest = config.largest_items()
        assert shared.table(largest) == base.table(largest)
        assert shared.peak_rps(largest, 4) == base.peak_rps(largest, 4)
        a = capacity(base, config, p99_ms=100.0, seed=1).capacity_rps
        b = capacity(shared, config, p99_ms=100.0, seed=1).capacity_rps
        assert a == b


def test_the_share_round_trips_and_older_profiles_read_as_not_measured() -> None:
    profile = shared_profile(per_request=True)
    back = Profile.from_dict(profile.to_dict())
    assert back.serial_share == profile.serial_share and back.shares_device
    assert back.overlap_batch == 4 and back == profile
    old = profile.to_dict()
    del old["serial_share"], old["overlap_batch"]
    older = Profile.from_dict(old)
    assert older.serial_share is None and older.overlap_batch is None
    assert not older.shares_device and older.device_rps(8) is None
