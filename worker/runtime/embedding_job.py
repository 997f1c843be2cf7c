"""The embedding job function RQ runs, and the refusal of a job sent to the wrong kind of model.

`run_embedding` (`shared.queue.jobs.EMBEDDING_JOB_FUNCTION`) runs in a slot thread of a worker
that serves an embedding model and has bound its runtime with `bind`: it takes the job out of
the model's backlog, prepares it (a 400 for an input the model cannot take), hands it to the
embedding loop and waits; the vectors go out on the job's channel, the outcome is RQ's record
and the fleet's figures (worker/runtime/job_function.py `report`). A job whose kind the worker
does not serve (chat on an embedding model, embeddings on a chat model) is answered with a
400 naming the model, so the client hears of it at once instead of waiting out its deadline.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError
from redis import Redis
from redis.commands.core import Script
from rq import get_current_job

from shared.queue.jobs import EmbeddingJob, JobOutcome
from shared.queue.keys import Keys
from shared.wire.errors import InvalidRequestError, MLXQError, QueueTimeoutError
from shared.wire.events import ErrorEvent
from worker.engine.embedding.engine import EmbeddingEngine
from worker.runtime import job_function
from worker.runtime.embedding_loop import EmbeddingLoop
from worker.runtime.publish import EventSink, Route


@dataclass(frozen=True)
class EmbeddingRuntime:
    """What an embedding job needs from its worker process."""

    engine: EmbeddingEngine
    loop: EmbeddingLoop
    sink: EventSink
    redis: Redis
    keys: Keys
    job_timeout_s: float
    release: Script  # shared/queue/backlog.py RELEASE, registered on `redis`
    worker_id: str


_runtime: EmbeddingRuntime | None = None


def bind(runtime: EmbeddingRuntime) -> None:
    global _runtime
    _runtime = runtime


def serves_embeddings() -> bool:
    return _runtime is not None


def run_embedding(payload: dict[str, Any]) -> dict[str, Any]:
    current = get_current_job()
    if current is None:
        raise RuntimeError("run_embedding runs only as an RQ job")
    rt, started_at = _runtime, time.time()
    if rt is None:
        return refuse("a chat model; it does not serve /v1/embeddings")(payload)
    try:
        job = _parse(current.id, payload)
    except MLXQError as err:
        route = Route.of(rt.keys, current.id, job_function.reply_to(payload), replayed=False)
        rt.sink.send([(route, ErrorEvent.from_error(err))])
        return _failed(err).model_dump()
    route = Route.of(rt.keys, job.job_id, job.reply_to, job.replayed)
    try:
        outcome = _embed(rt, job, route)
    except MLXQError as err:
        rt.sink.send([(route, ErrorEvent.from_error(err))])
        outcome = _failed(err)
    job_function.report(rt.redis, rt.keys, rt.worker_id, current, job, outcome, started_at)
    return outcome.model_dump()


def _embed(rt: EmbeddingRuntime, job: EmbeddingJob, route: Route) -> JobOutcome:
    if job_function.taken(rt.redis, rt.keys, rt.release, job):
        return JobOutcome(finish_reason="cancelled", prompt_tokens=0, completion_tokens=0)
    deadline = job.limits.queue_deadline
    if deadline is not None and time.time() > deadline:
        raise QueueTimeoutError(
            "The job waited in the queue past its deadline and was not started; retry later."
        )
    prepared = rt.engine.prepare(job)
    return rt.loop.submit(prepared, route).result(timeout=rt.job_timeout_s)


def _parse(job_id: str, payload: dict[str, Any]) -> EmbeddingJob:
    try:
        job = EmbeddingJob.model_validate(payload)
    except ValidationError as err:
        raise InvalidRequestError(f"malformed job payload: {err.error_count()} errors") from err
    if job.job_id != job_id:
        raise InvalidRequestError("job payload does not match its RQ job id")
    return job


def _failed(err: MLXQError) -> JobOutcome:
    return JobOutcome(
        finish_reason="error", prompt_tokens=0, completion_tokens=0, error=err.message
    )


def refuse(what: str) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """A job function that answers any job with a 400: this worker's model is `what`."""

    def refused(payload: dict[str, Any]) -> dict[str, Any]:
        current = get_current_job()
        rt = _runtime or job_function.bound()
        if current is None or rt is None:
            raise RuntimeError("a job function runs only as an RQ job inside an mlxq worker")
        model = str(payload.get("model", ""))
        job_function.release_backlog(rt.redis, rt.keys, rt.release, model, current.id)
        err = InvalidRequestError(f"The model '{model}' is {what}.", param="model")
        route = Route.of(rt.keys, current.id, job_function.reply_to(payload), replayed=False)
        rt.sink.send([(route, ErrorEvent.from_error(err))])
        return _failed(err).model_dump()

    return refused
