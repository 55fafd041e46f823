"""Requests of several sizes: sizing the load's data, the probe's size classes, a profile per
size class, and the simulator's padded batches (pure: no server)."""

from __future__ import annotations

import json
import struct
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from google.protobuf import json_format
from tritonclient.grpc import model_config_pb2 as mc

from analyzer.errors import InputError
from analyzer.load.buckets import auto_buckets
from analyzer.load.inputs import DataMode, InputOptions, InputSet, TensorSpec, build_inputs
from analyzer.load.payloads import RequestSizes, binary_request, request_sizes
from analyzer.predict import ExtrapolationError, ProfileError
from analyzer.predict.capacity import capacity
from analyzer.predict.fitting import WindowSample, rescaled
from analyzer.predict.probe import _requests, probe
from analyzer.predict.probe_plan import ProbePlan, model_metadata
from analyzer.predict.profile import (
    BatchTiming,
    Profile,
    RequestKind,
    RequestMix,
    SizeClass,
    load_profile,
    save_profile,
)
from analyzer.predict.sim_records import SimConfig
from analyzer.predict.simulator import simulate

# ------------------------------------------------------------------------------ the load's data


def text_model(ragged: bool = True, datatype: int = mc.TYPE_INT64) -> mc.ModelConfig:
    """Two ``[-1]`` inputs (token ids and mask), as a text classifier has them."""
    config = mc.ModelConfig(name="textcls", backend="python", max_batch_size=8)
    for name in ("IDS", "MASK"):
        config.input.add(name=name, data_type=datatype, dims=[-1], allow_ragged_batch=ragged)
        config.output.add(name=f"{name}_OUT", data_type=datatype, dims=[-1])
    return config


def data_file(path: Path, lengths: list[int], mask_lengths: list[int] | None = None) -> Path:
    """A perf_analyzer ``--input-data`` file, one entry per length."""
    masks = mask_lengths or lengths
    entries = [
        {"IDS": list(range(1, n + 1)), "MASK": [1] * m} for n, m in zip(lengths, masks, strict=True)
    ]
    path.write_text(json.dumps({"data": entries}))
    return path


def sized(config: mc.ModelConfig, options: InputOptions) -> tuple[InputSet, RequestSizes]:
    metadata = model_metadata(config)
    document = json_format.MessageToDict(config, preserving_proto_field_name=True)
    inputs = build_inputs(metadata, document, options=options)
    return inputs, request_sizes(inputs, metadata, document)


def test_requests_of_a_data_file_are_sized_by_their_length(tmp_path: Path) -> None:
    lengths = [12, 40, 12, 300, 57]
    options = InputOptions(mode=DataMode.FILE, data_file=data_file(tmp_path / "d.json", lengths))
    _, sizes = sized(text_model(), options)
    assert sizes.sizes == tuple(lengths)
    assert sizes.items == 1 and "elements per batch item" in sizes.measure
    # Ragged inputs: any request may join any batch.
    assert set(sizes.keys) == {None}
    # Without allow_ragged_batch Triton batches equal shapes only: the key is the shapes.
    _, strict = sized(text_model(ragged=False), options)
    assert strict.keys[0] == strict.keys[2] != strict.keys[1]
    assert strict.keys[0] == (("IDS", (12,)), ("MASK", (12,)))


def test_inputs_that_do_not_grow_together_have_no_one_size(tmp_path: Path) -> None:
    path = data_file(tmp_path / "d.json", [10, 20], mask_lengths=[50, 5])
    with pytest.raises(InputError, match="do not grow together"):
        sized(text_model(), InputOptions(mode=DataMode.FILE, data_file=path))


def test_strings_are_sized_by_their_longest_element(tmp_path: Path) -> None:
    config = mc.ModelConfig(name="tok", backend="python", max_batch_size=4)
    config.input.add(name="TEXT", data_type=mc.TYPE_STRING, dims=[1])
    config.output.add(name="LABEL", data_type=mc.TYPE_INT64, dims=[1])
    path = tmp_path / "text.json"
    path.write_text(json.dumps({"data": [{"TEXT": ["hi"]}, {"TEXT": ["a longer sentence"]}]}))
    _, sizes = sized(config, InputOptions(mode=DataMode.FILE, data_file=path))
    assert sizes.sizes == (2, 17) and "bytes of the longest element" in sizes.measure


