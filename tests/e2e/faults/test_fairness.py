"""Fair sharing between API keys on the real stack: key A queues 60 requests, each at the most
urgent `priority` there is, then key B sends one at the default; B's request starts within about
one slot turnover (a few of A's generations, the API being busy with A's open requests), not
after A's 60: A's priority orders A's own jobs, never B's turn. Its own cluster: one worker with
two slots, the API with two keys."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import httpx
import pytest
from httpx_sse import connect_sse

from shared.wire.chat.completions import PRIORITY_LIMIT
from tests.support import CHAT, MODEL, rq_queue
from worker.ops.cluster import Cluster

KEY_A, KEY_B = "sk-mlxq-fair-alpha-1f2e", "sk-mlxq-fair-beta-9c8d"
FLOOD = 60
BODY = {
    "model": MODEL,
    "messages": [{"role": "user", "content": "Count to ten."}],
    "max_tokens": 16,
}


@pytest.fixture(scope="module")
def cluster(start_cluster: Callable[..., Cluster]) -> Cluster:
    env = {
        "MLXQ_API_KEYS": f"{KEY_A},{KEY_B}",
        "MLXQ_API_CONNECTIONS": str(FLOOD + 64),
        "MLXQ_BATCH_SIZE": "2",
        "MLXQ_QUEUE_TIMEOUT_S": "600",
    }
    return start_cluster(env=env)


def first_token_s(cluster: Cluster, key: str) -> tuple[float, float]:
    """A streamed request: seconds to its first content chunk, and to its end."""
    started = time.monotonic()
    first = None
    headers = {"Authorization": f"Bearer {key}"}
    with (
        httpx.Client(base_url=cluster.api_url, timeout=600) as client,
        connect_sse(client, "POST", CHAT, json={**BODY, "stream": True}, headers=headers) as sse,
    ):
        for event in sse.iter_sse():
            if first is None and '"content":"' in event.data and '"content":""' not in event.data:
                first = time.monotonic() - started
    assert first is not None
    return first, time.monotonic() - started


async def _flood_then_ask(cluster: Cluster) -> tuple[float, int]:
    """Key A's flood, then key B's request once A's jobs wait; B's time to its first token and
    how many of A's jobs were still queued when B was sent."""
    queue = rq_queue(cluster.redis(), cluster.keys.queue(MODEL))
    headers = {"Authorization": f"Bearer {KEY_A}"}
    limits = httpx.Limits(max_connections=FLOOD + 8)
    urgent = {**BODY, "priority": -PRIORITY_LIMIT}
    async with httpx.AsyncClient(base_url=cluster.api_url, timeout=600, limits=limits) as client:
        flood = [
            asyncio.create_task(client.post(CHAT, json=urgent, headers=headers))
            for _ in range(FLOOD)
        ]
        while queue.count < FLOOD - 10:
            await asyncio.sleep(0.1)
        waiting = queue.count
        b_first, _ = await asyncio.to_thread(first_token_s, cluster, KEY_B)
        for task in flood:
            task.cancel()
        await asyncio.gather(*flood, return_exceptions=True)
    return b_first, waiting


def test_a_key_flooding_the_queue_at_the_most_urgent_priority_does_not_starve_another_key(
    cluster: Cluster,
) -> None:
    first_token_s(cluster, KEY_B)  # warm up
    idle_first, one_generation = first_token_s(cluster, KEY_A)
    b_first, waiting = asyncio.run(_flood_then_ask(cluster))
    print(
        f"\nkey B, time to first token: idle {idle_first:.2f} s; behind {waiting} queued requests"
        f" of key A at priority {-PRIORITY_LIMIT} {b_first:.2f} s; one generation takes"
        f" {one_generation:.2f} s, so A's queue in arrival order would hold B about"
        f" {waiting / 2 * one_generation:.0f} s"
    )
    assert waiting >= FLOOD - 10
    # A slot turnover or two, and an API busy with A's open requests: well under half of what
    # A's queue in arrival order would put ahead of B (~25 generations). Measured at idle, a
    # generation is shorter than during the flood on a machine the other tests share (0.4 s
    # alone, 10 s beside the rest of the suite, against 26 s in arrival order).
    assert b_first <= idle_first + waiting / 2 * one_generation / 2
