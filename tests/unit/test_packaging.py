"""The declared dependencies tell the truth (issue 10, item 5).

``pyproject.toml`` is read as data and held against what the code calls and what the installed
dependencies themselves declare, so a bound that lies fails here instead of on a user's machine.
"""

from __future__ import annotations

import sys
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"

#: The oldest release of a dependency with every API the code calls, found by reading the
#: released wheels: optuna 4.9.0 has no ``Trial.set_constraint``, 5.0.0 has it.
OLDEST_WITH_API = {
    "optuna": ("5.0", "optuna.trial", "Trial", "set_constraint"),  # analyzer/search/study.py
}


def _requirements(extra: str | None = None) -> dict[str, Requirement]:
    project = tomllib.loads(PYPROJECT.read_text())["project"]
    lines = project["dependencies"] if extra is None else project["optional-dependencies"][extra]
    return {canonicalize_name(req.name): req for req in map(Requirement, lines)}


def _declared_by(distribution: str, dependency: str, extra: str = "") -> SpecifierSet:
    """The specifier an installed distribution declares for ``dependency`` (with ``extra``)."""
    for line in metadata.requires(distribution) or []:
        req = Requirement(line)
        if canonicalize_name(req.name) != dependency:
            continue
        if req.marker is None or req.marker.evaluate({"extra": extra}):
            return req.specifier
    raise AssertionError(f"{distribution}[{extra}] declares no {dependency}")


def _upper_bounds(spec: SpecifierSet) -> list[Version]:
    return sorted(Version(s.version) for s in spec if s.operator in ("<", "<="))


@pytest.mark.parametrize("name", sorted(OLDEST_WITH_API))
def test_lower_bound_has_the_api_the_code_calls(name: str) -> None:
    oldest, module, owner, attribute = OLDEST_WITH_API[name]
    lower = [Version(s.version) for s in _requirements()[name].specifier if s.operator == ">="]
    assert lower, f"{name} has no lower bound"
    assert max(lower) >= Version(oldest), f"{owner}.{attribute} needs {name}>={oldest}"
    # The installed release has it too, so the table above cannot drift from the code's needs.
    owner_obj = getattr(pytest.importorskip(module), owner)
    assert callable(getattr(owner_obj, attribute))


def test_protobuf_upper_bound_is_tritonclients() -> None:
    """pip 23.2 (Python 3.11's) picks the newest protobuf that perfsweep allows first; when that
    is one tritonclient[all] refuses, it backtracks through every tritonclient release (over 10
    minutes). Perfsweep's cap is therefore tritonclient's, no looser and no tighter."""
    ours = _requirements()["protobuf"].specifier
    theirs = _declared_by("tritonclient", "protobuf", extra="all")
    assert _upper_bounds(theirs), "tritonclient no longer caps protobuf: lift perfsweep's cap"
    assert _upper_bounds(ours) == _upper_bounds(theirs)


def test_postgres_extra_installs_the_driver_and_the_test_extra_keeps_it() -> None:
    driver = canonicalize_name("psycopg2-binary")
    postgres = _requirements("postgres")
    assert driver in postgres
    assert _requirements("test")[driver].specifier == postgres[driver].specifier
