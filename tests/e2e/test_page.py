"""The web page at `/` in a real browser (Debian's chromium, driven headless by Playwright with
the system executable: nothing is downloaded), against the real API and worker on the real model.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Locator, Page, sync_playwright

from worker.ops.cluster import ROOT, wait_until

ARTIFACTS = ROOT / "tests" / "artifacts"
BROWSERS = ("chromium", "chromium-browser", "/Applications/Chromium.app/Contents/MacOS/Chromium")


def _chromium() -> str:
    for name in BROWSERS:
        found = shutil.which(name) or (name if Path(name).is_file() else None)
        if found:
            return found
    raise AssertionError("chromium is required (scripts/setup.sh installs it)")


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    # Chromium's sandbox refuses to run as root (CI runs as root).
    args = ["--no-sandbox"] if os.geteuid() == 0 else []
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=_chromium(), args=args)
        yield launched
        launched.close()


@pytest.fixture
def page(browser: Browser, api_url: str, worker_process: subprocess.Popen[bytes]) -> Iterator[Page]:
    opened = browser.new_page(viewport={"width": 1400, "height": 900})
    opened.goto(f"{api_url}/")
    yield opened
    opened.close()


def worker_row(page: Page, worker_process: subprocess.Popen[bytes]) -> Locator:
    worker_id = f"{socket.gethostname()}.{worker_process.pid}"
    return page.locator(f'#workers tr[data-worker="{worker_id}"]')


def ask(page: Page, message: str, max_tokens: int) -> Locator:
    page.fill("#max-tokens", str(max_tokens))
    page.fill("#temperature", "0")
    page.fill("#message", message)
    page.click("#send")
    return page.locator(".message.assistant").last


def test_the_page_lists_the_worker_and_streams_an_answer_token_by_token(
    page: Page, worker_process: subprocess.Popen[bytes]
) -> None:
    row = worker_row(page, worker_process)
    row.wait_for(timeout=10_000)
    assert row.locator("td").nth(3).text_content() == "0/8"
    page.wait_for_function("document.querySelector('#model').options.length > 0")

    answer = ask(page, "Name three colours of the rainbow.", max_tokens=40)
    seen: list[str] = []
    deadline = time.monotonic() + 120
    while answer.get_attribute("data-state") != "done" and time.monotonic() < deadline:
        text = answer.text_content() or ""
        if answer.get_attribute("data-state") == "streaming" and text and text not in seen:
            seen.append(text)
        time.sleep(0.02)
    assert answer.get_attribute("data-state") == "done"
    final = answer.text_content() or ""
    # It grew in steps, each a prefix of what came next, before the stream ended.
    assert len(seen) >= 2, seen
    assert all(final.startswith(part) for part in seen)
    assert page.locator("#chat-status").text_content() in ("done (stop)", "done (length)")
    # The finished job shows up in the fleet view's last jobs.
    page.locator("#jobs tbody tr", has_text="completed").first.wait_for(timeout=10_000)


def test_stop_cancels_a_long_answer_and_frees_the_workers_slot(
    page: Page, worker_process: subprocess.Popen[bytes]
) -> None:
    row = worker_row(page, worker_process)
    row.wait_for(timeout=10_000)
    page.wait_for_function("document.querySelector('#model').options.length > 0")
    answer = ask(page, "Write a very long story about a dragon and a knight.", max_tokens=2000)
    wait_until(lambda: len(answer.text_content() or "") > 20, 120, "the answer to start")
    slots = row.locator("td").nth(3)
    wait_until(lambda: slots.text_content() == "1/8", 10, "the fleet view to show the busy slot")
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "page.png"))

    page.click("#stop-button")
    wait_until(lambda: answer.get_attribute("data-state") == "stopped", 5, "the page to stop")
    wait_until(lambda: slots.text_content() == "0/8", 10, "the slot to be freed")
    cancelled = page.locator("#jobs tbody tr", has_text="cancelled").first
    cancelled.wait_for(timeout=10_000)
