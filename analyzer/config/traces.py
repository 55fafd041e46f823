"""Read a recorded trace of request times into an arrival process's :class:`Trace`.

Three formats, told apart by the file's suffix:

- ``.csv``: a header row and a time column named ``timestamp``, ``time``, ``ts`` or ``t``
  (a ``_s``, ``_ms`` or ``_us`` suffix on the name gives its unit); without a header row the
  first column;
- ``.jsonl``: one JSON object a line with such a key;
- anything else: perf_analyzer's ``--request-intervals`` file, one gap a line in microseconds.

Timestamps are absolute or relative, in seconds unless the column name or ``unit`` says
otherwise; they are sorted (logs of several servers interleave) and turned into gaps.

A CSV or JSONL trace may also say which request data each request sent: a ``payload`` column
(or key) holding the index of an entry of the request data (``--input-data``, in its order).
The replay then sends, at each recorded request's time, that request's entry; without it the
generator walks the data in rotation as for any other shape.

A trace of a generative load also gives each request's lengths: ``input_length`` and
``output_length`` (mooncake's trace: ``timestamp`` in ms, so ``--trace-unit ms``) or
``input_tokens`` and ``output_tokens``, both or neither. The replay then sends each request
with its recorded lengths.
"""

from __future__ import annotations

import csv
import itertools
import json
from pathlib import Path

from analyzer.errors import InputError
from analyzer.measure.arrivals import Trace

#: Seconds per unit.
UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6}
#: Names of a time column, before an optional unit suffix.
TIME_KEYS = ("timestamp", "time", "ts", "t")
#: The name of the column (or JSONL key) holding each request's payload index.
PAYLOAD_KEY = "payload"
#: Names of a generative trace's length columns: (input, output), in order of preference.
LENGTH_KEYS = (("input_length", "output_length"), ("input_tokens", "output_tokens"))


def read_trace(path: Path | str, unit: str = "auto") -> Trace:
    """The trace in ``path``; ``unit`` (``s``, ``ms``, ``us`` or ``auto``) overrides the unit
    the format implies.

    Raises:
        InputError: the file is missing, empty, or not one of the formats above.
    """
    path = Path(path)
    if unit != "auto" and unit not in UNITS:
        raise InputError(f"--trace-unit must be s, ms, us or auto, got {unit!r}")
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise InputError(f"cannot read trace {path}: {exc.strerror or exc}") from None
    suffix = path.suffix.lower()
    payloads: list[int] = []
    lengths: list[tuple[int, int]] = []
    if suffix == ".csv":
        times, implied, payloads, lengths = _csv_times(text, path)
    elif suffix == ".jsonl":
        times, implied, payloads, lengths = _jsonl_times(text, path)
    else:
        gaps, implied = _intervals(text, path), "us"
        scale = UNITS[implied if unit == "auto" else unit]
        return Trace(tuple(g * scale for g in gaps), path.name)
    scale = UNITS[implied if unit == "auto" else unit]
    if len(times) < 2:
        raise InputError(f"trace {path}: needs at least 2 requests, found {len(times)}")
    order = sorted(range(len(times)), key=times.__getitem__)  # stable: ties keep file order
    times = [times[i] for i in order]
    # n timestamps, n - 1 gaps: the recorded rate is (n - 1) / span, and a looped replay goes
    # on from the last request with the first gap. The replay's k-th send falls at request
    # k + 1's time, so it carries request k + 1's payload.
    sent = tuple(payloads[i] for i in order[1:]) if payloads else ()
    sized = tuple(lengths[i] for i in order[1:]) if lengths else ()
    spans = tuple((b - a) * scale for a, b in itertools.pairwise(times))
    return Trace(spans, path.name, sent, sized)


def _length_keys(keys: list[str], path: Path) -> tuple[str, str] | None:
    """The (input, output) length columns among ``keys``; None when there are none."""
    names = {k.strip().lower(): k for k in keys}
    for pair in LENGTH_KEYS:
        present = [k in names for k in pair]
        if all(present):
            return names[pair[0]], names[pair[1]]
        if any(present):
            raise InputError(
                f"trace {path}: {pair[0]} and {pair[1]} go together; give both columns"
            )
    return None


def _length(value: object, key: str, path: Path, line: int) -> int:
    """A token count as written in a trace (a whole number >= 1)."""
    try:
        if isinstance(value, bool) or float(str(value)) != int(float(str(value))):
            raise ValueError
        count = int(float(str(value)))
    except (ValueError, OverflowError):
        count = 0
    if count < 1:
        raise InputError(f"trace {path}:{line}: {key} must be a whole number >= 1, not {value!r}")
    return count