def test_fixed_shapes_are_one_size() -> None:
    config = mc.ModelConfig(name="img", backend="python", max_batch_size=8)
    config.input.add(name="INPUT0", data_type=mc.TYPE_FP32, dims=[16])
    _, sizes = sized(config, InputOptions(unique_payloads=8))
    assert set(sizes.sizes) == {0} and set(sizes.keys) == {None}


def test_a_binary_request_carries_strings_length_prefixed_and_numbers_as_bytes() -> None:
    inputs = InputSet(
        model="m",
        specs=(TensorSpec("TEXT", "BYTES", (1, 2)), TensorSpec("IDS", "INT64", (1, 3))),
        outputs=("OUT",),
        payloads=(
            {
                "TEXT": np.array([[b"ab", b"cde"]], dtype=np.object_),
                "IDS": np.array([[1, 2, 300]], dtype=np.int64),
            },
        ),
        max_batch_size=8,
        batch_size=1,
    )
    body, header_length = binary_request(inputs, 0)
    header = json.loads(body[:header_length])
    text = struct.pack("<I", 2) + b"ab" + struct.pack("<I", 3) + b"cde"
    ids = struct.pack("<3q", 1, 2, 300)
    assert header["inputs"] == [
        {
            "name": "TEXT",
            "shape": [1, 2],
            "datatype": "BYTES",
            "parameters": {"binary_data_size": len(text)},
        },
        {
            "name": "IDS",
            "shape": [1, 3],
            "datatype": "INT64",
            "parameters": {"binary_data_size": 24},
        },
    ]
    assert header["parameters"] == {"binary_data_output": True}
    assert body[header_length:] == text + ids


# ------------------------------------------------------------------------------ the probe's classes


def test_the_probe_times_the_data_at_its_quantiles_and_both_ends(tmp_path: Path) -> None:
    lengths = [12, 14, 16, 20, 24, 30, 40, 60, 90, 150, 300, 16, 20]
    options = InputOptions(mode=DataMode.FILE, data_file=data_file(tmp_path / "d.json", lengths))
    data = _requests(text_model(), options, ProbePlan(size_classes=4))
    sizes = [size for size, _ in data.classes]
    assert sizes[0] == 12 and sizes[-1] == 300 and 3 <= len(sizes) <= 4
    for size, members in data.classes:
        # Every request of a class's bursts has that size (the batch pads to it exactly).
        assert members and all(lengths[i] == size for i in members)
    assert data.mix.sizes == tuple(sorted(set(lengths)))
    assert sum(k.share for k in data.mix.kinds) == pytest.approx(1.0)
    # One length: one class, as every probe was before.
    same = InputOptions(mode=DataMode.FILE, data_file=data_file(tmp_path / "s.json", [20, 20]))
    assert [s for s, _ in _requests(text_model(), same, ProbePlan()).classes] == [20]


class _ConfigOnly:
    """A target that only has a config: the probe must refuse before sending anything."""

    model = "textcls"
    url = "http://127.0.0.1:1"

    def __init__(self, config: mc.ModelConfig) -> None:
        self.config = config

    def model_config(self) -> mc.ModelConfig:
        return self.config


def test_data_the_probe_cannot_send_or_size_is_refused_before_any_request(tmp_path: Path) -> None:
    target = _ConfigOnly(text_model())
    # A variable dim and random data without --shape: the load could not build it either.
    with pytest.raises(ProfileError, match=r"cannot send the load's request data.*--shape"):
        probe(target)  # type: ignore[arg-type]
    crossed = data_file(tmp_path / "d.json", [10, 20], mask_lengths=[50, 5])
    with pytest.raises(ProfileError, match="do not grow together"):
        probe(target, inputs=InputOptions(mode=DataMode.FILE, data_file=crossed))  # type: ignore[arg-type]


# ------------------------------------------------------------------------------ profiles


def planted_timings(size: int, batches: tuple[int, ...] = (1, 2, 4, 8)) -> tuple[BatchTiming, ...]:
    """A padded device: 1 ms + 0.05 ms per (row x token) of compute_infer, no host work."""
    return tuple(BatchTiming(b, 0.0, 1.0 + 0.05 * b * size, 0.0, 4) for b in batches)


