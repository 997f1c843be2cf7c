"""A worker dies (SIGKILL): nothing waits on it for long, nothing it held is lost.

Points 1 and 8 of the fault contract: streams and requests on a killed worker end with an
OpenAI error within two heartbeats; its bulk jobs run again on a live worker and finish exactly
once; with no worker left, queued requests fail within the heartbeat window and new ones at once.
"""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import pytest
from redis import Redis
from rq.worker import Worker as RQWorker

from api.queue.broker import standalone
from shared.queue.jobs import JOB_FUNCTION, GenerationJob
from shared.queue.liveness import LIVE_FACTOR
from shared.wire.events import DoneEvent, RequeuedEvent, StartedEvent, decode_event
from shared.wire.generation.sampling import SamplingParams
from tests.e2e.faults.conftest import HEARTBEAT_S, exactly_workers, holder, started_ids
from tests.support import MODEL, STORY, Stream, chat_body, post, rq_job, rq_queue
from worker.ops.cluster import Cluster, wait_until
from worker.runtime.serve import EXIT_BURIED

CHAT = "/v1/chat/completions"
LONG = 2000


@pytest.fixture(scope="module")
def cluster(start_cluster: Callable[..., Cluster]) -> Cluster:
    return start_cluster(env={"MLXQ_BATCH_SIZE": "4"})


def test_a_killed_worker_ends_streams_and_requests_with_an_error_within_two_heartbeats(
    cluster: Cluster,
) -> None:
    (worker,) = exactly_workers(cluster, 1)
    stream = Stream(cluster.api_url, chat_body(max_tokens=LONG))
    stream.read_tokens(2)
    with ThreadPoolExecutor(1) as pool:
        whole = pool.submit(post, cluster.api_url, CHAT, chat_body(max_tokens=LONG))
        wait_until(lambda: len(started_ids(cluster, worker)) == 2, 60, "both jobs to run")
        cluster.kill_worker(worker)
        killed = time.monotonic()
        frames = stream.rest()
        stream_s = time.monotonic() - killed
        reply = whole.result(timeout=30)

    assert frames, "the stream ended without an error frame"
    error = json.loads(frames[-1])
    assert set(error) == {"error"}
    assert error["error"]["code"] == "worker_lost"
    assert set(error["error"]) == {"message", "type", "param", "code"}
    # Two heartbeats to notice, plus the error's way out through a loaded machine.
    assert stream_s < 2 * HEARTBEAT_S + 2
    assert reply.status == 503
    assert reply.body["error"]["code"] == "worker_lost"
    assert reply.ended - killed < 2 * HEARTBEAT_S + 2


def _replay(redis: Redis, cluster: Cluster, job_id: str) -> list[object]:
    return [decode_event(e) for e in redis.lrange(cluster.keys.replay(job_id), 0, -1)]


def test_bulk_jobs_of_a_killed_worker_run_again_on_a_live_one_and_finish_exactly_once(
    cluster: Cluster,
) -> None:
    exactly_workers(cluster, 2)
    redis = cluster.redis()
    broker = standalone(cluster.settings())
    jobs = [
        GenerationJob(
            job_id=f"resp_bulk{i}",
            model=MODEL,
            replay_ttl_s=600,  # a background response: its event log is its record
            messages=STORY,
            max_tokens=12,
            sampling=SamplingParams(temperature=0),
        )
        for i in range(4)
    ]
    for job in jobs:
        broker.submit_bulk([job])
    ids = [j.job_id for j in jobs]
    wait_until(lambda: rq_job(redis, ids[0]).get_status() == "started", 60, "a bulk job to run")
    victim = holder(cluster, ids[0])
    names = {j: rq_job(redis, j).worker_name or "" for j in ids}
    lost = [j for j in ids if names[j].startswith(victim.worker_id + ".")]
    cluster.kill_worker(victim)

    wait_until(
        lambda: all(rq_job(redis, j).get_status() == "finished" for j in ids), 180, "all to finish"
    )
    for job_id in ids:
        events = _replay(redis, cluster, job_id)
        assert sum(isinstance(e, DoneEvent) for e in events) == 1, (job_id, events)
        assert sum(isinstance(e, StartedEvent) for e in events) == 1, (job_id, events)
        results = rq_job(redis, job_id).results()
        assert len(results) == 1, (job_id, results)
    for job_id in lost:
        first = _replay(redis, cluster, job_id)[0]
        assert first == RequeuedEvent(attempt=2)
        assert rq_job(redis, job_id).meta["attempt"] == 2
    assert lost


