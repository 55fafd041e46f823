"""analyzer.documents: the one format table, its migrations, and the readers and writers on it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from analyzer import documents
from analyzer.documents import FORMATS, FormatHistory, header, read_versioned, write_json
from analyzer.errors import ResultFormatError
from analyzer.measure.generator import read_load_output
from analyzer.predict import ProfileError
from analyzer.predict.profile import Profile

PLANTED = "perfsweep.planted"


def test_every_kind_has_a_history_up_to_its_current_version() -> None:
    for kind, fmt in FORMATS.items():
        assert kind.startswith("perfsweep."), kind
        assert sorted(fmt.history) == list(range(1, fmt.current + 1)), kind
        # A version after the first is reached from the one before it.
        assert all(v in fmt.migrations for v in range(1, fmt.current)), kind
        assert header(kind) == {"format_version": fmt.current, "kind": kind}


def test_a_planted_version_0_document_is_migrated_when_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[int] = []

    def v0_to_v1(doc: dict[str, Any]) -> dict[str, Any]:
        calls.append(doc["format_version"])
        doc["seconds"] = doc.pop("ms") / 1000
        return doc

    planted = FormatHistory(1, {0: "ms", 1: "seconds"}, {0: v0_to_v1})
    monkeypatch.setitem(FORMATS, PLANTED, planted)
    path = tmp_path / "planted.json"
    write_json(path, {"format_version": 0, "kind": PLANTED, "ms": 1500})
    assert read_versioned(path, PLANTED) == {"format_version": 1, "kind": PLANTED, "seconds": 1.5}
    assert calls == [0]
    assert json.loads(path.read_text())["format_version"] == 0  # reading never rewrites
    write_json(path, {**header(PLANTED), "seconds": 2.0})
    assert read_versioned(path, PLANTED)["seconds"] == 2.0 and calls == [0]  # current: as is

    for version in (2, -1, "1", None):  # newer, no path from it, not a version
        write_json(path, {"format_version": version, "kind": PLANTED})
        with pytest.raises(ResultFormatError, match="Use the perfsweep version that wrote it"):
            read_versioned(path, PLANTED)


def test_readers_outside_the_run_directory_take_their_version_from_the_table(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def v0_to_v1(doc: dict[str, Any]) -> dict[str, Any]:
        doc["results"] = doc.pop("levels")
        return doc

    load = FormatHistory(1, {0: "levels", 1: "results"}, {0: v0_to_v1})
    monkeypatch.setitem(FORMATS, documents.LOAD_KIND, load)
    old = {"format_version": 0, "kind": documents.LOAD_KIND, "levels": []}
    assert read_load_output(old) == ([], None)
    with pytest.raises(ResultFormatError, match="format_version=2"):
        read_load_output({**old, "format_version": 2})
    with pytest.raises(ProfileError, match="format_version 2"):
        Profile.from_dict({"format_version": 2, "kind": documents.PROFILE_KIND})