def _time_key(keys: list[str], path: Path) -> tuple[str, str]:
    """The time column among ``keys`` and the unit its name implies."""
    for key in keys:
        name = key.strip().lower()
        base, _, suffix = name.rpartition("_")
        if name in TIME_KEYS:
            return key, "s"
        if base in TIME_KEYS and suffix in UNITS:
            return key, suffix
    names = ", ".join(TIME_KEYS)
    raise InputError(
        f"trace {path}: no time column among {keys}; name it one of {names} "
        "(with _s, _ms or _us for its unit)"
    )


def _payload(value: object, path: Path, line: int) -> int:
    """A payload index as written in a trace (a non-negative integer)."""
    try:
        if isinstance(value, bool) or float(str(value)) != int(float(str(value))):
            raise ValueError
        index = int(float(str(value)))
    except (ValueError, OverflowError):
        index = -1
    if index < 0:
        raise InputError(
            f"trace {path}:{line}: {PAYLOAD_KEY} must be the index of a request data entry "
            f"(0, 1, ...), not {value!r}"
        )
    return index


def _csv_times(text: str, path: Path) -> tuple[list[float], str, list[int], list[tuple[int, int]]]:
    rows = [r for r in csv.reader(text.splitlines()) if r and any(c.strip() for c in r)]
    if not rows:
        raise InputError(f"trace {path} is empty")
    payload_column = None
    length_columns: tuple[int, int] | None = None
    try:
        float(rows[0][0])
        column, unit, body = 0, "s", rows  # no header: the first column, in seconds
    except ValueError:
        key, unit = _time_key(rows[0], path)
        column, body = rows[0].index(key), rows[1:]
        names = [k.strip().lower() for k in rows[0]]
        payload_column = names.index(PAYLOAD_KEY) if PAYLOAD_KEY in names else None
        keys = _length_keys(rows[0], path)
        if keys is not None:
            length_columns = (rows[0].index(keys[0]), rows[0].index(keys[1]))
    times, payloads = [], []
    lengths: list[tuple[int, int]] = []
    for line, row in enumerate(body, 2 if body is not rows else 1):
        try:
            times.append(float(row[column]))
        except (ValueError, IndexError):
            raise InputError(f"trace {path}:{line}: no number in its time column") from None
        if payload_column is not None:
            cell = row[payload_column] if payload_column < len(row) else ""
            payloads.append(_payload(cell.strip(), path, line))
        if length_columns is not None:
            cells = [row[c].strip() if c < len(row) else "" for c in length_columns]
            header = [rows[0][c].strip() for c in length_columns]
            lengths.append(
                (
                    _length(cells[0], header[0], path, line),
                    _length(cells[1], header[1], path, line),
                )
            )
    return times, unit, payloads, lengths


def _jsonl_times(
    text: str, path: Path
) -> tuple[list[float], str, list[int], list[tuple[int, int]]]:
    times: list[float] = []
    payloads: list[int] = []
    lengths: list[tuple[int, int]] = []
    length_keys: tuple[str, str] | None = None
    key = unit = ""
    for line, raw in enumerate(text.splitlines(), 1):
        if not raw.strip():
            continue
        try:
            record = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise InputError(f"trace {path}:{line}: not JSON ({exc.msg})") from None
        if not isinstance(record, dict):
            raise InputError(f"trace {path}:{line}: each line must be a JSON object")
        if not key:
            key, unit = _time_key(list(record), path)
            length_keys = _length_keys(list(record), path)
        value = record.get(key)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise InputError(f"trace {path}:{line}: {key!r} must be a number")
        times.append(float(value))
        if (len(times) == 1 and PAYLOAD_KEY in record) or payloads:
            payloads.append(_payload(record.get(PAYLOAD_KEY), path, line))
        if length_keys is not None:
            a, b = length_keys
            lengths.append(
                (_length(record.get(a), a, path, line), _length(record.get(b), b, path, line))
            )
    if not times:
        raise InputError(f"trace {path} is empty")
    return times, unit, payloads, lengths


def _intervals(text: str, path: Path) -> list[float]:
    gaps = []
    for line, raw in enumerate(text.splitlines(), 1):
        if not raw.strip():
            continue
        try:
            gaps.append(float(raw))
        except ValueError:
            raise InputError(
                f"trace {path}:{line}: {raw.strip()!r} is not a number (a file that is not "
                ".csv or .jsonl is read as perf_analyzer's --request-intervals: one gap a "
                "line, in microseconds)"
            ) from None
    if not gaps:
        raise InputError(f"trace {path} is empty")
    return gaps
