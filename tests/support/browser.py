"""Headless Chromium settings shared by the browser tests (Debian's chromium, no downloads)."""

from __future__ import annotations

from pathlib import Path

CHROMIUM = Path("/usr/bin/chromium")
#: Flags for a sandbox-less root run on a closed network (background networking would be refused).
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
#: Screenshots and other artifacts of browser tests (gitignored).
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
