"""perf_analyzer's ``--input-data`` forms, random data per dtype, and the payload rotation (pure).

The JSON documents below are perf_analyzer's own examples (``docs/input_data.md``); each test
checks the request shapes perf_analyzer would send for them.
"""

from __future__ import annotations

import base64
import json
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import triton_to_np_dtype

from analyzer.errors import InputError
from analyzer.load.data_file import MAX_ELEMENTS
from analyzer.load.inputs import (
    DEFAULT_ROTATION,
    DataMode,
    InputOptions,
    ShapeChoice,
    build_inputs,
)
from analyzer.load.inputs import _digest as digest
from tests.server.conftest import DATATYPES

ONES16 = [1] * 16


def _meta(*inputs: tuple[str, str, list[int]], outputs: Any = ()) -> dict[str, Any]:
    return {
        "name": "m",
        "inputs": [{"name": n, "datatype": d, "shape": s} for n, d, s in inputs],
        "outputs": [{"name": n, "datatype": d, "shape": s} for n, d, s in outputs],
    }


def _file(tmp_path: Path, doc: Any, name: str = "data.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(doc))
    return path


def _from_file(meta: dict[str, Any], path: Path, max_batch_size: int = 0, **kw: Any) -> Any:
    return build_inputs(
        meta, {"max_batch_size": max_batch_size}, DataMode.FILE, data_file=path, **kw
    )


# -- perf_analyzer's documented forms ------------------------------------------------------------


def test_docs_flat_lists_are_reshaped_to_the_model_dims(tmp_path: Path) -> None:
    # docs: INPUT0/INPUT1, shape [4, 4], INT32, four entries of 16 flattened values
    entry = {"INPUT0": ONES16, "INPUT1": ONES16}
    path = _file(tmp_path, {"data": [entry] * 4})
    meta = _meta(("INPUT0", "INT32", [4, 4]), ("INPUT1", "INT32", [4, 4]))
    inputs = _from_file(meta, path)
    assert len(inputs.payloads) == 4 and inputs.unique_count == 4
    assert all(
        p["INPUT0"].shape == (4, 4) and p["INPUT0"].dtype == np.int32 for p in inputs.payloads
    )
    # a batching model: one entry is one batch item, the batch dim comes in front
    batched = _from_file(
        _meta(("INPUT0", "INT32", [-1, 4, 4]), ("INPUT1", "INT32", [-1, 4, 4])), path, 8
    )
    assert batched.payloads[0]["INPUT1"].shape == (1, 4, 4)
    assert [s.shape for s in batched.specs] == [(1, 4, 4), (1, 4, 4)]


def test_flat_list_for_a_3x4_input_is_sent_as_1x3x4_not_1x12(tmp_path: Path) -> None:
    path = _file(tmp_path, {"data": [{"X": list(range(12))}]})
    inputs = _from_file(_meta(("X", "FP32", [-1, 3, 4])), path, 4)
    assert inputs.payloads[0]["X"].shape == (1, 3, 4)
    assert inputs.payloads[0]["X"][0, 2, 3] == 11.0
    nested = _file(
        tmp_path, {"data": [{"X": [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]}]}, "n.json"
    )
    assert np.array_equal(
        _from_file(_meta(("X", "FP32", [-1, 3, 4])), nested, 4).payloads[0]["X"],
        inputs.payloads[0]["X"],
    )


def test_flat_list_with_a_variable_dim_takes_shape_from_the_flag(tmp_path: Path) -> None:
    path = _file(tmp_path, {"data": [{"X": list(range(12))}]})
    meta = _meta(("X", "INT64", [-1, -1, 4]))
    assert _from_file(meta, path, 8, shapes={"X": [3, 4]}).payloads[0]["X"].shape == (1, 3, 4)
    # one free dim: the number of values decides it
    assert _from_file(meta, path, 8).payloads[0]["X"].shape == (1, 3, 4)
    with pytest.raises(InputError, match="--shape X"):
        _from_file(_meta(("X", "INT64", [-1, -1, -1])), path, 8)


def test_docs_b64_entries_are_the_tensor_bytes(tmp_path: Path) -> None:
    # docs: {"b64": "YmFzZTY0IGRlY29kZXI="} ("base64 decoder", 14 bytes) for both inputs
    entry = {"INPUT0": {"b64": "YmFzZTY0IGRlY29kZXI="}, "INPUT1": {"b64": "YmFzZTY0IGRlY29kZXI="}}
    path = _file(tmp_path, {"data": [entry] * 3})
    inputs = _from_file(_meta(("INPUT0", "UINT8", [14]), ("INPUT1", "INT8", [-1, 14])), path, 0)
    assert len(inputs.payloads) == 3
    assert inputs.payloads[0]["INPUT0"].tobytes() == b"base64 decoder"
    assert inputs.payloads[0]["INPUT1"].shape == (1, 14)  # one free dim: the byte count decides


def test_b64_little_endian_values_and_dtype_from_the_model(tmp_path: Path) -> None:
    values = np.array([1.5, -2.0, 3.25], dtype="<f4")
    b64 = base64.b64encode(values.tobytes()).decode()
    path = _file(tmp_path, {"data": [{"X": {"b64": b64}}]})
    inputs = _from_file(_meta(("X", "FP32", [-1, 3])), path, 2)
    assert inputs.payloads[0]["X"].tolist() == [[1.5, -2.0, 3.25]]
    with pytest.raises(InputError, match=r"has 12 bytes; shape \[6\] needs 48"):
        _from_file(_meta(("X", "FP64", [6])), path)


def test_docs_streams_stay_ordered_streams(tmp_path: Path) -> None:
    # docs: three streams of lengths 4, 3 and 2 for a sequence model, INPUT [1] STRING
    streams = [
        [{"INPUT": ["1"]}, {"INPUT": ["2"]}, {"INPUT": ["3"]}, {"INPUT": ["4"]}],
        [{"INPUT": ["1"]}, {"INPUT": ["1"]}, {"INPUT": ["1"]}],
        [{"INPUT": ["1"]}, {"INPUT": ["1"]}],
    ]
    path = _file(tmp_path, {"data": streams})
    inputs = _from_file(_meta(("INPUT", "BYTES", [-1, 1])), path, 8)
    assert [len(s) for s in inputs.streams] == [4, 3, 2]
    assert [p["INPUT"].tolist() for p in inputs.streams[0]] == [
        [[b"1"]],
        [[b"2"]],
        [[b"3"]],
        [[b"4"]],
    ]
    assert len(inputs.payloads) == 9  # every step, stream after stream
    with pytest.raises(InputError, match="--batch-size 1"):
        _from_file(_meta(("INPUT", "BYTES", [-1, 1])), path, 8, batch_size=2)


def test_docs_content_and_shape_for_variable_dims(tmp_path: Path) -> None:
    # docs: INPUT [-1, -1] INT32; shapes [2,8], [8,2], none (the --shape default), [4,4]
    data = [
        {"INPUT": {"content": ONES16, "shape": [2, 8]}},
        {"INPUT": {"content": ONES16, "shape": [8, 2]}},
        {"INPUT": {"content": ONES16}},
        {"INPUT": {"content": ONES16, "shape": [4, 4]}},
    ]
    path = _file(tmp_path, {"data": data})
    inputs = _from_file(_meta(("INPUT", "INT32", [-1, -1])), path, shapes={"INPUT": [4, 4]})
    assert [p["INPUT"].shape for p in inputs.payloads] == [(2, 8), (8, 2), (4, 4), (4, 4)]
    # without --shape, the first entry's shape is the default
    assert _from_file(_meta(("INPUT", "INT32", [-1, -1])), path).payloads[2]["INPUT"].shape == (
        2,
        8,
    )
    with pytest.raises(
        InputError, match=r"entry 0: input 'INPUT' has shape \[2, 8\], incompatible"
    ):
        _from_file(_meta(("INPUT", "INT32", [4, 4])), path)


def test_docs_content_b64_with_shape(tmp_path: Path) -> None:
    # docs: {"content": {"b64": "/9j/4AAQSkZ(...)"}, "shape": [7964]}: a 7964-byte JPEG
    jpeg = b"\xff\xd8\xff\xe0\x00\x10JFIF" + bytes(range(256)) * 31 + b"\x00" * (7964 - 10 - 7936)
    assert len(jpeg) == 7964
    content = {"content": {"b64": base64.b64encode(jpeg).decode()}, "shape": [7964]}
    path = _file(tmp_path, {"data": [{"INPUT": content}, {"INPUT": content}]})
    inputs = _from_file(_meta(("INPUT", "UINT8", [-1, -1])), path, 4)
    assert [p["INPUT"].shape for p in inputs.payloads] == [(1, 7964), (1, 7964)]
    assert inputs.payloads[1]["INPUT"].tobytes() == jpeg


def test_docs_validation_data_is_kept_aligned(tmp_path: Path) -> None:
    doc = {
        "data": [{"INPUT0": ONES16, "INPUT1": ONES16}],
        "validation_data": [{"OUTPUT0": [0] * 16, "OUTPUT1": [2] * 16}],
    }
    meta = _meta(
        ("INPUT0", "INT32", [4, 4]),
        ("INPUT1", "INT32", [4, 4]),
        outputs=[("OUTPUT0", "INT32", [4, 4]), ("OUTPUT1", "INT32", [4, 4])],
    )
    inputs = _from_file(meta, _file(tmp_path, doc))
    assert len(inputs.expected) == len(inputs.payloads) == 1
    assert (
        inputs.expected[0]["OUTPUT1"].shape == (4, 4) and inputs.expected[0]["OUTPUT1"].max() == 2
    )
    doc["validation_data"] = doc["validation_data"] * 2
    with pytest.raises(InputError, match="does not align"):
        _from_file(meta, _file(tmp_path, doc, "bad.json"))


def test_bytes_as_strings_and_as_length_prefixed_b64(tmp_path: Path) -> None:
    serialised = b"".join(len(s).to_bytes(4, "little") + s for s in (b"hello", b"", b"w"))
    doc = {
        "data": [
            {"T": ["hello", "", "w"]},
            {"T": {"b64": base64.b64encode(serialised).decode()}},
        ]
    }
    inputs = _from_file(_meta(("T", "BYTES", [-1, 3])), _file(tmp_path, doc), 4)
    assert [p["T"].tolist() for p in inputs.payloads] == [[[b"hello", b"", b"w"]]] * 2


def test_an_entry_may_name_the_model_as_perf_analyzer_allows(tmp_path: Path) -> None:
    path = _file(tmp_path, {"data": [{"model": "m", "X": [1, 2]}]})
    assert _from_file(_meta(("X", "INT32", [2])), path).payloads[0]["X"].tolist() == [1, 2]


def test_entries_rotate_in_order_and_a_batch_takes_consecutive_entries(tmp_path: Path) -> None:
    path = _file(tmp_path, {"data": [{"X": [i, i]} for i in range(3)]})
    meta = _meta(("X", "INT32", [-1, 2]))
    inputs = _from_file(meta, path, 8, batch_size=2)
    # perf_analyzer: request k carries entries 2k, 2k+1 (mod 3): 0 1 | 2 0 | 1 2
    assert [p["X"][:, 0].tolist() for p in inputs.payloads] == [[0, 1], [2, 0], [1, 2]]
    mixed = _file(
        tmp_path,
        {
            "data": [
                {"X": {"content": [1, 2], "shape": [2]}},
                {"X": {"content": [1, 2, 3], "shape": [3]}},
            ]
        },
        "m.json",
    )
    with pytest.raises(InputError, match="shapes differ"):
        _from_file(_meta(("X", "INT32", [-1, -1])), mixed, 8, batch_size=2)


def test_npz_leading_axis_is_the_entry(tmp_path: Path) -> None:
    path = tmp_path / "d.npz"
    np.savez(
        path,
        X=np.arange(30, dtype=np.float32).reshape(5, 2, 3),
        T=np.array([[b"a"], [b"b"], [b"c"], [b"d"], [b"e"]]),
    )
    inputs = _from_file(_meta(("X", "FP32", [-1, 2, 3]), ("T", "BYTES", [-1, 1])), path, 4)
    assert len(inputs.payloads) == 5
    assert inputs.payloads[4]["X"].shape == (1, 2, 3) and inputs.payloads[4]["X"][0, 1, 2] == 29.0
    assert inputs.payloads[1]["T"].tolist() == [[b"b"]]


def test_directory_of_raw_files(tmp_path: Path) -> None:
    folder = tmp_path / "data"
    folder.mkdir()
    (folder / "X").write_bytes(np.arange(6, dtype="<i8").tobytes())
    (folder / "T").write_text("first line\nsecond\n")
    (folder / "OUT").write_bytes(b"\x00" * 4)  # an output file: expected data, not an input
    meta = _meta(
        ("X", "INT64", [-1, 6]), ("T", "BYTES", [-1, 2]), outputs=[("OUT", "INT32", [-1, 1])]
    )
    inputs = _from_file(meta, folder, 4, batch_size=2)
    assert inputs.payloads[0]["X"].shape == (2, 6) and inputs.payloads[0]["X"][1, 5] == 5
    assert inputs.payloads[0]["T"].tolist() == [[b"first line", b"second"]] * 2
    (folder / "stray").write_bytes(b"x")
    with pytest.raises(InputError, match=r"\['stray'\] are not inputs"):
        _from_file(meta, folder, 4)


# -- random data per dtype -----------------------------------------------------------------------


def test_bool_random_data_is_about_half_true() -> None:
    inputs = build_inputs(_meta(("B", "BOOL", [-1, 64])), {"max_batch_size": 8}, unique_payloads=64)
    values = np.concatenate([p["B"].ravel() for p in inputs.payloads])
    assert values.dtype == np.bool_ and 0.45 < values.mean() < 0.55


@pytest.mark.parametrize("datatype", DATATYPES)
def test_every_dtype_gets_data_tritonclient_sends_and_reads_back(datatype: str) -> None:
    inputs = build_inputs(_meta(("X", datatype, [-1, 8])), {"max_batch_size": 4}, unique_payloads=2)
    array = inputs.payloads[0]["X"]
    assert array.shape == (1, 8)
    if datatype != "BYTES":
        assert array.dtype == np.dtype(triton_to_np_dtype(datatype))
        assert len(np.unique(array.astype(np.float64))) > 1  # not a constant
    if datatype in ("FP16", "BF16"):
        # HTTP binary and gRPC raw contents: the bytes tritonclient sends decode to the array
        http = httpclient.InferInput("X", [1, 8], datatype)
        http.set_data_from_numpy(array, binary_data=True)
        grpc = grpcclient.InferInput("X", [1, 8], datatype)
        grpc.set_data_from_numpy(array)
        sent = http._get_binary_data()
        assert sent == array.tobytes() and len(sent) == 16
        back = np.frombuffer(sent, dtype=triton_to_np_dtype(datatype)).reshape(1, 8)
        assert np.array_equal(back.astype(np.float32), array.astype(np.float32))
        assert grpc._get_content() == sent
    if datatype.startswith(("INT", "UINT")):
        assert array.min() >= 0 and array.max() < (256 if datatype == "UINT8" else 64)


# -- the rotation: unique payloads, repeats, distribution ----------------------------------------

META_F = _meta(("X", "FP32", [-1, 4]))


def test_default_rotation_has_no_repeat_and_unique_payloads_counts() -> None:
    inputs = build_inputs(META_F, {"max_batch_size": 8})
    assert len(inputs.payloads) == inputs.unique_count == DEFAULT_ROTATION
    assert len({digest(p) for p in inputs.payloads}) == DEFAULT_ROTATION
    few = build_inputs(META_F, {"max_batch_size": 8}, unique_payloads=10)
    assert len({digest(p) for p in few.payloads}) == 10 == len(few.payloads)
    # a tiny input space cannot hold more distinct payloads than it has
    tiny = build_inputs(_meta(("B", "BOOL", [1])), {"max_batch_size": 0}, unique_payloads=10)
    assert tiny.unique_count == 2 and "2 unique payloads" in tiny.source


def test_default_rotation_shrinks_for_large_inputs() -> None:
    big = build_inputs(_meta(("X", "FP32", [-1, 3, 224, 224])), {"max_batch_size": 8}, batch_size=8)
    assert 4 <= big.unique_count <= 64 * 2**20 // (8 * 3 * 224 * 224 * 4)


@pytest.mark.parametrize("ratio", [0.25, 0.5, 0.9])
def test_repeat_ratio_is_the_share_of_requests_that_repeat(ratio: float) -> None:
    inputs = build_inputs(
        META_F, {"max_batch_size": 8}, unique_payloads=200, repeat_ratio=ratio, seed=3
    )
    seen: set[bytes] = set()
    repeats = 0
    for payload in inputs.payloads:
        d = digest(payload)
        repeats += d in seen
        seen.add(d)
    assert len(seen) == inputs.unique_count == 200
    assert repeats / len(inputs.payloads) == pytest.approx(ratio, abs=1 / len(inputs.payloads))


def test_distribution_draws_shapes_by_weight_seeded() -> None:
    meta = _meta(("IDS", "INT64", [-1, -1]), ("MASK", "INT64", [-1, -1]))
    mix = (
        ShapeChoice.of({"IDS": [16], "MASK": [16]}, 3),
        ShapeChoice.of({"IDS": [128], "MASK": [128]}, 1),
    )
    inputs = build_inputs(
        meta, {"max_batch_size": 8}, unique_payloads=4000, distribution=mix, seed=5
    )
    counts = Counter(p["IDS"].shape for p in inputs.payloads)
    assert set(counts) == {(1, 16), (1, 128)}
    assert counts[(1, 16)] / 4000 == pytest.approx(0.75, abs=0.03)
    assert all(p["IDS"].shape == p["MASK"].shape for p in inputs.payloads)
    again = build_inputs(
        meta, {"max_batch_size": 8}, unique_payloads=4000, distribution=mix, seed=5
    )
    assert [p["IDS"].shape for p in again.payloads] == [p["IDS"].shape for p in inputs.payloads]


def test_options_cross_processes_and_refuse_nonsense(tmp_path: Path) -> None:
    options = InputOptions(
        batch_size=2,
        shapes={"X": [4]},
        unique_payloads=7,
        repeat_ratio=0.5,
        distribution=(ShapeChoice.of({"X": [4]}, 2.0),),
        seed=9,
    )
    assert InputOptions.from_dict(json.loads(json.dumps(options.to_dict()))) == options
    inputs = build_inputs(_meta(("X", "FP32", [-1, -1])), {"max_batch_size": 8}, options=options)
    assert inputs.unique_count == 7 and len(inputs.payloads) == 14
    for bad, message in [
        ({"repeat_ratio": 1.0}, "repeat ratio"),
        ({"unique_payloads": 0}, "unique payloads"),
        ({"mode": DataMode.ZEROS, "unique_payloads": 3}, "apply to random data"),
        ({"mode": DataMode.FILE}, "needs a path"),
        ({"distribution": (ShapeChoice.of({"X": [1]}, 0),)}, "weights"),
    ]:
        with pytest.raises(InputError, match=message):
            InputOptions(**bad)
    with pytest.raises(InputError, match="elements per request"):
        build_inputs(_meta(("X", "FP32", [-1, -1])), {"max_batch_size": 8}, shapes={"X": [2**30]})
    with pytest.raises(InputError, match="MiB"):
        build_inputs(
            _meta(("X", "FP32", [-1, 1024, 1024])), {"max_batch_size": 1}, unique_payloads=1000
        )


# -- hostile files: each error names the file, the entry and the input ---------------------------

HOSTILE = [
    ({"data": [{"X": ["a", "b", "c", "d"]}]}, "input 'X' is INT32 but holds strings"),
    ({"data": [{"X": [1, 2, 3]}]}, r"input 'X' \(INT32\) has 3 values; shape \[4\] needs 4"),
    ({"data": [{"X": [1.5, 2, 3, 4]}]}, "input 'X' values do not fit INT32"),
    ({"data": [{"X": [1, 2, 3, 2**40]}]}, "input 'X' values do not fit INT32"),
    ({"data": [{"X": {"b64": "not base64!!"}}]}, "input 'X' has invalid base64"),
    ({"data": [{"X": {"b64": 12}}]}, "input 'X' has \"b64\": 12; expected a base64 string"),
    ({"data": [{"X": [1, 2, 3, 4]}, {}]}, r"entry 1: lacks inputs \['X'\]"),
    ({"data": [{"X": [1, 2, 3, 4], "Y": [1]}]}, r"entry 0: \['Y'\] are not inputs"),
    ({"data": [{"X": {"content": [1], "shape": [2**20, 2**20]}}]}, f"at most {MAX_ELEMENTS}"),
    ({"data": [{"X": {"content": [1], "shape": [-4]}}]}, "dims must be >= 0"),
    ({"data": [{"X": {"shape": [4]}}]}, 'neither "content" nor "b64"'),
    ({"data": [{"X": {"content": "1234"}}]}, "expected a list"),
    ({"data": [{"X": [1, 2, 3, 4]}, [{"X": [1, 2, 3, 4]}]]}, "mixes entries"),
    ({"data": []}, "non-empty list"),
    ({"data": [5]}, "entry 0 is int"),
    ({"data": [{"X": [[1, 2], [3, {"a": 1}]]}]}, "input 'X' holds dict"),
    ({"values": []}, 'expected {"data"'),
    # perf_analyzer's loader has no per-entry "parameters": any key but "model" must be an input
    ({"data": [{"X": [1, 2, 3, 4], "parameters": {"p": 1}}]}, r"\['parameters'\] are not inputs"),
]


@pytest.mark.parametrize(("doc", "message"), HOSTILE)
def test_hostile_json_files_say_what_is_wrong(tmp_path: Path, doc: Any, message: str) -> None:
    path = _file(tmp_path, doc, "hostile.json")
    with pytest.raises(InputError, match=message) as caught:
        _from_file(_meta(("X", "INT32", [-1, 4])), path, 8)
    assert str(path) in str(caught.value)


def test_hostile_bytes_b64_and_unreadable_files(tmp_path: Path) -> None:
    short = base64.b64encode((100).to_bytes(4, "little") + b"abc").decode()
    path = _file(tmp_path, {"data": [{"T": {"b64": short}}]})
    with pytest.raises(
        InputError, match=r"entry 0: input 'T' \(BYTES\): b64 element at byte 0 claims 100 bytes"
    ):
        _from_file(_meta(("T", "BYTES", [1])), path)
    garbage = tmp_path / "g.json"
    garbage.write_text("{not json")
    with pytest.raises(InputError, match="not valid JSON"):
        _from_file(_meta(("T", "BYTES", [1])), garbage)
    deep = tmp_path / "deep.json"
    deep.write_text('{"data": [{"T": ' + "[" * 100_000 + "]" * 100_000 + "}]}")
    with pytest.raises(InputError, match="deep"):
        _from_file(_meta(("T", "BYTES", [1])), deep)
    with pytest.raises(InputError, match="does not exist"):
        _from_file(_meta(("T", "BYTES", [1])), tmp_path / "missing.json")
    npz = tmp_path / "bad.npz"
    np.savez(npz, T=np.zeros((2, 3, 4)))
    with pytest.raises(InputError, match=r"array 'T' has shape \[2, 3, 4\]"):
        _from_file(_meta(("T", "FP32", [-1, 4])), npz, 8)
