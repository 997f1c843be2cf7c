"""Deadlines: a job that waited too long is not served late; a generation that runs too long
ends as configured ("length", or an error).

Point 7 of the fault contract. One worker with a single slot, so a second job must queue; the
API gives interactive jobs a 1 s queue deadline and a 1.5 s run limit (MLXQ_QUEUE_TIMEOUT_S,
MLXQ_RUN_LIMIT_S). Jobs enqueued directly carry their own limits (shared/queue/jobs.py JobLimits).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import pytest

from shared.queue.jobs import JOB_FUNCTION, GenerationJob, JobLimits
from shared.wire.events import DoneEvent, ErrorEvent, Event, decode_event
from shared.wire.generation.sampling import SamplingParams
from tests.e2e.faults.conftest import started_ids
from tests.support import MODEL, chat_body, post, rq_job, rq_queue
from worker.ops.cluster import Cluster, wait_until

CHAT = "/v1/chat/completions"
RUN_LIMIT_S = 1.5


@pytest.fixture(scope="module")
def cluster(start_cluster: Callable[..., Cluster]) -> Cluster:
    env = {
        "MLXQ_BATCH_SIZE": "1",
        "MLXQ_QUEUE_TIMEOUT_S": "1",
        "MLXQ_RUN_LIMIT_S": str(RUN_LIMIT_S),
    }
    cluster = start_cluster(env=env)
    # The tests time generations: the worker's first forwards (compiled on first use, read from a
    # cold disk on a fresh machine) come before them, in a request that may wait in the queue.
    warm = chat_body(max_tokens=4)
    wait_until(lambda: post(cluster.api_url, CHAT, warm).status == 200, 60, "a first answer")
    return cluster


def _run_directly(cluster: Cluster, job: GenerationJob) -> list[Event]:
    """Enqueue a job as a producer other than the API would; its events once it ended (from
    its replay log: the jobs here keep one, as stored responses do)."""
    redis = cluster.redis()
    # Someone listens, as the API would: an interactive job nobody hears is cancelled.
    listening = redis.pubsub()
    listening.subscribe(cluster.keys.events(job.job_id))
    queue = rq_queue(redis, cluster.keys.queue(MODEL))
    queue.enqueue_call(JOB_FUNCTION, args=(job.model_dump(mode="json"),), job_id=job.job_id)
    wait_until(lambda: rq_job(redis, job.job_id).get_status() == "finished", 60, job.job_id)
    listening.close()
    return [decode_event(e) for e in redis.lrange(cluster.keys.replay(job.job_id), 0, -1)]


def test_a_generation_past_its_run_limit_ends_with_length_and_a_queued_job_past_its_deadline_fails(
    cluster: Cluster,
) -> None:
    # A job of the warm-up may still read as started: only a job that was not there before
    # is the long one, and the late one must be posted after it.
    before = set(started_ids(cluster))
    with ThreadPoolExecutor(1) as pool:
        long = pool.submit(post, cluster.api_url, CHAT, chat_body(max_tokens=2000))
        wait_until(lambda: len(set(started_ids(cluster)) - before) == 1, 10, "the long job")
        late = post(cluster.api_url, CHAT, chat_body(max_tokens=4))  # behind it, one slot
        reply = long.result(timeout=60)

    assert reply.status == 200
    assert reply.body["choices"][0]["finish_reason"] == "length"
    usage = reply.body["usage"]
    assert 0 < usage["completion_tokens"] < 2000
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert RUN_LIMIT_S <= reply.seconds < RUN_LIMIT_S + 3
    assert late.status == 503
    assert late.body["error"]["code"] == "queue_timeout"
    assert late.seconds < 3.0


def test_a_worker_fails_a_job_it_takes_after_its_queue_deadline_without_running_it(
    cluster: Cluster,
) -> None:
    stale = JobLimits(queue_deadline=time.time() - 1)
    job = GenerationJob(
        job_id="resp_stale", model=MODEL, prompt="Once", limits=stale, replay_ttl_s=60
    )
    events = _run_directly(cluster, job)
    assert len(events) == 1
    assert isinstance(events[0], ErrorEvent)
    assert events[0].error.code == "queue_timeout"
    assert rq_job(cluster.redis(), job.job_id).return_value()["finish_reason"] == "error"  # type: ignore[index]


def test_a_run_limit_can_end_the_generation_with_an_error_instead(cluster: Cluster) -> None:
    limits = JobLimits(run_limit_s=0.5, on_run_limit="error")
    job = GenerationJob(
        job_id="resp_slow",
        model=MODEL,
        prompt="Once",
        max_tokens=2000,
        # Sampled, a story can end before the limit: its end tokens are never drawn.
        sampling=SamplingParams(temperature=0, logit_bias={2: -100, 0: -100}),
        limits=limits,
        replay_ttl_s=60,
    )
    events = _run_directly(cluster, job)
    assert isinstance(events[-1], ErrorEvent)
    assert events[-1].status == 504
    assert events[-1].error.code == "generation_timeout"
    assert not any(isinstance(e, DoneEvent) for e in events)


def test_the_run_limit_counts_from_the_first_token_so_a_long_prefill_is_not_cut(
    cluster: Cluster,
) -> None:
    """A prompt whose prefill alone takes longer than the run limit is answered: the limit
    bounds generation, and a 30,000-token prompt prefills for many minutes on a CPU."""
    words = " ".join(f"word{i}" for i in range(250))  # about 900 tokens: seconds of prefill
    body = {**chat_body(max_tokens=3), "messages": [{"role": "user", "content": words}]}
    reply = post(cluster.api_url, CHAT, body)
    assert reply.status == 200, reply.body
    assert reply.seconds > RUN_LIMIT_S  # the prefill outlasted the limit...
    assert reply.body["usage"]["completion_tokens"] == 3  # ...and the answer was not cut
