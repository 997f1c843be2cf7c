"""The web page at `/` in a real browser (Debian's chromium, driven headless by Playwright with
the system executable: nothing is downloaded), against the real API and worker on the real model:
the fleet view (with no model pool: the session's worker serves a fixed model) and playground,
the charts of the fleet's history, the batches view and the job view. Screenshots at 800 and
1,400 pixels go to tests/artifacts/.
"""

from __future__ import annotations

import json
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
from playwright.sync_api import Browser, Locator, Page
from redis import Redis
from rq import Queue
from rq.serializers import JSONSerializer

from shared.queue.config import Settings
from shared.queue.jobs import JOB_FUNCTION, GenerationJob, JobLimits
from shared.queue.keys import Keys
from shared.wire.chat.completions import ChatMessage
from shared.wire.ids import new_id
from tests.e2e.conftest import ARTIFACTS
from tests.support import MODEL, chat_line, start_batch
from worker.ops.cluster import wait_until


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


def test_a_fleet_of_fixed_workers_shows_no_model_pool(
    page: Page, worker_process: subprocess.Popen[bytes]
) -> None:
    worker_row(page, worker_process).wait_for(timeout=10_000)
    page.locator("#pools-empty").wait_for(state="visible", timeout=5_000)
    assert page.locator("#pool-list article").count() == 0


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


def open_page(browser: Browser, api_url: str, width: int) -> Page:
    opened = browser.new_page(viewport={"width": width, "height": 1000})
    opened.goto(f"{api_url}/")
    return opened


def test_a_batch_shows_its_progress_its_files_download_and_it_is_cancelled_from_the_page(
    page: Page, client: openai.OpenAI
) -> None:
    lines = [chat_line(f"line-{i}", f"Count from 1 to {i + 30}.", max_tokens=60) for i in range(30)]
    batch = start_batch(client, lines)
    row = page.locator(f'#batch-list tr[data-batch="{batch.id}"]')
    row.wait_for(timeout=10_000)
    # The intake process records lines as it reads them, so the total grows to 30.
    progress = row.locator("progress")
    wait_until(lambda: progress.get_attribute("max") == "30", 30, "the batch's 30 lines")
    wait_until(lambda: int(progress.get_attribute("value") or 0) >= 1, 240, "a line")
    assert " failed of 30" in (row.locator(".counts").text_content() or "")
    assert row.locator("td").nth(2).text_content() == "in_progress"

    with page.expect_download() as download:
        row.locator("button.download.input").click()
    uploaded = "\n".join(map(json.dumps, lines)).encode()
    assert Path(download.value.path()).read_bytes() == uploaded

    row.locator("button.cancel").click()
    status = row.locator("td").nth(2)
    wait_until(lambda: status.text_content() == "cancelled", 120, "the batch to be cancelled")
    assert client.batches.retrieve(batch.id).status == "cancelled"
    assert row.locator("td").nth(5).text_content() != "-"  # finished at
    assert row.locator("button.cancel").count() == 0
    answered = set()
    for kind in ("output", "errors"):
        button = row.locator(f"button.download.{kind}")
        if button.count() == 0:
            continue
        with page.expect_download() as download:
            button.click()
        text = Path(download.value.path()).read_text()
        answered |= {json.loads(line)["custom_id"] for line in text.splitlines()}
    # Every line is in one of the two files: answered, or cancelled before it was.
    assert answered == {f"line-{i}" for i in range(30)}


def test_a_job_opens_with_its_model_lane_worker_timings_tokens_and_finish_reason(
    page: Page, client: openai.OpenAI, worker_process: subprocess.Popen[bytes]
) -> None:
    reply = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Say hello."}], max_tokens=8
    )
    assert reply.usage is not None
    row = page.locator(f'#jobs tr[data-job="{reply.id}"]')
    row.wait_for(timeout=10_000)
    row.locator("button.link").click()
    dialog = page.locator("#job-view")
    dialog.wait_for(state="visible", timeout=5_000)

    def field(name: str) -> str:
        return dialog.locator(f'dd[data-field="{name}"]').text_content() or ""

    assert field("job") == reply.id
    assert field("model") == MODEL
    assert field("lane") == "interactive"
    assert field("worker") == f"{socket.gethostname()}.{worker_process.pid}"
    assert field("status") == f"completed ({reply.choices[0].finish_reason})"
    assert field("completion tokens") == str(reply.usage.completion_tokens)
    assert field("prompt tokens").startswith(f"{reply.usage.prompt_tokens} ")
    for timing in ("queue time", "time to first token", "duration"):
        assert field(timing).endswith("s") and float(field(timing)[:-1]) >= 0
    assert dialog.locator('dd[data-field="error"]').count() == 0
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "page-job-1400.png"))
    page.click("#job-view-close")
    dialog.wait_for(state="hidden", timeout=5_000)


