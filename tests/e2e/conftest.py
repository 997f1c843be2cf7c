"""The browser the page's tests drive (test_page.py on the session's stack,
faults/test_pool_page.py on a pool's cluster): Debian's chromium, headless under Playwright with
the system executable, so nothing is downloaded; one per module. Their screenshots go to
`ARTIFACTS`.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, sync_playwright

from worker.ops.cluster import ROOT

ARTIFACTS = ROOT / "tests" / "artifacts"
BROWSERS = ("chromium", "chromium-browser", "/Applications/Chromium.app/Contents/MacOS/Chromium")


def _chromium() -> str:
    for name in BROWSERS:
        found = shutil.which(name) or (name if Path(name).is_file() else None)
        if found:
            return found
    raise AssertionError(
        "chromium is required (`scripts/setup.sh test`, which the test command runs, installs it)"
    )


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    # Chromium's sandbox refuses to run as root (CI runs as root).
    args = ["--no-sandbox"] if os.geteuid() == 0 else []
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=_chromium(), args=args)
        yield launched
        launched.close()
