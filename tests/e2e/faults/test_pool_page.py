"""The page's model pools (api/static/js/pools.js) in chromium, on a real pool: one pool agent
whose catalog is the default model under several names (conftest.py `models_dir`), with a
budget for one of them. A model a request loads shows on its machine, `loaded` on the worker
that holds it (the live worker serving it), with the memory the pool counts against its budget
and its `load` event; a request with keep_alive 0 then shows the model's `unload`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import openai
import pytest
from playwright.sync_api import Browser, Locator, Page

from shared.wire.fleet.pool import PoolReport
from tests.e2e.conftest import ARTIFACTS
from tests.e2e.faults.conftest import ask, pool_report, start_pool_cluster
from worker.ops.cluster import Cluster, wait_until

GIB = 1 << 30


@pytest.fixture(scope="module")
def cluster(start_cluster: Callable[..., Cluster], models_dir: Path) -> Cluster:
    return start_pool_cluster(start_cluster, models_dir, models=1.5)


@pytest.fixture
def page(browser: Browser, cluster: Cluster) -> Iterator[Page]:
    opened = browser.new_page(viewport={"width": 1400, "height": 1000})
    opened.goto(f"{cluster.api_url}/")
    yield opened
    opened.close()


def machine_view(page: Page, cluster: Cluster) -> Locator:
    found = pool_report(cluster)
    assert found is not None
    view = page.locator(f'#pool-list article[data-machine="{found.machine}"]')
    view.wait_for(timeout=10_000)
    return view


def memory(report: PoolReport) -> str:
    """The memory the pool counts against its budget, as the page writes it."""
    return f"{report.used_bytes / GIB:.2f} / {report.budget_bytes / GIB:.2f} GiB"


def shows_the_pools_memory(view: Locator, cluster: Cluster) -> bool:
    found = pool_report(cluster)
    meter = view.locator(".memory meter")
    return (
        found is not None
        and view.locator(".used").text_content() == memory(found)
        and meter.get_attribute("value") == str(found.used_bytes)
        and meter.get_attribute("max") == str(found.budget_bytes)
    )


def test_a_loaded_model_shows_on_its_machine_with_its_worker_its_memory_and_its_load(
    page: Page, cluster: Cluster, client: openai.OpenAI
) -> None:
    view = machine_view(page, cluster)
    assert page.locator("#pools-empty").is_hidden()
    assert ask(client, "alpha")

    row = view.locator('table.held tr[data-model="alpha"]')
    wait_until(lambda: row.get_attribute("data-state") == "loaded", 10, "alpha shown loaded")
    found = pool_report(cluster)
    assert found is not None
    holds = next(h for h in found.held if h.model == "alpha")
    cells = row.locator("td")
    assert cells.nth(1).text_content() == "loaded"
    assert cells.nth(2).text_content() == holds.worker_id
    # The worker the pool says holds alpha is the live worker serving it.
    serving = page.locator(f'#workers tr[data-worker="{holds.worker_id}"]')
    serving.wait_for(timeout=10_000)
    assert serving.locator("td").nth(2).text_content() == "alpha"
    wait_until(lambda: shows_the_pools_memory(view, cluster), 10, "the pool's memory shown")
    found = pool_report(cluster)
    assert found is not None and found.used_bytes > 0

    load = next(e for e in found.events if e.what == "load" and e.model == "alpha")
    event = view.locator('table.events tr[data-what="load"][data-model="alpha"]')
    event.wait_for(timeout=10_000)
    assert event.locator("td").nth(3).text_content() == f"{load.seconds:.2f}s"
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "page-pools-1400.png"), full_page=True)


def test_keep_alive_zero_shows_the_models_unload(
    page: Page, cluster: Cluster, client: openai.OpenAI
) -> None:
    view = machine_view(page, cluster)
    assert ask(client, "alpha", keep_alive=0)
    event = view.locator('table.events tr[data-what="unload"][data-model="alpha"]')
    event.wait_for(timeout=30_000)
    assert event.locator("td").nth(1).text_content() == "unload"
    held = view.locator('table.held tr[data-model="alpha"]')
    wait_until(lambda: held.count() == 0, 10, "alpha gone from the models held")