def padded_profile(mix: RequestMix, sizes: tuple[int, ...] = (10, 100)) -> Profile:
    return Profile(
        model="textcls",
        provenance="planted",
        source="probe",
        timings=(),
        classes=tuple(SizeClass(s, planted_timings(s)) for s in sizes),
        mix=mix,
    )


HALF = RequestMix("tokens", (RequestKind(10, 0.5), RequestKind(100, 0.5)))


def test_a_batch_is_timed_at_its_padded_size_linear_in_both_dims() -> None:
    profile = padded_profile(HALF)
    assert profile.timing(4, 10).infer_ms == pytest.approx(3.0)
    assert profile.timing(4, 55).infer_ms == pytest.approx(12.0)  # halfway: 1 + 0.05*4*55
    assert profile.timing(3, 100).infer_ms == pytest.approx(16.0)  # between batch 2 and 4
    with pytest.raises(ExtrapolationError, match="request size 200"):
        profile.timing(4, 200)
    with pytest.raises(ProfileError, match="do not extrapolate"):
        padded_profile(RequestMix("tokens", (RequestKind(10, 0.5), RequestKind(300, 0.5))))


def test_the_one_table_view_is_the_mix_expectation_at_the_largest_member() -> None:
    profile = padded_profile(HALF)
    # Two requests drawn 50/50: the batch pads to 100 unless both are short (1/4).
    assert profile.timing(2).infer_ms == pytest.approx(0.25 * 2.0 + 0.75 * 11.0)
    assert profile.timing(1).infer_ms == pytest.approx(0.5 * 1.5 + 0.5 * 6.0)
    # Requests that never share a batch are timed at their own size.
    keyed = RequestMix("tokens", (RequestKind(10, 0.5, 0), RequestKind(100, 0.5, 1)))
    assert padded_profile(keyed).timing(2).infer_ms == pytest.approx(0.5 * 2.0 + 0.5 * 11.0)
    assert profile.timings[0].executions == 8  # both classes' executions


def test_profiles_round_trip_and_an_old_file_loads_as_one_class(tmp_path: Path) -> None:
    profile = padded_profile(HALF)
    path = tmp_path / "p.json"
    save_profile(profile, path)
    assert load_profile(path) == profile
    doc = json.loads(path.read_text())
    # What an older perfsweep reads of it: the expected table per batch size.
    assert doc["format_version"] == 1
    assert doc["timings"][1]["infer_ms"] == pytest.approx(profile.timing(2).infer_ms)
    # A profile written before size classes (no mix, no size_classes): one class.
    del doc["mix"], doc["size_classes"]
    path.write_text(json.dumps(doc))
    old = load_profile(path)
    assert old.classes == () and old.mix is None and old.items == 1
    assert old.timings == profile.timings


def test_rescaling_moves_every_size_class_by_the_same_factor() -> None:
    profile = padded_profile(HALF)
    # Windows that measured twice the expected device time of their batch mix.
    window = WindowSample(1, {2: 10}, 0.0, 2000.0 * profile.timing(2).infer_ms, 0.0)
    scaled = rescaled(profile, [window], "planted windows")
    for before, after in zip(profile.classes, scaled.classes, strict=True):
        assert after.timings[2].infer_ms == pytest.approx(2.0 * before.timings[2].infer_ms)
    assert scaled.timing(4).infer_ms == pytest.approx(2.0 * profile.timing(4).infer_ms)


# ------------------------------------------------------------------------------ the simulator