def test_a_failed_job_opens_with_its_error(page: Page, redis: Redis, settings: Settings) -> None:
    # A job taken after its queue deadline fails without running, and says why.
    job = GenerationJob(
        job_id=new_id("chatcmpl-"),
        model=MODEL,
        messages=[ChatMessage(role="user", content="hi")],
        limits=JobLimits(queue_deadline=time.time() - 1),
    )
    queue = Queue(
        Keys(settings.namespace).queue(MODEL), connection=redis, serializer=JSONSerializer
    )
    queue.enqueue_call(JOB_FUNCTION, args=(job.model_dump(mode="json"),), job_id=job.job_id)
    row = page.locator(f'#jobs tr[data-job="{job.job_id}"]')
    row.wait_for(timeout=30_000)
    assert row.locator("td").nth(2).text_content() == "failed"
    row.click()
    error = page.locator('#job-view dd[data-field="error"]')
    error.wait_for(state="visible", timeout=5_000)
    assert "past its deadline" in (error.text_content() or "")


def chart(page: Page, chart_id: str, figure: str) -> float:
    return float(page.locator(f"#{chart_id}").get_attribute(f"data-{figure}") or 0)


# The first series' colour in api/static/js/charts.js.
FIRST_SERIES_RGB = (0x25, 0x63, 0xEB)


def drawn_pixels(page: Page, chart_id: str, rgb: tuple[int, int, int]) -> int:
    """How many pixels of a chart's canvas are painted in the colour of a series."""
    count: int = page.evaluate(
        """([id, [r, g, b]]) => {
          const canvas = document.querySelector(`#${id} canvas`);
          const px = canvas.getContext("2d").getImageData(0, 0, canvas.width, canvas.height).data;
          let n = 0;
          for (let i = 0; i < px.length; i += 4) {
            const off = Math.abs(px[i] - r) + Math.abs(px[i + 1] - g) + Math.abs(px[i + 2] - b);
            if (px[i + 3] > 200 && off < 40) n += 1;
          }
          return n;
        }""",
        [chart_id, list(rgb)],
    )
    return count


def assert_tables_fit(page: Page, width: int) -> None:
    """No panel (nor the page) scrolls sideways; a table that cannot fit scrolls inside its own
    box; at 1,400 pixels the fleet's tables fit whole."""
    sizes = page.evaluate(
        """() => ({
          page: [document.documentElement.scrollWidth, document.documentElement.clientWidth],
          panels: [...document.querySelectorAll("main > section")]
            .map((s) => [s.id, s.scrollWidth, s.clientWidth]),
          tables: [...document.querySelectorAll(".table-wrap")].map((w) =>
            [w.firstElementChild.id, w.scrollWidth, w.clientWidth, getComputedStyle(w).overflowX]),
        })"""
    )
    assert sizes["page"][0] <= sizes["page"][1], sizes
    for panel, scroll, client in sizes["panels"]:
        assert scroll <= client, (width, panel, scroll, client)
    for table, scroll, client, overflow in sizes["tables"]:
        assert overflow == "auto", table
        if width >= 1400 and table in ("workers", "models", "jobs"):
            assert scroll <= client, (width, table, scroll, client)


def charts_are_drawn(page: Page, width: int) -> None:
    wait_until(lambda: chart(page, "chart-tokens", "max") > 0, 90, "tokens/s drawn")
    wait_until(lambda: chart(page, "chart-ttft", "points") > 0, 60, "TTFT drawn")
    page.locator("#jobs tbody tr").first.wait_for(timeout=30_000)
    assert chart(page, "chart-queue-time", "points") > 0
    assert chart(page, "chart-workers", "max") >= 1
    assert chart(page, "chart-depth", "points") > 0
    # The line is on the canvas, not only in the data.
    assert drawn_pixels(page, "chart-tokens", FIRST_SERIES_RGB) > 20
    assert_tables_fit(page, width)
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"page-{width}.png"), full_page=True)
    page.close()


def test_the_charts_draw_the_fleets_last_minutes_while_traffic_runs(
    browser: Browser, api_url: str, client: openai.OpenAI
) -> None:
    stop, failures = threading.Event(), []

    def traffic() -> None:
        while not stop.is_set():
            try:
                client.chat.completions.create(
                    model=MODEL,
                    messages=[{"role": "user", "content": "Count from one to twenty."}],
                    max_tokens=24,
                )
            except openai.OpenAIError as err:
                failures.append(err)

    threads = [threading.Thread(target=traffic) for _ in range(3)]
    for thread in threads:
        thread.start()
    try:
        for width in (1400, 800):
            charts_are_drawn(open_page(browser, api_url, width), width)
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=120)
    assert failures == []
