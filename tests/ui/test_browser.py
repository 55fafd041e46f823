"""The dashboard in a real headless Chromium: start a run from the form, watch the Server tab
update, apply a config change from it, and check that the server reports the new config.

Runs ``perfsweep ui --model resnet50 --device sim`` (the managed reference server) exactly as a
user would. A screenshot is saved under ``test-artifacts/``.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.browser import ARTIFACTS, CHROMIUM_ARGS
from tests.support.browser import CHROMIUM as CHROMIUM_PATH
from tests.ui.support import UI_READY, Child, http, perfsweep

pytestmark = [pytest.mark.browser, pytest.mark.timeout(300)]

CHROMIUM = str(CHROMIUM_PATH)


@pytest.fixture
def dashboard(tmp_path: Path, spawns: None) -> Iterator[tuple[str, str]]:
    """(dashboard URL, target HTTP URL) of a running ``perfsweep ui`` on a managed server."""
    child = Child(
        perfsweep(
            "ui",
            "--model",
            "resnet50",
            "--device",
            "sim",
            "--web-port",
            "0",
            "--log-dir",
            str(tmp_path / "ui"),
        ),
        tmp_path / "ui.log",
    )
    try:
        target = child.wait_line("perfsweep ui: target ", 180).split()[3]
        line = child.wait_line(UI_READY, 120)
        match = re.search(r"(http://\S+?)/? ", line + " ")
        assert match, line
        yield match.group(1), target
    finally:
        assert child.stop() in (0, 130), child.tail()


def _number(text: str | None) -> float:
    try:
        return float(text or "nan")
    except ValueError:
        return float("nan")


def test_run_watch_and_reconfigure_from_the_browser(
    dashboard: tuple[str, str], tmp_path: Path
) -> None:
    if not Path(CHROMIUM).exists():
        pytest.skip(f"needs Chromium at {CHROMIUM} (.ci/run installs it)")
    sync_api = pytest.importorskip("playwright.sync_api")
    base, target = dashboard
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch_persistent_context(
            str(tmp_path / "chromium-profile"),
            executable_path=CHROMIUM,
            headless=True,
            args=CHROMIUM_ARGS,
            viewport={"width": 1400, "height": 1000},
        )
        try:
            page = browser.new_page()
            page.set_default_timeout(30_000)
            page.goto(base + "/")

            # Start a run from Locust's own form (all four Triton users are ticked by default).
            page.get_by_label("Number of users").fill("4")
            page.get_by_label("Ramp up").fill("4")
            page.get_by_role("button", name="Start").click()
            page.get_by_role("tab", name="Server").click()
            assert "tab=server" in page.url

            # The panel fills in and keeps updating while load runs.
            requests = page.locator("[data-ps=requests]")
            page.wait_for_function(
                "() => Number(document.querySelector('[data-ps=requests]')?.textContent) > 20"
            )
            first = _number(requests.text_content())
            page.wait_for_function(
                f"() => Number(document.querySelector('[data-ps=requests]').textContent) > {first}"
            )
            assert _number(page.locator("[data-ps=p99]").text_content()) > 0
            assert _number(page.locator("[data-ps=batch]").text_content()) >= 1
            assert page.locator("[data-ps=batch-histogram] .ps-bar-row").count() >= 1
            # Locust's native table of the tab carries the same numbers (no script needed).
            page.get_by_role("cell", name="average batch size").wait_for()

            # Change the batching config from the form while the load runs.
            page.locator("[data-ps=cfg-max_batch_size]").fill("16")
            page.locator("[data-ps=cfg-max_queue_delay_us]").fill("4000")
            page.locator("[data-ps=cfg-preferred_batch_size]").fill("8,4")
            page.locator("[data-ps=cfg-instance_count]").fill("2")
            page.locator("[data-ps=apply]").click()
            status = page.locator("[data-ps=config-status]")
            page.wait_for_function(
                "() => document.querySelector('[data-ps=config-status]')"
                ".textContent.startsWith('applied')",
                timeout=120_000,
            )
            assert "delay 4000 us" in (status.text_content() or "")

            # The server itself reports the new config...
            code, config = http("GET", f"{target}/v2/models/resnet50/config")
            assert code == 200
            batching = config["dynamic_batching"]
            assert int(batching["max_queue_delay_microseconds"]) == 4000
            assert [int(s) for s in batching["preferred_batch_size"]] == [8, 4]
            assert int(config["max_batch_size"]) == 16
            assert sum(int(g["count"]) for g in config["instance_group"]) == 2
            # ... and the tab shows it, with load still flowing after the reload.
            page.get_by_role(
                "cell", name=re.compile(r"delay 4000 us, preferred \[8,4\]")
            ).wait_for()
            after = _number(requests.text_content())
            page.wait_for_function(
                f"() => Number(document.querySelector('[data-ps=requests]').textContent) > {after}"
            )
            ARTIFACTS.mkdir(exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / "ui-server-tab.png"), full_page=True)
            page.get_by_role("button", name="Stop").click()
        finally:
            browser.close()
