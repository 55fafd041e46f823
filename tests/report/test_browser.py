"""The report in a real headless Chromium: no console errors, figures drawn, copy, sort.

Needs Debian's ``chromium`` (``.ci/run`` installs it) and the python ``playwright`` package; the
test skips with the reason when either is missing. The screenshot goes to ``test-artifacts/``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from analyzer.report import write_report
from tests.support.browser import ARTIFACTS, CHROMIUM, CHROMIUM_ARGS

pytestmark = pytest.mark.browser

ARGS = CHROMIUM_ARGS


@pytest.fixture(scope="module")
def browser_context(tmp_path_factory: pytest.TempPathFactory, spawns: None) -> Iterator[Any]:
    if not CHROMIUM.exists():
        pytest.skip(f"{CHROMIUM} not installed (apt-get install chromium; .ci/run does)")
    sync_api = pytest.importorskip("playwright.sync_api")
    profile = tmp_path_factory.mktemp("chromium-profile")
    with sync_api.sync_playwright() as p:
        context = p.chromium.launch_persistent_context(
            str(profile),
            executable_path=str(CHROMIUM),
            args=ARGS,
            headless=True,
            viewport={"width": 1200, "height": 900},
        )
        context.grant_permissions(["clipboard-read", "clipboard-write"])
        try:
            yield context
        finally:
            context.close()


def _open(context: Any, path: Path) -> tuple[Any, list[str]]:
    """Open ``path``; the list collects console errors/warnings, page errors and any request
    that leaves the file (the page's CSP forbids them; this checks it)."""
    errors: list[str] = []
    page = context.new_page()
    page.on(
        "request",
        lambda r: errors.append(f"request {r.url}") if r.url != path.as_uri() else None,
    )
    page.on("console", lambda m: errors.append(m.text) if m.type in ("error", "warning") else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(path.as_uri())
    page.wait_for_load_state("load")
    return page, errors


def test_report_in_chromium(browser_context: Any, planted_run: Path, tmp_path: Path) -> None:
    out = write_report(planted_run, tmp_path / "report.html")
    page, errors = _open(browser_context, out)

    boxes = page.eval_on_selector_all(
        "figure[data-figure] svg",
        "els => els.map(e => { const r = e.getBoundingClientRect(); return [r.width, r.height]; })",
    )
    assert len(boxes) == 8
    assert all(w > 100 and h > 100 for w, h in boxes), boxes
    # Every <use> (markers) points at an element that exists: the id prefixing kept references.
    dangling = page.evaluate(
        """() => Array.from(document.querySelectorAll('figure use')).filter(u => {
               const ref = u.getAttribute('xlink:href') || u.getAttribute('href');
               return !document.getElementById(ref.slice(1));
           }).length"""
    )
    assert dangling == 0

    page.click("button.copy[data-target=best-config]")
    page.wait_for_selector("button.copy[data-copied]")
    assert page.get_attribute("button.copy", "data-copied") == "yes"
    copied = page.evaluate("navigator.clipboard.readText()")
    assert copied == (planted_run / "best" / "config.pbtxt").read_text()

    # Sort the trials table by throughput (8th column), descending on the second click.
    header = page.locator("#trials-table thead th").nth(7)
    header.click()
    header.click()
    assert header.get_attribute("aria-sort") == "descending"
    cells = page.locator("#trials-table tbody tr td:nth-child(8)").all_inner_texts()
    numbers = [float(c) for c in cells if c != "-"]
    assert numbers == sorted(numbers, reverse=True)
    assert cells[len(numbers) :] == ["-"] * (len(cells) - len(numbers))  # failed trials last

    data = page.evaluate("JSON.parse(document.getElementById('perfsweep-data').textContent)")
    assert data["kind"] == "perfsweep.report"

    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "report.png"), full_page=True)
    assert (ARTIFACTS / "report.png").stat().st_size > 10_000
    assert errors == []
    page.close()


def test_hostile_report_runs_no_injected_script(
    browser_context: Any, hostile_run: Path, tmp_path: Path
) -> None:
    out = write_report(hostile_run, tmp_path / "report.html")
    page, errors = _open(browser_context, out)
    dialogs: list[str] = []
    page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    page.reload()
    page.wait_for_load_state("load")
    assert dialogs == []
    assert page.inner_text("#model-name") == "<script>alert(1)</script>"
    assert page.evaluate("document.scripts.length") == 2
    assert errors == []
    page.close()


def test_compare_page_in_chromium(
    browser_context: Any, planted_run: Path, hostile_run: Path, tmp_path: Path
) -> None:
    from analyzer.report import write_compare_report

    out = write_compare_report(planted_run, hostile_run, tmp_path / "compare.html")
    page, errors = _open(browser_context, out)
    boxes = page.eval_on_selector_all(
        "figure[data-figure] svg",
        "els => els.map(e => { const r = e.getBoundingClientRect(); return [r.width, r.height]; })",
    )
    assert len(boxes) == 2 and all(w > 100 and h > 100 for w, h in boxes)
    assert page.locator("#difference-list li").count() >= 2
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "compare.png"), full_page=True)
    assert errors == []
    page.close()
