"""Backpressure: a full queue is refused at once with 429 and Retry-After; memory stays flat.

Point 6 of the fault contract (and the API side of point 7's queue deadline). No model runs
here: a stand-in worker is made live by hand (a fresh heartbeat and a subscriber on its
presence channel, shared/queue/liveness.py) and never takes a job, so the queue fills.
"""

from __future__ import annotations

import http.client
import json
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlparse

import pytest

from tests.support import MODEL, chat_body, post, rq_queue, stand_in_worker
from worker.ops.cluster import Cluster, rss_mb, wait_until

CHAT = "/v1/chat/completions"
API_ENV = {
    "MLXQ_QUEUE_CAP": "2",
    "MLXQ_QUEUE_TOKEN_CAP": "100",
    "MLXQ_QUEUE_TIMEOUT_S": "2",
    "MLXQ_RETRY_AFTER_S": "3",
    "MLXQ_API_CONNECTIONS": "16",
}
FLOOD = 4_000  # refused requests whose memory is measured


@pytest.fixture(scope="module")
def cluster(start_cluster: Callable[..., Cluster]) -> Iterator[Cluster]:
    """The API and a stand-in for a worker that never takes a job: a live heartbeat and a
    presence subscription, so that requests are admitted and then wait."""
    cluster = start_cluster(workers=0, heartbeat_s=60.0, env=API_ENV)
    with stand_in_worker(cluster.redis(), cluster.keys):
        yield cluster


def _queue_key(cluster: Cluster) -> str:
    return rq_queue(cluster.redis(), cluster.keys.queue(MODEL)).key


def _assert_queue_full(reply_status: int, headers: dict[str, str], body: dict[str, object]) -> None:
    assert reply_status == 429
    assert headers["retry-after"] == "3"
    error = body["error"]
    assert isinstance(error, dict)
    assert error["type"] == "rate_limit_error"
    assert error["code"] == "queue_full"


def test_over_the_token_cap_a_request_gets_429_at_once_and_a_late_job_503(
    cluster: Cluster,
) -> None:
    redis = cluster.redis()
    big = chat_body(messages=[{"role": "user", "content": "word " * 200}], max_tokens=4)
    with ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(post, cluster.api_url, CHAT, big)  # admitted: the queue was empty
        wait_until(lambda: redis.llen(_queue_key(cluster)) == 1, 10, "the big job to be queued")
        refused = post(cluster.api_url, CHAT, chat_body(max_tokens=4))
        late = waiting.result(timeout=30)

    _assert_queue_full(refused.status, refused.headers, refused.body)
    assert "tokens" in refused.body["error"]["message"]
    assert refused.seconds < 2.0  # at once: before the 2 s queue timeout
    assert late.status == 503
    assert late.body["error"]["code"] == "queue_timeout"
    assert 2.0 <= late.seconds < 8.0
    assert redis.llen(_queue_key(cluster)) == 0  # withdrawn
    assert int(redis.get(cluster.keys.backlog_tokens(MODEL)) or 0) == 0


def _flood(base_url: str, n: int, statuses: list[int]) -> None:
    url = urlparse(base_url)
    conn = http.client.HTTPConnection(url.hostname or "", url.port, timeout=30)
    body = json.dumps(chat_body(max_tokens=4))
    headers = {"Content-Type": "application/json"}
    for _ in range(n):
        conn.request("POST", CHAT, body, headers)
        response = conn.getresponse()
        response.read()
        statuses.append(response.status)
    conn.close()


def _flood_in_parallel(base_url: str, total: int, clients: int = 4) -> list[int]:
    statuses: list[int] = []
    threads = [
        threading.Thread(target=_flood, args=(base_url, total // clients, statuses))
        for _ in range(clients)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return statuses


def test_a_flood_on_a_full_queue_is_refused_at_once_and_memory_stays_bounded(
    cluster: Cluster,
) -> None:
    redis = cluster.redis()
    redis.rpush(_queue_key(cluster), "chatcmpl-filler1", "chatcmpl-filler2")  # the cap: 2
    one = post(cluster.api_url, CHAT, chat_body(max_tokens=4))
    _assert_queue_full(one.status, one.headers, one.body)
    assert "jobs" in one.body["error"]["message"]
    assert one.seconds < 2.0

    (pid,) = cluster.api_worker_pids()
    assert set(_flood_in_parallel(cluster.api_url, 500)) == {429}  # warm up
    before = rss_mb(pid)
    started = time.monotonic()
    statuses = _flood_in_parallel(cluster.api_url, FLOOD)
    seconds = time.monotonic() - started
    after = rss_mb(pid)
    print(f"{FLOOD:,} refused in {seconds:.1f} s; API RSS {before:.1f} MB -> {after:.1f} MB")

    assert len(statuses) == FLOOD
    assert set(statuses) == {429}
    # A refusal that kept 1.5 KB would show as 6 MB.
    assert after - before < 6.0
    assert redis.llen(_queue_key(cluster)) == 2
