"""``docs/internals.md`` is a map that fits one screen, and everything it names exists.

Pure: reads the two documents and parses source files (nothing of the packages is imported, no
process, no socket).

- internals.md has at most 64 lines, none longer than 100 characters, and links to reference.md;
- every backticked token of internals.md that ends in ``.py`` or ``/`` is a path from the
  repository root, and every backticked dotted name under ``analyzer`` or ``reference_server``
  resolves: a module, then a name defined at its top level, then a member of that class;
- in its import diagram (a fenced block whose unindented rows name a package folder), every
  ``name.py`` and ``name/`` of the rows below a package is a file or folder of that package;
- reference.md exists and every ``analyzer/...`` or ``reference_server/...`` path it names in
  backticks exists (all missing ones in one message).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
MAP = REPO_ROOT / "docs" / "internals.md"
REFERENCE = REPO_ROOT / "docs" / "reference.md"
PACKAGES = ("analyzer", "reference_server")

MAX_LINES = 64  # "about 60": a few lines of slack, not a second page
MAX_WIDTH = 100

_FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)
_INLINE = re.compile(r"`([^`\n]+)`")
_DOTTED = re.compile(r"^(?:analyzer|reference_server)(?:\.\w+)+$")
_PATH_IN_TEXT = re.compile(r"(?<![\w/.])((?:analyzer|reference_server)/[\w./-]*)")
_DIAGRAM_TOKEN = re.compile(r"(?<![\w/.])([\w./]+?(?:\.py|/))(?![\w/])")


def _inline_code(text: str) -> list[str]:
    """Backticked spans outside fenced blocks."""
    return _INLINE.findall(_FENCE.sub("", text))


def _exists(relative: str) -> bool:
    path = REPO_ROOT / relative
    return path.is_dir() if relative.endswith("/") else path.is_file()


def _path_tokens(spans: list[str]) -> list[str]:
    """Spans that are one path ending in ``.py`` or ``/``."""
    return [s for s in spans if " " not in s and (s.endswith(".py") or s.endswith("/"))]


def _defined(body: list[ast.stmt]) -> dict[str, ast.ClassDef | None]:
    """Names bound by ``body`` (defs, classes, assignments, imports; inside if/try too)."""
    names: dict[str, ast.ClassDef | None] = {}
    for node in body:
        if isinstance(node, ast.ClassDef):
            names[node.name] = node
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            names[node.name] = None
        elif isinstance(node, ast.Assign):
            names |= {t.id: None for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names[node.target.id] = None
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names |= {(a.asname or a.name).split(".")[0]: None for a in node.names}
        elif isinstance(node, ast.If | ast.Try):
            handlers = [s for h in getattr(node, "handlers", []) for s in h.body]
            names |= _defined([*node.body, *node.orelse, *handlers])
    return names


def resolve_dotted(name: str, root: Path = REPO_ROOT) -> str | None:
    """None when ``name`` (``pkg.module.Attr.member``) resolves in the source tree, else why not."""
    parts = name.split(".")
    for split in range(len(parts), 0, -1):
        base = root.joinpath(*parts[:split])
        module = base.with_suffix(".py")
        source = module if module.is_file() else base / "__init__.py"
        if source.is_file():
            break
    else:
        return f"{name}: no module"
    rest = parts[split:]
    body = ast.parse(source.read_text(encoding="utf-8")).body
    for attr in rest:
        names = _defined(body)
        if attr not in names:
            return f"{name}: {source.relative_to(root)} defines no {attr!r}"
        found = names[attr]
        if found is None and attr != rest[-1]:
            return f"{name}: {attr!r} is not a class, so it has no members to name"
        body = found.body if found is not None else []
    return None


def diagram_tokens(text: str) -> list[tuple[str, str]]:
    """``(package, token)`` for the module names in the map's import diagram."""
    found = []
    for block in _FENCE.findall(text):
        package = ""
        for line in block.splitlines()[1:-1]:
            head = line.split()[0] if line.strip() else ""
            if not line.startswith(" ") and head.rstrip("/") in PACKAGES:
                package = head.rstrip("/")
                continue
            if package and line.startswith(" "):
                found += [(package, t) for t in _DIAGRAM_TOKEN.findall(line)]
    return found