def test_saturated_throughput_is_the_cost_of_batches_padded_to_their_longest() -> None:
    profile = padded_profile(HALF)
    config = SimConfig(max_batch_size=4, max_queue_delay_us=100_000, preferred_batch_size=(4,))
    sim = simulate(profile, config, 400.0, requests=6000, seed=3)
    assert sim.saturated and sim.batch_sizes.keys() == {4}
    # A batch of 4 pads to 100 unless all four are short (1/16): 1/16 * 3 + 15/16 * 21 ms.
    expected_ms = 3.0 / 16 + 21.0 * 15 / 16
    assert profile.timing(4).infer_ms == pytest.approx(expected_ms)
    # The same arrivals through a device that takes exactly that per batch of 4 (a saturated
    # run's throughput also counts the backlog its warm-up left, so it is compared like this).
    flat = Profile(
        "textcls", "planted", "probe", (BatchTiming(1, 0, 1, 0), BatchTiming(4, 0, expected_ms, 0))
    )
    reference = simulate(flat, config, 400.0, requests=6000, seed=3)
    assert sim.throughput_rps == pytest.approx(reference.throughput_rps, rel=0.03)
    assert reference.throughput_rps == pytest.approx(4000.0 / expected_ms, rel=0.1)
    # Timed at the short requests' size, as a probe of length-1 inputs would, it is 6x off.
    short = padded_profile(RequestMix("tokens", (RequestKind(10, 1.0),)), sizes=(10, 100))
    assert simulate(short, config, 2000.0, requests=6000).throughput_rps > 5 * sim.throughput_rps


def test_capacity_follows_the_mix() -> None:
    config = SimConfig(max_batch_size=8, max_queue_delay_us=2000)
    mostly_short = RequestMix("tokens", (RequestKind(10, 0.9), RequestKind(100, 0.1)))
    mostly_long = RequestMix("tokens", (RequestKind(10, 0.1), RequestKind(100, 0.9)))
    short = capacity(padded_profile(mostly_short), config, 100.0).capacity_rps
    long = capacity(padded_profile(mostly_long), config, 100.0).capacity_rps
    assert short > 1.2 * long > 0


def test_requests_of_unequal_shapes_never_share_a_batch() -> None:
    config = SimConfig(max_batch_size=8, max_queue_delay_us=5000, preferred_batch_size=(8,))
    timings = planted_timings(10)

    def run(mix: RequestMix) -> float:
        profile = Profile("m", "planted", "probe", timings, mix=mix)
        sim = simulate(profile, config, 600.0, requests=4000, seed=2)
        return sum(b * n for b, n in sim.batch_sizes.items()) / sum(sim.batch_sizes.values())

    alike = run(RequestMix("tokens", (RequestKind(10, 0.5), RequestKind(11, 0.5))))
    apart = run(RequestMix("tokens", (RequestKind(10, 0.5, 0), RequestKind(11, 0.5, 1))))
    # 50/50 keys in random order: a batch ends at the first request of the other shape.
    assert apart < 0.6 * alike


def test_ragged_batches_join_any_shape_and_pad_to_the_longest() -> None:
    # Ten lengths in random order, each its own shape: without allow_ragged_batch a batch
    # ends at the first request of another shape; with it, requests of every length share one
    # batch, padded to its longest member.
    # A device whose fixed cost per execution dominates (a launch-bound transformer at small
    # batches): 10 ms + 0.01 ms per (row x token); padding then costs less than batching saves.
    kinds = tuple(RequestKind(10 + 10 * i, 0.1, i) for i in range(10))
    mix = RequestMix("tokens", kinds)
    profile = Profile(
        model="textcls",
        provenance="planted",
        source="probe",
        timings=(),
        classes=tuple(
            SizeClass(
                s, tuple(BatchTiming(b, 0.0, 10.0 + 0.01 * b * s, 0.0, 4) for b in (1, 2, 4, 8))
            )
            for s in (10, 100)
        ),
        mix=mix,
    )
    assert mix.same_shape_share() == pytest.approx(0.1)
    assert HALF.same_shape_share() is None  # ragged inputs: any request joins any batch

    def mean_batch(ragged: bool) -> float:
        config = SimConfig(
            max_batch_size=8,
            max_queue_delay_us=5000,
            preferred_batch_size=(8,),
            ragged_batch=ragged,
        )
        sim = simulate(profile, config, 90.0, requests=3000, seed=2)
        return sum(b * n for b, n in sim.batch_sizes.items()) / sum(sim.batch_sizes.values())

    strict, ragged = mean_batch(False), mean_batch(True)
    assert strict < 1.2 and ragged > strict + 0.3
    config = SimConfig(max_batch_size=8, max_queue_delay_us=5000, ragged_batch=True)
    assert capacity(profile, config, 200.0).capacity_rps > 1.5 * (
        capacity(profile, replace(config, ragged_batch=False), 200.0).capacity_rps
    )


