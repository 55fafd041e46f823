"""perf_analyzer's ``--input-data`` sources, read and checked against a model's inputs.

Pure numpy: no gevent, no sockets. Three sources, as perf_analyzer takes them:

* a JSON file ``{"data": [...], "validation_data": [...]}`` whose ``data`` is either a list of
  entries (one stream; requests rotate through them in order) or a list of streams, each a list
  of entries (sequence models: one stream per sequence). An entry maps each input name to

  - a list of values, flat or nested, row-major, for ONE batch item: reshaped to the model's
    dims, whose ``-1`` come from ``--shape``;
  - ``{"content": [...], "shape": [...]}``: the values and the item's shape (overrides
    ``--shape``); ``content`` may also be ``{"b64": "..."}``;
  - ``{"b64": "..."}`` (optionally with ``"shape"``): the tensor's raw little-endian bytes, the
    dtype the model's; for BYTES, each element as a 4-byte little-endian length and its bytes.

  BYTES values are JSON strings. ``validation_data`` has the same form and aligns with ``data``
  (expected outputs). An entry may also carry ``"model"`` (perf_analyzer ignores it too); any
  other key that is not a model input is refused, as perf_analyzer refuses it.
* a ``.npz`` file: one array per input whose leading axis is the entry (``X[i]`` = entry ``i``).
* a directory with one file per input, named as the input: its raw bytes for one batch item,
  or, for BYTES, one element per text line (perf_analyzer's directory form; one entry). Files
  named after outputs are the expected outputs; anything else is refused.

``read_data_file`` reads the source without the model; ``resolve`` checks every tensor against
the model's inputs and returns numpy arrays of one batch item each. Every problem is an
``InputError`` that names the file, the entry and the tensor, and says what was expected.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from tritonclient.utils import triton_to_np_dtype

from analyzer.errors import InputError

#: Most elements one tensor of a data file may declare (a hostile ``shape`` stops here, not in
#: a multi-gigabyte allocation): 2**28 elements, 1 GiB of FP32.
MAX_ELEMENTS = 2**28
#: Keys of an entry that are not tensors and are ignored (perf_analyzer allows ``model``).
IGNORED_KEYS = frozenset({"model"})


@dataclass(frozen=True)
class RawTensor:
    """One tensor of one entry as the file states it, before the model's dims and dtype apply.

    Exactly one of ``values`` (JSON numbers/strings/bools, flattened row-major), ``raw`` (bytes:
    b64, a directory file), ``array`` (an ``.npz`` slice) or ``error`` (unusable) is set.
    """

    values: tuple[Any, ...] | None = None
    raw: bytes | None = None
    array: np.ndarray | None = None
    #: The batch item's shape as the file gives it (``"shape"``, or an ``.npz`` slice's shape).
    shape: tuple[int, ...] | None = None
    #: A directory file: BYTES are text lines, not length-prefixed elements.
    text_lines: bool = False
    #: Why the file's value is unusable; raised once the name is known to be a model input
    #: (an unknown name is reported as unknown first, as perf_analyzer does).
    error: str | None = None


#: One entry (one request's batch item): tensor name -> its data.
Entry = Mapping[str, RawTensor]


@dataclass(frozen=True)
class DataFile:
    """A data source as read, before the model is known.

    Attributes:
        path: The file or directory.
        streams: Each stream's entries, in order. A flat ``data`` list is one stream.
        sequences: ``data`` was a list of streams (perf_analyzer's sequence form).
        validation: Expected outputs, aligned with ``streams`` (empty: none given).
    """

    path: Path
    streams: tuple[tuple[Entry, ...], ...]
    sequences: bool = False
    validation: tuple[tuple[Entry, ...], ...] = ()
    #: An ``.npz``: input name -> array, split into entries once the model's dims are known.
    arrays: Mapping[str, np.ndarray] | None = None

    @property
    def entries(self) -> tuple[Entry, ...]:
        """All entries, stream after stream (the rotation of a non-sequence model)."""
        return tuple(e for stream in self.streams for e in stream)


@dataclass(frozen=True)
class ModelTensor:
    """What the model declares for one tensor (dims of ONE batch item: no batch dim)."""

    name: str
    datatype: str
    dims: tuple[int, ...]


def _where(path: Path, stream: int, step: int, sequences: bool) -> str:
    return f"{path}: stream {stream} entry {step}" if sequences else f"{path}: entry {step}"


def _flatten(value: Any, where: str, name: str) -> tuple[Any, ...]:
    out: list[Any] = []
    stack = [value]
    while stack:  # iterative: a hostile nesting depth cannot overflow the Python stack
        item = stack.pop()
        if isinstance(item, list):
            stack.extend(reversed(item))
        elif isinstance(item, bool | int | float | str):
            out.append(item)
        else:
            raise InputError(
                f"{where}: input {name!r} holds {type(item).__name__} {item!r}; expected numbers, "
                "booleans or strings"
            )
        if len(out) > MAX_ELEMENTS:
            raise InputError(f"{where}: input {name!r} has more than {MAX_ELEMENTS} elements")
    return tuple(out)


def _shape_of(value: Any, where: str, name: str) -> tuple[int, ...]:
    if not isinstance(value, list) or not all(
        isinstance(d, int) and not isinstance(d, bool) for d in value
    ):
        raise InputError(
            f'{where}: input {name!r} has "shape": {value!r}; expected a list of integers'
        )
    if any(d < 0 for d in value):
        raise InputError(f'{where}: input {name!r} has "shape" {value}; dims must be >= 0')
    if math.prod(value) > MAX_ELEMENTS:
        raise InputError(
            f'{where}: input {name!r} has "shape" {value} ({math.prod(value)} elements); '
            f"at most {MAX_ELEMENTS} are accepted"
        )
    return tuple(value)


def _b64(value: Any, where: str, name: str) -> bytes:
    if not isinstance(value, str):
        raise InputError(f'{where}: input {name!r} has "b64": {value!r}; expected a base64 string')
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise InputError(f"{where}: input {name!r} has invalid base64: {exc}") from exc


def _raw_tensor(value: Any, where: str, name: str) -> RawTensor:
    if isinstance(value, list):
        return RawTensor(values=_flatten(value, where, name))
    if not isinstance(value, dict):
        raise InputError(
            f"{where}: input {name!r} is {type(value).__name__} {value!r}; expected a list of "
            'values, {"content": [...], "shape": [...]} or {"b64": "..."}'
        )
    shape = _shape_of(value["shape"], where, name) if "shape" in value else None
    if "b64" in value:
        return RawTensor(raw=_b64(value["b64"], where, name), shape=shape)
    if "content" not in value:
        raise InputError(
            f'{where}: input {name!r} has neither "content" nor "b64" (keys: {sorted(value)})'
        )
    content = value["content"]
    if isinstance(content, dict) and "b64" in content:
        return RawTensor(raw=_b64(content["b64"], where, name), shape=shape)
    if not isinstance(content, list):
        raise InputError(
            f'{where}: input {name!r} has "content": {content!r}; expected a list or {{"b64": ...}}'
        )
    return RawTensor(values=_flatten(content, where, name), shape=shape)


def _entry(value: Any, where: str) -> dict[str, RawTensor]:
    if not isinstance(value, dict):
        raise InputError(f"{where} is {type(value).__name__}; expected an object INPUT -> data")
    out = {}
    for name, tensor in value.items():
        if name in IGNORED_KEYS:
            continue
        try:
            out[name] = _raw_tensor(tensor, where, name)
        except InputError as exc:
            out[name] = RawTensor(error=str(exc))
    return out


def _streams(
    path: Path, items: Any, field: str
) -> tuple[tuple[tuple[dict[str, RawTensor], ...], ...], bool]:
    if not isinstance(items, list) or not items:
        raise InputError(
            f'{path}: "{field}" must be a non-empty list of entries {{"INPUT": [...]}} or of '
            "streams [[entry, ...], ...]"
        )
    sequences = isinstance(items[0], list)
    if any(isinstance(item, list) != sequences for item in items):
        raise InputError(
            f'{path}: "{field}" mixes entries (objects) and streams (lists); use one form'
        )
    if not sequences:
        return (tuple(_entry(e, _where(path, 0, k, False)) for k, e in enumerate(items)),), False
    streams = []
    for s, stream in enumerate(items):
        if not stream:
            raise InputError(f'{path}: "{field}" stream {s} is empty')
        streams.append(tuple(_entry(e, _where(path, s, k, True)) for k, e in enumerate(stream)))
    return tuple(streams), True


def _read_json(path: Path) -> DataFile:
    try:
        doc = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"input data file {path} cannot be read: {exc}") from exc
    except json.JSONDecodeError as exc:
        raise InputError(f"input data file {path} is not valid JSON: {exc}") from exc
    except RecursionError as exc:
        raise InputError(f"input data file {path} nests too deeply to read") from exc
    if not isinstance(doc, dict) or "data" not in doc:
        raise InputError(
            f'{path}: expected {{"data": [{{"INPUT": [...]}}, ...]}} (perf_analyzer\'s '
            "--input-data format)"
        )
    streams, sequences = _streams(path, doc["data"], "data")
    validation: tuple[tuple[dict[str, RawTensor], ...], ...] = ()
    if "validation_data" in doc:
        validation, _ = _streams(path, doc["validation_data"], "validation_data")
        if [len(s) for s in validation] != [len(s) for s in streams]:
            raise InputError(
                f'{path}: "validation_data" does not align with "data" (entries per stream '
                f"{[len(s) for s in validation]} vs {[len(s) for s in streams]})"
            )
    return DataFile(path, streams, sequences, validation)


def _read_npz(path: Path) -> DataFile:
    try:
        with np.load(path, allow_pickle=False) as npz:
            arrays = {k: npz[k] for k in npz.files}
    except (OSError, ValueError) as exc:
        raise InputError(f"input data file {path} is not a readable .npz: {exc}") from exc
    if not arrays:
        raise InputError(f"{path}: the .npz holds no arrays; expected one per input")
    return DataFile(path, (), arrays=arrays)


def _read_directory(path: Path) -> DataFile:
    entry = {}
    for file in sorted(path.iterdir()):
        if not file.is_file():
            raise InputError(f"{path}: {file.name} is not a file; expected one file per input")
        raw = file.read_bytes()
        if not raw:
            raise InputError(f"{path}: {file.name} is empty")
        entry[file.name] = RawTensor(raw=raw, text_lines=True)
    if not entry:
        raise InputError(f"{path}: the directory is empty; expected one file per input")
    return DataFile(path, ((entry,),))


def read_data_file(path: Path) -> DataFile:
    """Read a JSON file, an ``.npz`` file or a directory of raw files (no model needed yet)."""
    if path.is_dir():
        return _read_directory(path)
    if not path.exists():
        raise InputError(f"input data file {path} does not exist")
    if path.suffix == ".npz":
        return _read_npz(path)
    return _read_json(path)


def _element_count(raw: RawTensor, datatype: str) -> int | None:
    """Elements the data holds, where that is known without a shape."""
    if raw.values is not None:
        return len(raw.values)
    if raw.raw is None:
        return None
    if datatype == "BYTES":
        return len(_text_lines(raw.raw)) if raw.text_lines else None
    itemsize = np.dtype(triton_to_np_dtype(datatype)).itemsize
    return len(raw.raw) // itemsize if len(raw.raw) % itemsize == 0 else None


def _text_lines(data: bytes) -> list[bytes]:
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    return lines


def _dims(
    tensor: ModelTensor,
    raw: RawTensor,
    default: Sequence[int] | None,
    where: str,
) -> tuple[int, ...]:
    """The batch item's dims: the entry's ``shape``, else ``--shape``, else the model's."""
    model = tensor.dims
    given = raw.shape
    if given is None:
        dims = tuple(int(d) for d in default) if default is not None else model
        count = _element_count(raw, tensor.datatype)
        if dims.count(-1) == 1 and count is not None:
            fixed = math.prod(d for d in dims if d != -1)
            if fixed and count % fixed == 0:  # one free dim: the number of elements decides it
                dims = tuple(count // fixed if d == -1 else d for d in dims)
        if any(d < 0 for d in dims):
            raise InputError(
                f'{where}: input {tensor.name!r} has variable dims {list(model)}; give "shape" in '
                f"the entry or --shape {tensor.name}:D1,D2"
            )
        given = dims
    if len(given) != len(model) or any(m not in (-1, g) for m, g in zip(model, given, strict=True)):
        raise InputError(
            f"{where}: input {tensor.name!r} has shape {list(given)}, incompatible with the "
            f"model's {list(model)} (one batch item, no batch dim)"
        )
    return tuple(given)


def _length_prefixed(data: bytes, what: str) -> list[bytes]:
    """BYTES elements serialised as perf_analyzer and Triton do: uint32 LE length, then bytes."""
    items, at = [], 0
    while at < len(data):
        if at + 4 > len(data):
            raise InputError(
                f"{what}: b64 ends inside an element's 4-byte length (at byte {at}); each "
                "element is a 4-byte little-endian length followed by its bytes"
            )
        size = int.from_bytes(data[at : at + 4], "little")
        if at + 4 + size > len(data):
            raise InputError(
                f"{what}: b64 element at byte {at} claims {size} bytes, only "
                f"{len(data) - at - 4} follow; each element is a 4-byte little-endian length "
                "followed by its bytes"
            )
        items.append(data[at + 4 : at + 4 + size])
        at += 4 + size
    return items


def _decode(raw: RawTensor, tensor: ModelTensor, dims: tuple[int, ...], where: str) -> np.ndarray:
    count = math.prod(dims)
    name, datatype = tensor.name, tensor.datatype
    if datatype == "BYTES":
        if raw.values is not None:
            items = [v.encode() if isinstance(v, str) else str(v).encode() for v in raw.values]
        elif raw.array is not None:
            items = [v.encode() if isinstance(v, str) else bytes(v) for v in raw.array.ravel()]
        elif raw.text_lines:
            assert raw.raw is not None
            items = _text_lines(raw.raw)
        else:
            assert raw.raw is not None
            items = _length_prefixed(raw.raw, f"{where}: input {name!r} (BYTES)")
        if len(items) != count:
            raise InputError(
                f"{where}: input {name!r} (BYTES) has {len(items)} elements; shape {list(dims)} "
                f"needs {count}"
            )
        return np.array(items, dtype=np.object_).reshape(dims)
    dtype = np.dtype(triton_to_np_dtype(datatype))
    if raw.raw is not None:
        want = count * dtype.itemsize
        if len(raw.raw) != want:
            raise InputError(
                f"{where}: input {name!r} ({datatype}) has {len(raw.raw)} bytes; shape "
                f"{list(dims)} needs {want} ({count} x {dtype.itemsize})"
            )
        return np.frombuffer(raw.raw, dtype=dtype.newbyteorder("<")).astype(dtype).reshape(dims)
    source: Any = raw.values if raw.values is not None else raw.array
    size = len(source) if raw.values is not None else int(np.size(source))
    if size != count:
        raise InputError(
            f"{where}: input {name!r} ({datatype}) has {size} values; shape {list(dims)} needs "
            f"{count}"
        )
    if raw.values is not None and any(isinstance(v, str) for v in raw.values):
        raise InputError(
            f"{where}: input {name!r} is {datatype} but holds strings; expected numbers"
        )
    try:
        values = np.asarray(source)
        if (
            dtype.kind in "iub"
            and values.dtype.kind == "f"
            and (not np.all(np.isfinite(values)) or np.any(values != np.round(values)))
        ):
            raise ValueError("non-integer values")
        if dtype.kind in "iu":
            info = np.iinfo(dtype)
            if values.size and (values.min() < info.min or values.max() > info.max):
                raise ValueError(f"values outside {info.min}..{info.max}")
        return values.astype(dtype).reshape(dims)
    except (ValueError, TypeError, OverflowError) as exc:
        raise InputError(f"{where}: input {name!r} values do not fit {datatype}: {exc}") from exc


def _npz_streams(
    data: DataFile, by_name: Mapping[str, ModelTensor]
) -> tuple[tuple[Entry, ...], ...]:
    """Split an ``.npz``: an array of the item's rank is one entry; one rank more, entries."""
    assert data.arrays is not None
    counts = {}
    for name, array in data.arrays.items():
        tensor = by_name.get(name)
        rank = len(tensor.dims) if tensor is not None else array.ndim - 1
        if array.ndim == rank:
            counts[name] = 0  # no entry axis: one entry
        elif array.ndim == rank + 1 and array.shape[0] > 0:
            counts[name] = array.shape[0]
        else:
            raise InputError(
                f"{data.path}: array {name!r} has shape {list(array.shape)}; expected the "
                f"input's rank {rank} (one entry) or {rank + 1} (leading axis = entries)"
            )
    lengths = {c for c in counts.values() if c}
    if len(lengths) > 1:
        raise InputError(
            f"{data.path}: arrays have different entry counts {counts}; the leading axis is the "
            "entry, so it must be the same for every input"
        )
    n = lengths.pop() if lengths else 1
    entries = []
    for i in range(n):
        entry = {}
        for name, array in data.arrays.items():
            item = array[i] if counts[name] else array
            entry[name] = RawTensor(array=item, shape=tuple(item.shape))
        entries.append(entry)
    return (tuple(entries),)


def default_shapes(
    data: DataFile, tensors: Sequence[ModelTensor], shapes: Mapping[str, Sequence[int]] | None
) -> dict[str, tuple[int, ...]]:
    """``--shape``, completed by the first entry's ``"shape"`` for inputs it does not name."""
    out = {name: tuple(int(d) for d in dims) for name, dims in (shapes or {}).items()}
    first = data.streams[0][0] if data.streams and data.streams[0] else {}
    for tensor in tensors:
        raw = first.get(tensor.name)
        if tensor.name not in out and raw is not None and raw.shape is not None:
            out[tensor.name] = raw.shape
    return out


def resolve(
    data: DataFile,
    tensors: Sequence[ModelTensor],
    shapes: Mapping[str, Sequence[int]] | None = None,
    *,
    outputs: Sequence[ModelTensor] = (),
) -> tuple[tuple[dict[str, np.ndarray], ...], ...]:
    """Each stream's entries as arrays of one batch item, checked against the model's tensors.

    A tensor's dims are its entry's ``"shape"``, else ``shapes`` (``--shape``), else the first
    entry's ``"shape"`` for that input, else the model's dims (a single ``-1`` is then inferred
    from the number of values).

    Args:
        data: What ``read_data_file`` returned.
        tensors: The model's inputs (dims of one batch item).
        shapes: ``--shape`` defaults for variable dims.
        outputs: The model's outputs (directory files named after outputs are expected outputs,
            not unknown inputs).

    Raises:
        InputError: A missing or unknown input, a wrong element or byte count, a shape the model
            does not accept, values that do not fit the dtype.
    """
    by_name = {t.name: t for t in tensors}
    output_names = {t.name for t in outputs}
    streams = _npz_streams(data, by_name) if data.arrays is not None else data.streams
    defaults = default_shapes(data, tensors, shapes)
    out = []
    for s, stream in enumerate(streams):
        resolved = []
        for k, entry in enumerate(stream):
            where = _where(data.path, s, k, data.sequences)
            unknown = sorted(n for n in entry if n not in by_name and n not in output_names)
            if unknown:
                raise InputError(
                    f"{where}: {unknown} are not inputs of the model (its inputs: "
                    f"{sorted(by_name)})"
                )
            missing = [n for n in by_name if n not in entry]
            if missing:
                raise InputError(f"{where}: lacks inputs {missing}; every entry needs all inputs")
            item = {}
            for name, tensor in by_name.items():
                raw = entry[name]
                if raw.error is not None:
                    raise InputError(raw.error)
                dims = _dims(tensor, raw, defaults.get(name), where)
                item[name] = _decode(raw, tensor, dims, where)
            resolved.append(item)
        out.append(tuple(resolved))
    return tuple(out)


def resolve_validation(
    data: DataFile, outputs: Sequence[ModelTensor]
) -> tuple[tuple[dict[str, np.ndarray], ...], ...]:
    """The expected outputs (``validation_data``) as arrays of one batch item; () if none.

    Only outputs the entry names are checked (perf_analyzer validates those it is given).
    """
    if not data.validation:
        return ()
    by_name = {t.name: t for t in outputs}
    out = []
    for s, stream in enumerate(data.validation):
        resolved = []
        for k, entry in enumerate(stream):
            where = f"{_where(data.path, s, k, data.sequences)} (validation_data)"
            unknown = sorted(n for n in entry if n not in by_name)
            if unknown:
                raise InputError(
                    f"{where}: {unknown} are not outputs of the model (its outputs: "
                    f"{sorted(by_name)})"
                )
            expected = {}
            for n, raw in entry.items():
                if raw.error is not None:
                    raise InputError(f"{raw.error} (validation_data)")
                expected[n] = _decode(raw, by_name[n], _dims(by_name[n], raw, None, where), where)
            resolved.append(expected)
        out.append(tuple(resolved))
    return tuple(out)