def test_the_map_fits_one_screen() -> None:
    lines = MAP.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= MAX_LINES, f"docs/internals.md has {len(lines)} lines (<= {MAX_LINES})"
    wide = [f"{n}: {len(line)} chars" for n, line in enumerate(lines, 1) if len(line) > MAX_WIDTH]
    assert not wide, f"docs/internals.md lines over {MAX_WIDTH} characters:\n" + "\n".join(wide)
    assert "(reference.md)" in MAP.read_text(encoding="utf-8"), "the map must link reference.md"


def test_every_path_the_map_names_exists() -> None:
    tokens = _path_tokens(_inline_code(MAP.read_text(encoding="utf-8")))
    assert len(tokens) >= 20, tokens  # the behaviour table is there
    missing = [t for t in tokens if not _exists(t)]
    assert not missing, "docs/internals.md names paths that do not exist:\n" + "\n".join(missing)


def test_every_dotted_name_the_map_names_resolves() -> None:
    names = [s for s in _inline_code(MAP.read_text(encoding="utf-8")) if _DOTTED.match(s)]
    problems = [p for p in map(resolve_dotted, names) if p]
    assert not problems, "docs/internals.md names what is not there:\n" + "\n".join(problems)


def test_every_module_of_the_import_diagram_exists() -> None:
    tokens = diagram_tokens(MAP.read_text(encoding="utf-8"))
    assert {p for p, _ in tokens} == set(PACKAGES), tokens  # one diagram per package
    missing = [f"{p}/{t}" for p, t in tokens if not _exists(f"{p}/{t}")]
    assert not missing, "the map's import diagram names what does not exist:\n" + "\n".join(missing)


def test_every_source_path_the_reference_names_exists() -> None:
    assert REFERENCE.is_file(), "docs/reference.md (the map's field-by-field companion) is gone"
    paths = {
        p.rstrip(".,:;")
        for span in _inline_code(REFERENCE.read_text(encoding="utf-8"))
        for p in _PATH_IN_TEXT.findall(span)
    }
    assert len(paths) >= 20, paths
    missing = sorted(p for p in paths if not (REPO_ROOT / p).exists())
    assert not missing, "docs/reference.md names paths that do not exist:\n" + "\n".join(missing)


# -- the checks find planted mistakes ------------------------------------------------------------


def test_resolve_dotted_finds_planted_names(tmp_path: Path) -> None:
    (tmp_path / "analyzer").mkdir()
    (tmp_path / "analyzer" / "__init__.py").touch()
    (tmp_path / "analyzer" / "m.py").write_text(
        "X = 1\nclass C:\n    y: int = 0\n    def run(self): ...\n", encoding="utf-8"
    )
    assert resolve_dotted("analyzer.m", tmp_path) is None
    assert resolve_dotted("analyzer.m.C.run", tmp_path) is None
    assert resolve_dotted("analyzer.m.C.y", tmp_path) is None
    assert "defines no 'Z'" in str(resolve_dotted("analyzer.m.Z", tmp_path))
    assert "defines no 'gone'" in str(resolve_dotted("analyzer.m.C.gone", tmp_path))
    assert "no module" in str(resolve_dotted("analyzer_x.m", tmp_path))


def test_diagram_tokens_are_read_per_package() -> None:
    text = "```\nanalyzer/   (may import reference_server)\n  sweep.py -> load/ -> x.py (y)\n"
    text += "reference_server/\n  core/server.py -> __init__.py\n```\n"
    assert diagram_tokens(text) == [
        ("analyzer", "sweep.py"),
        ("analyzer", "load/"),
        ("analyzer", "x.py"),
        ("reference_server", "core/server.py"),
        ("reference_server", "__init__.py"),
    ]
