"""The reaper against a real Redis: a dead worker's job is taken over even after a lost race,
a job nobody listens to any more (its API process's reply channel is gone) is cancelled, and a
bulk job that two workers died running is failed rather than run again (the poison counter)."""

from __future__ import annotations

import secrets
import time

from redis import Redis
from rq import Queue, Retry
from rq.executions import Execution
from rq.job import Job, JobStatus
from rq.serializers import JSONSerializer

from shared.queue.config import Settings
from shared.queue.jobs import JOB_FUNCTION, GenerationJob
from shared.queue.keys import Keys
from shared.wire.events import ErrorEvent, RequeuedEvent, decode_event
from worker.runtime.liveness.reaper import POISON_DEATHS, Reaper

MODEL = "reaper-test-model"


def _started_by_dead_worker(redis: Redis, keys: Keys, dead: str) -> Job:
    queue = Queue(keys.queue(MODEL), connection=redis, serializer=JSONSerializer)
    job = queue.create_job(JOB_FUNCTION, args=({},), job_id=f"chatcmpl-{secrets.token_hex(16)}")
    _start(redis, keys, job, dead)
    return job


def _start(redis: Redis, keys: Keys, job: Job, dead: str) -> None:
    """`job` as started by worker `dead`, whose last heartbeat is long past."""
    with redis.pipeline() as pipe:
        job.save(pipeline=pipe)
        Execution.create(job, 3600, pipeline=pipe, worker_name=f"{dead}.0")
        job.prepare_for_execution(f"{dead}.0", pipeline=pipe)
        pipe.zadd(keys.workers(MODEL), {dead: time.time() - 3600})  # last heartbeat long ago
        pipe.execute()


def test_a_take_over_that_loses_a_race_is_retried_on_a_later_sweep(
    redis: Redis, settings: Settings
) -> None:
    keys = Keys(settings.namespace)
    dead = f"gone-host.{secrets.randbelow(10**6)}"
    job = _started_by_dead_worker(redis, keys, dead)
    reaper = Reaper(redis, keys, MODEL, "live-host.1", 0.5, 60, dict, lambda _: None)
    held = reaper._still_held_by

    def touched_meanwhile(pipe: object, watched: Job, worker: str | None) -> bool:
        Redis.from_url(settings.redis_url).hset(watched.key, "touched", 1)  # another writer
        return held(pipe, watched, worker)  # type: ignore[arg-type]

    reaper._still_held_by = touched_meanwhile  # type: ignore[method-assign]
    reaper.sweep()
    reaper.sweep()  # confirmed dead: the take-over loses its WATCH race
    assert job.get_status(refresh=True) == JobStatus.STARTED

    reaper._still_held_by = held  # type: ignore[method-assign]
    reaper.sweep()
    reaper.sweep()
    assert job.get_status(refresh=True) == JobStatus.FAILED
    assert job.id not in job.started_job_registry.get_job_ids(cleanup=False)


def _interactive_job(redis: Redis, keys: Keys, reply_to: str) -> str:
    job = GenerationJob.model_validate(
        {
            "job_id": f"chatcmpl-{secrets.token_hex(16)}",
            "model": MODEL,
            "messages": [{"role": "user", "content": "hi"}],
            "reply_to": reply_to,
        }
    )
    queue = Queue(keys.lanes(MODEL)[0], connection=redis, serializer=JSONSerializer)
    queue.create_job(JOB_FUNCTION, args=(job.model_dump(mode="json"),), job_id=job.job_id).save()
    return job.job_id


def test_a_held_job_whose_api_process_stopped_listening_is_cancelled_after_two_sweeps(
    redis: Redis, settings: Settings
) -> None:
    keys = Keys(settings.namespace)
    heard = _interactive_job(redis, keys, "api-alive")
    orphan = _interactive_job(redis, keys, "api-gone")
    listening = redis.pubsub()
    listening.subscribe(keys.reply("api-alive"))  # the live API process's reply channel
    interactive = keys.lanes(MODEL)[0]
    cancelled: list[str] = []
    reaper = Reaper(
        redis,
        keys,
        MODEL,
        "live-host.1",
        0.5,
        60,
        lambda: {heard: interactive, orphan: interactive},
        cancelled.append,
    )
    reaper.sweep()
    assert cancelled == []  # one sweep may race a subscription being made
    reaper.sweep()
    listening.close()
    assert cancelled == [orphan]


def _bulk_job(redis: Redis, keys: Keys) -> Job:
    """A background response with more RQ retries than the worker deaths it may run through:
    the poison counter, not RQ's retries, ends it."""
    background = Queue(keys.lanes(MODEL)[1], connection=redis, serializer=JSONSerializer)
    job = GenerationJob.model_validate(
        {
            "job_id": f"resp_{secrets.token_hex(8)}",
            "model": MODEL,
            "prompt": "hi",
            "replay_ttl_s": 600,
        }
    )
    return background.create_job(
        JOB_FUNCTION, args=(job.model_dump(mode="json"),), job_id=job.job_id, retry=Retry(max=3)
    )


def test_a_bulk_job_is_requeued_after_its_first_workers_death_and_failed_after_its_second(
    redis: Redis, settings: Settings
) -> None:
    keys = Keys(settings.namespace)
    queued = _bulk_job(redis, keys)
    reaper = Reaper(redis, keys, MODEL, "live-host.1", 0.5, 60, dict, lambda _: None)

    def die_under(job: Job) -> None:
        _start(redis, keys, job, f"gone-host.{secrets.randbelow(10**6)}")
        reaper.sweep()
        reaper.sweep()  # confirmed dead

    die_under(queued)
    again = Job.fetch(queued.id, connection=redis, serializer=JSONSerializer)
    assert again.get_status() == JobStatus.QUEUED
    assert again.meta["deaths"] == 1 and again.meta["attempt"] == 2
    replay = [decode_event(e) for e in redis.lrange(keys.replay(queued.id), 0, -1)]
    assert replay == [RequeuedEvent(attempt=2)]

    die_under(again)
    assert POISON_DEATHS == 2
    assert again.get_status(refresh=True) == JobStatus.FAILED
    assert again.retries_left, "failed by its deaths, with RQ retries still left"
    (*_, last) = [decode_event(e) for e in redis.lrange(keys.replay(queued.id), 0, -1)]
    assert isinstance(last, ErrorEvent) and last.error.code == "worker_lost"
    assert "2 workers died running it" in last.error.message


def test_a_job_handed_back_by_a_drain_does_not_count_as_a_death(
    redis: Redis, settings: Settings
) -> None:
    keys = Keys(settings.namespace)
    queued = _bulk_job(redis, keys)
    stopping = f"stopping-host.{secrets.randbelow(10**6)}"
    reaper = Reaper(redis, keys, MODEL, stopping, 0.5, 60, dict, lambda _: None)
    for _ in range(POISON_DEATHS):
        _start(redis, keys, queued, stopping)
        assert reaper.hand_back(stopping, "it shut down", died=False) == 1
        queued = Job.fetch(queued.id, connection=redis, serializer=JSONSerializer)
        assert queued.get_status() == JobStatus.QUEUED
    assert queued.meta.get("deaths", 0) == 0
