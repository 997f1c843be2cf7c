"""A job as RQ's record holds it, for those who act on jobs no worker runs (the reaper, a pool
agent whose load failed): the job it carries (`queued_job`, `generation_job`), where its events
go (`route_of`), and an event told to whoever follows it (`announce`).
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError
from rq.job import Job

from shared.queue.jobs import EMBEDDING_JOB_FUNCTION, EmbeddingJob, GenerationJob, QueuedJob
from shared.queue.keys import Keys
from shared.wire.events import Event, encode_event, encode_frame
from worker.runtime.publish import Route


def queued_job(job: Job) -> QueuedJob | None:
    """The job RQ's record carries, generation or embedding, if it is one."""
    if job.func_name == EMBEDDING_JOB_FUNCTION:
        try:
            return EmbeddingJob.model_validate(job.args[0])
        except (ValidationError, IndexError, TypeError):
            return None
    return generation_job(job)


def generation_job(job: Job) -> GenerationJob | None:
    """The generation job RQ's record carries, if it is one."""
    try:
        return GenerationJob.model_validate(job.args[0])
    except (ValidationError, IndexError, TypeError):
        return None


def route_of(keys: Keys, job_id: str, job: Job | None) -> Route:
    """Where the job's events go (worker/runtime/publish.py), from its RQ record."""
    queued = queued_job(job) if job is not None else None
    if queued is None:
        return Route.of(keys, job_id, None, replayed=False)
    return Route.of(keys, job_id, queued.reply_to, queued.replayed)


def announce(
    pipe: Any, keys: Keys, job: Job, event: Event, replay_ttl_s: int, *, reset: bool
) -> None:
    """Queue the event on `pipe`: the replay log if the job keeps one (reset first if asked),
    then the channel."""
    data = encode_event(event)
    route = route_of(keys, job.id, job)
    if route.replay is not None:
        if reset:
            pipe.delete(route.replay)
        pipe.rpush(route.replay, data)
        pipe.expire(route.replay, replay_ttl_s)
    pipe.publish(route.channel, encode_frame([(job.id, data)]))
