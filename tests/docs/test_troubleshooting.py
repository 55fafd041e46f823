"""Every message the troubleshooting page quotes is one the code prints.

Pure (a few seconds: it parses every module): reads the page and parses the source of ``analyzer/`` and ``reference_server/``. Each
string the code can print (a literal, an f-string, a ``+`` chain of them, with implicit
concatenation joined by the parser) becomes a pattern: its literal text exactly, each value it
fills in (``{url}``, ``"; ".join(problems)``) as any text. A quoted message must match one
pattern whole, so a reworded message, a renamed flag in it, or a message the page made up
fails here.
"""

from __future__ import annotations

import ast
import re
from functools import cache

from tests.docs.commands import REPO_ROOT

PAGE = REPO_ROOT / "docs" / "troubleshooting.md"
SOURCES = ("analyzer", "reference_server")
_QUOTED = re.compile(r"^```text\n(.*?)^```", re.MULTILINE | re.DOTALL)
#: A value filled in: any text, at least one character.
_VALUE = "(?:.+?)"


def quoted_messages(text: str) -> list[str]:
    """The lines of every ```` ```text ```` block: one message a line."""
    return [
        line.strip()
        for block in _QUOTED.finditer(text)
        for line in block.group(1).splitlines()
        if line.strip()
    ]


def _parts(node: ast.expr) -> list[str | None] | None:
    """A string expression as literal pieces and ``None`` for each value filled in; None when
    ``node`` is no string expression."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.JoinedStr):
        out: list[str | None] = []
        for value in node.values:
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                out.append(value.value)
            else:
                out.append(None)
        return out
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _parts(node.left), _parts(node.right)
        if left is None and right is None:
            return None
        return (left if left is not None else [None]) + (right if right is not None else [None])
    return None


@cache
def printable_strings() -> tuple[tuple[str | None, ...], ...]:
    """Every string expression of the source as pieces: the widest ones (a ``+`` chain, not its
    pieces), with some literal text."""
    found = []
    for root in SOURCES:
        for path in sorted((REPO_ROOT / root).rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            inner: set[int] = set()
            for node in ast.walk(tree):
                if isinstance(node, ast.BinOp | ast.JoinedStr):
                    inner |= {id(child) for child in ast.iter_child_nodes(node)}
            for node in ast.walk(tree):
                if id(node) in inner or not isinstance(node, ast.expr):
                    continue
                parts = _parts(node)
                if parts and sum(len(p) for p in parts if p) >= 12:
                    found.append(tuple(parts))
    return tuple(found)


def printed_by_code(message: str) -> bool:
    """Whether one string expression of the source can print ``message`` whole: its literal
    text exactly, any text (at least a character) for each value it fills in."""
    for parts in printable_strings():
        if not all(p in message for p in parts if p):  # cheap: before any regex
            continue
        pattern = "".join(_VALUE if p is None else re.escape(p) for p in parts)
        if re.fullmatch(pattern, message, re.DOTALL):
            return True
    return False


def test_the_page_quotes_messages_in_every_section() -> None:
    messages = quoted_messages(PAGE.read_text(encoding="utf-8"))
    assert len(messages) >= 12, messages


def test_every_quoted_message_is_one_the_code_prints(takes_seconds: None) -> None:
    missing = [
        m for m in quoted_messages(PAGE.read_text(encoding="utf-8")) if not printed_by_code(m)
    ]
    assert not missing, "quoted on docs/troubleshooting.md, printed by no code:\n" + "\n".join(
        missing
    )


def test_the_check_tells_a_printed_message_from_a_made_up_one(takes_seconds: None) -> None:
    printed = (
        "the server at http://h:1 stopped answering and did not return within 5 s "
        "(run.server_wait_s, --server-wait-s)"
    )
    assert printed_by_code(printed)
    # One word changed, or a flag renamed: no longer the code's message.
    assert not printed_by_code(printed.replace("did not return", "never returned"))
    assert not printed_by_code(printed.replace("--server-wait-s", "--server-wait"))
    assert not printed_by_code("perfsweep could not find a good config; try again later")
    # A + chain is one message: its literal pieces in order, values between them.
    assert printed_by_code(
        "INVALID: the load generator was saturated (x), so these numbers describe the "
        "generator, not the server. Fix: add generator processes (--workers N, one per free "
        "core) or offer less load per process (fewer users / a lower rate)."
    )
