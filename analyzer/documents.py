"""perfsweep's JSON files on disk: atomic writes, reading a file of one kind, refusing versions.

The lowest layer of the run directory: :mod:`analyzer.records` (the typed records) and
:mod:`analyzer.results` (the directory's layout, which writes those records) both build on it,
so neither has to import the other's writers.

A file is written to a temporary name in its directory and then ``os.replace``d, so a crash
never leaves half a file.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NoReturn

from analyzer.errors import ResultFormatError


def _current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


_UMASK = _current_umask()


def write_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` via a temp file in the same directory and ``os.replace``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        # mkstemp creates 0600; results are ordinary files, readable as the umask allows.
        os.chmod(tmp, 0o666 & ~_UMASK)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def write_json(path: Path, data: Mapping[str, Any]) -> None:
    """Atomically write ``data`` as indented JSON."""
    write_atomic(path, json.dumps(data, indent=2, sort_keys=False, default=json_default) + "\n")


def read_document(path: Path, kind: str) -> dict[str, Any]:
    """Parse a perfsweep JSON file of ``kind``, any version (refuse other kinds, damaged JSON)."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ResultFormatError(f"{path} does not exist") from None
    except ValueError as exc:
        raise ResultFormatError(f"{path} is not valid JSON ({exc}); the file is damaged") from exc
    if not isinstance(data, dict) or data.get("kind") != kind:
        raise ResultFormatError(f"{path} is not a {kind} file")
    return data


def refuse_version(where: object, version: object, current: int) -> NoReturn:
    """Raise the one "cannot read this version" error: what happened and what to do."""
    raise ResultFormatError(
        f"{where} has format_version {version!r}; this perfsweep reads version {current}. "
        "Use the perfsweep version that wrote it, or re-run the sweep with this one"
    )


def json_default(value: Any) -> Any:
    """``json.dumps``'s ``default`` for perfsweep's files: paths as text, sets and tuples as
    lists; anything else is refused (``TypeError``)."""
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, (set, tuple)):
        return list(value)
    raise TypeError(f"cannot write {type(value).__name__} to JSON")