def test_a_killed_worker_leaves_rqs_worker_registry_when_it_is_declared_dead(
    cluster: Cluster,
) -> None:
    victim, survivor = exactly_workers(cluster, 2)
    redis = cluster.redis()

    def slots_of(worker_id: str) -> list[str]:
        return [w.name for w in RQWorker.all(connection=redis) if w.name.startswith(worker_id)]

    assert slots_of(victim.worker_id) and slots_of(survivor.worker_id)
    cluster.kill_worker(victim)
    wait_until(lambda: redis.exists(cluster.keys.dead(victim.worker_id)), 30, "the burial")
    assert slots_of(victim.worker_id) == []  # `rq info` no longer lists them, busy or not
    assert slots_of(survivor.worker_id)


def test_a_frozen_worker_declared_dead_exits_when_it_wakes_and_its_job_finishes_once(
    cluster: Cluster,
) -> None:
    exactly_workers(cluster, 2)
    redis = cluster.redis()
    job = GenerationJob(
        job_id="resp_sleeper",
        model=MODEL,
        messages=STORY,
        max_tokens=24,
        sampling=SamplingParams(temperature=0, logit_bias={2: -100, 0: -100}),  # still running
        replay_ttl_s=600,
    )
    standalone(cluster.settings()).submit_bulk([job])
    wait_until(lambda: rq_job(redis, job.job_id).get_status() == "started", 60, "the job")
    sleeper = holder(cluster, job.job_id)
    sleeper.proc.send_signal(signal.SIGSTOP)  # a Mac that went to sleep
    try:
        wait_until(lambda: rq_job(redis, job.job_id).get_status() == "finished", 90, "a rerun")
    finally:
        sleeper.proc.send_signal(signal.SIGCONT)
    assert sleeper.proc.wait(timeout=30) == EXIT_BURIED
    cluster.workers.remove(sleeper)

    events = _replay(redis, cluster, job.job_id)
    assert events[0] == RequeuedEvent(attempt=2)
    assert sum(isinstance(e, StartedEvent) for e in events) == 1
    assert sum(isinstance(e, DoneEvent) for e in events) == 1
    assert isinstance(events[-1], DoneEvent)
    assert len(rq_job(redis, job.job_id).results()) == 1


def test_a_job_a_dead_worker_took_but_never_started_goes_back_to_its_queue(
    cluster: Cluster,
) -> None:
    exactly_workers(cluster, 1)
    redis = cluster.redis()
    job = GenerationJob(job_id="batch_req_taken", model=MODEL, prompt="Once", max_tokens=4)
    ghost = "ghost-host.4242"  # a worker killed right after it took the job
    redis.zadd(cluster.keys.workers(MODEL), {ghost: time.time()})
    queue = rq_queue(redis, cluster.keys.batch_queue(MODEL))
    record = queue.create_job(JOB_FUNCTION, args=(job.model_dump(mode="json"),), job_id=job.job_id)
    with redis.pipeline(transaction=True) as pipe:  # enqueued and taken in one step
        queue.enqueue_job(record, pipeline=pipe)
        pipe.lmove(queue.key, cluster.keys.taking(ghost), "LEFT", "RIGHT")
        pipe.execute()
    wait_until(lambda: rq_job(redis, job.job_id).get_status() == "finished", 60, "the job")
    assert redis.zscore(cluster.keys.workers(MODEL), ghost) is None
    assert redis.exists(cluster.keys.dead(ghost))


def test_with_no_worker_left_queued_requests_fail_in_the_heartbeat_window_and_new_ones_at_once(
    cluster: Cluster,
) -> None:
    (worker,) = exactly_workers(cluster, 1)  # 4 slots
    redis = cluster.redis()
    queue = rq_queue(redis, cluster.keys.queue(MODEL)).key
    with ThreadPoolExecutor(5) as pool:
        pending = [
            pool.submit(post, cluster.api_url, CHAT, chat_body(max_tokens=LONG)) for _ in range(5)
        ]
        wait_until(lambda: len(started_ids(cluster, worker)) == 4, 60, "four jobs to run")
        wait_until(lambda: redis.llen(queue) == 1, 10, "the fifth job to wait in the queue")
        cluster.kill_worker(worker)
        killed = time.monotonic()
        replies = [p.result(timeout=30) for p in pending]

    codes = sorted(r.body["error"]["code"] for r in replies)
    assert codes == ["model_not_found"] + ["worker_lost"] * 4
    queued = next(r for r in replies if r.status == 404)
    assert queued.ended - killed < LIVE_FACTOR * HEARTBEAT_S
    assert redis.llen(queue) == 0
    fresh = post(cluster.api_url, CHAT, chat_body(max_tokens=5))
    assert fresh.status == 404
    assert fresh.body["error"]["code"] == "model_not_found"
    assert fresh.seconds < 2.0  # refused at once, not after a queue timeout