def test_a_one_size_mix_simulates_exactly_as_a_profile_without_one() -> None:
    timings = planted_timings(10)
    plain = Profile("m", "planted", "probe", timings, jitter=0.05)
    mixed = Profile(
        "m",
        "planted",
        "probe",
        timings,
        jitter=0.05,
        mix=RequestMix("none", (RequestKind(0, 1.0),)),
    )
    config = SimConfig(max_batch_size=8, max_queue_delay_us=1000, instance_count=2)
    assert simulate(plain, config, 500.0, requests=3000) == simulate(
        mixed, config, 500.0, requests=3000
    )


def test_requests_of_several_items_batch_in_multiples_of_them() -> None:
    profile = Profile(
        "m",
        "planted",
        "probe",
        planted_timings(10, batches=(2, 4, 8)),
        mix=RequestMix("none", (RequestKind(0, 1.0),), items=2),
    )
    sim = simulate(profile, SimConfig(max_batch_size=8, max_queue_delay_us=2000), 300.0)
    assert sim.batch_sizes and all(b % 2 == 0 for b in sim.batch_sizes)
    # Without dynamic batching every request is its own execution of 2 items.
    alone = simulate(profile, SimConfig(max_batch_size=8, dynamic_batching=False), 50.0)
    assert alone.batch_sizes.keys() == {2}
    with pytest.raises(ExtrapolationError, match="cannot hold one request"):
        profile.check_covers(1)


# ------------------------------------------------------------------------------ length buckets


def test_auto_buckets_sit_at_the_quartiles_of_the_lengths_rounded_up_to_eight() -> None:
    assert auto_buckets([12, 40, 12, 300, 57, 33, 20, 90]) == (16, 40, 64, 304)
    assert auto_buckets([5]) == (8,)


def test_padding_to_buckets_sends_a_few_shapes_and_the_profile_keys_them(tmp_path: Path) -> None:
    lengths = [12, 40, 12, 300, 57, 33, 20, 90]
    path = data_file(tmp_path / "d.json", lengths)
    options = InputOptions(
        mode=DataMode.FILE,
        data_file=path,
        pad_buckets=(32, 64, 320),
        pad_values={"IDS": 0, "MASK": 0},
    )
    inputs, sizes = sized(text_model(ragged=False), options)
    assert "padded to length buckets 32,64,320" in inputs.source
    # Each request at its bucket, the padding filled with the input's pad value.
    assert [p["IDS"].shape for p in inputs.payloads] == [
        (1, 32),
        (1, 64),
        (1, 32),
        (1, 320),
        (1, 64),
        (1, 64),
        (1, 32),
        (1, 320),
    ]
    first = inputs.payloads[0]["IDS"][0]
    assert first[:12].tolist() == list(range(1, 13)) and not first[12:].any()
    # The simulator sees three sizes, each its own batching key (a bucket shares a shape).
    assert sorted(set(sizes.sizes)) == [32, 64, 320] and len(set(sizes.keys)) == 3
    mix = RequestMix.of(sizes.measure, sizes.sizes, sizes.keys)
    assert mix.same_shape_share() == pytest.approx((3 / 8) ** 2 + (3 / 8) ** 2 + (2 / 8) ** 2)


def test_padding_refuses_what_a_client_could_not_send(tmp_path: Path) -> None:
    path = data_file(tmp_path / "d.json", [12, 300])
    with pytest.raises(InputError, match="300 long, above the largest bucket 64"):
        sized(
            text_model(ragged=False),
            InputOptions(
                mode=DataMode.FILE,
                data_file=path,
                pad_buckets=(64,),
                pad_values={"IDS": 0, "MASK": 0},
            ),
        )
    with pytest.raises(InputError, match="pad value for every variable input: add MASK=<value>"):
        sized(
            text_model(ragged=False),
            InputOptions(
                mode=DataMode.FILE, data_file=path, pad_buckets="auto", pad_values={"IDS": 0}
            ),
        )
    config = mc.ModelConfig(name="img", backend="python", max_batch_size=8)
    config.input.add(name="INPUT0", data_type=mc.TYPE_FP32, dims=[16])
    with pytest.raises(InputError, match="no input with a variable dimension"):
        sized(config, InputOptions(pad_buckets="auto", pad_values={}))
