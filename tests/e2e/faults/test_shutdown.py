"""SIGTERM on a worker: it drains, hands back what it cannot finish, leaves and exits 0.

Point 3 of the fault contract: a rolling restart under load (start the new worker, then
SIGTERM the old one) loses no request; past the drain timeout, what still runs is handed back.
"""

from __future__ import annotations

import json
import signal
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import pytest

from api.queue.broker import standalone
from shared.queue.jobs import GenerationJob
from shared.wire.events import RequeuedEvent, decode_event
from shared.wire.generation.sampling import SamplingParams
from tests.e2e.faults.conftest import exactly_workers, started_ids
from tests.support import MODEL, STORY, Reply, Stream, chat_body, post, rq_job, rq_queue
from worker.ops.cluster import Cluster, wait_until

CHAT = "/v1/chat/completions"


@pytest.fixture(scope="module")
def cluster(start_cluster: Callable[..., Cluster]) -> Cluster:
    return start_cluster(workers=2, env={"MLXQ_BATCH_SIZE": "4"})


def _load(cluster: Cluster, stop: threading.Event) -> list[Reply]:
    """Requests one after another, alternately streamed and not, until `stop`."""
    replies: list[Reply] = []
    n = 0
    while not stop.is_set():
        n += 1
        if n % 2:
            replies.append(post(cluster.api_url, CHAT, chat_body(max_tokens=12)))
            continue
        stream = Stream(cluster.api_url, chat_body(max_tokens=12))
        frames = stream.rest()
        last = json.loads(frames[-2]) if len(frames) > 1 else {}
        ok = frames[-1:] == ["[DONE]"] and "choices" in last
        replies.append(Reply(200 if ok else 500, {}, {"frames": frames}, 0.0, 0.0))
    return replies


def _terminate(cluster: Cluster) -> int:
    """SIGTERM the oldest worker; its exit status."""
    old = cluster.workers[0]
    old.proc.send_signal(signal.SIGTERM)
    status = old.proc.wait(timeout=60)
    cluster.workers.remove(old)
    assert cluster.redis().zscore(cluster.keys.workers(MODEL), old.worker_id) is None
    return status


def test_a_rolling_restart_under_load_loses_no_request(cluster: Cluster) -> None:
    exactly_workers(cluster, 2)
    stop = threading.Event()
    with ThreadPoolExecutor(4) as pool:
        clients = [pool.submit(_load, cluster, stop) for _ in range(4)]
        try:  # a failure here must still stop the load, or the pool waits for it for good
            wait_until(lambda: len(started_ids(cluster)) >= 2, 60, "the load to run")
            assert _terminate(cluster) == 0
            cluster.start_worker(MLXQ_DRAIN_TIMEOUT_S="1")  # the replacement, for the next test
            assert _terminate(cluster) == 0
            time.sleep(1.0)  # the replacement serves alone
        finally:
            stop.set()
        replies = [r for c in clients for r in c.result(timeout=120)]

    failed = [r.body for r in replies if r.status != 200]
    assert not failed
    assert len(replies) >= 8


def test_past_the_drain_timeout_running_jobs_are_handed_back_and_the_worker_exits_0(
    cluster: Cluster,
) -> None:
    (worker,) = exactly_workers(cluster, 1, MLXQ_DRAIN_TIMEOUT_S="1")
    redis = cluster.redis()
    stream = Stream(cluster.api_url, chat_body(max_tokens=2000))
    stream.read_tokens(1)
    bulk = GenerationJob(  # greedy on a long story: still running when the drain times out
        job_id="resp_drain",
        model=MODEL,
        replay_ttl_s=600,  # a background response: its event log is its record
        messages=STORY,
        max_tokens=2000,
        sampling=SamplingParams(temperature=0),
    )
    standalone(cluster.settings()).submit_bulk([bulk])
    wait_until(lambda: rq_job(redis, bulk.job_id).get_status() == "started", 30, "the bulk job")

    worker.proc.send_signal(signal.SIGTERM)
    error = json.loads(stream.rest()[-1])
    assert worker.proc.wait(timeout=30) == 0
    cluster.workers.remove(worker)

    assert error["error"]["code"] == "worker_lost"
    assert rq_job(redis, bulk.job_id).get_status() == "queued"
    queue = rq_queue(redis, cluster.keys.background_queue(MODEL)).key
    assert redis.lrange(queue, 0, -1) == [bulk.job_id.encode()]
    replay = [decode_event(e) for e in redis.lrange(cluster.keys.replay(bulk.job_id), 0, -1)]
    assert replay == [RequeuedEvent(attempt=2)]
