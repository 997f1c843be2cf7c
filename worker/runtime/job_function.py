"""The one job function RQ runs: hand a generation job to the engine loop and wait for it.

RQ imports it by name (`shared.queue.jobs.JOB_FUNCTION`) in a slot thread of a worker process that
has bound its runtime with `bind`; the model stays loaded in that process across jobs.
Everything a client must see goes out on the job's channel; the return value is RQ's record.
The job's limits are kept here: a job taken after its queue deadline is failed without being
run (`queue_timeout`), and one that runs past its run limit is ended by the slot thread, which
waits on it anyway: "length" (a normal end, finish_reason "length") or "error".
A batch line's extra work (skip if its batch stopped, record its answer) is
worker/runtime/batch_lines.py. Once a job has ended, however it ended, its figures go to the
fleet's metrics and recent jobs in one pipeline (shared/observe/metrics.py), off the per-token path,
which also gives back its key's queued tokens (shared/queue/queued_tokens.py).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError
from redis import Redis
from redis.commands.core import Script
from redis.exceptions import RedisError
from rq import get_current_job
from rq.job import Job

from shared.observe import tracing
from shared.observe.logs import log_event
from shared.observe.metrics import JobRecord, record_job
from shared.queue import queued_tokens
from shared.queue.jobs import GenerationJob, JobOutcome, QueuedJob
from shared.queue.keys import Keys, is_valid_id
from shared.wire.completions import Usage
from shared.wire.errors import (
    GenerationError,
    GenerationTimeoutError,
    InvalidRequestError,
    MLXQError,
    QueueTimeoutError,
)
from shared.wire.events import DoneEvent, ErrorEvent, Event
from worker.engine.generation import BatchEngine
from worker.runtime.batch_lines import BatchLines
from worker.runtime.loop import EngineLoop
from worker.runtime.prefix_report import PrefixFigures
from worker.runtime.publish import EventSink, Route

log = logging.getLogger(__name__)
job_log = logging.getLogger(
    "mlxq.job"
)  # one structured line per ended job (shared/observe/logs.py)

# How long a slot waits for the loop to apply the cancel that ends a job at its run limit.
END_GRACE_S = 30.0


@dataclass(frozen=True)
class Runtime:
    """What a job needs from its worker process."""

    engine: BatchEngine
    loop: EngineLoop
    sink: EventSink
    redis: Redis
    keys: Keys
    job_timeout_s: float
    release: Script  # shared/queue/backlog.py RELEASE, registered on `redis`
    worker_id: str
    figures: PrefixFigures | None = None  # this worker's prefix-cache figures (fleet view)


_runtime: Runtime | None = None


def bind(runtime: Runtime) -> None:
    global _runtime
    _runtime = runtime


def bound() -> Runtime | None:
    return _runtime


def run_generation(payload: dict[str, Any]) -> dict[str, Any]:
    if _runtime is None:
        raise RuntimeError("run_generation runs only inside an mlxq worker process")
    current = get_current_job()
    if current is None:
        raise RuntimeError("run_generation runs only as an RQ job")
    rt, job_id, started_at = _runtime, current.id, time.time()
    try:
        job = _parse(job_id, payload)
    except MLXQError as err:  # not a job: nobody reads it back, so no replay log
        route = Route.of(rt.keys, job_id, reply_to(payload), replayed=False)
        _publish(rt, route, ErrorEvent.from_error(err))
        return _failed(err).model_dump()
    route = Route.of(rt.keys, job_id, job.reply_to, job.replayed, job.replay_ttl_s)
    try:
        outcome = _outcome(rt, job, route, current.retries_left or 0)
    except Exception as err:  # a bug, not the client's fault: the client still hears of it now
        log.exception("job %s failed", job_id)
        error = GenerationError(f"the job failed: {type(err).__name__}")
        _publish(rt, route, ErrorEvent.from_error(error))
        _report(rt, current, job, _failed(error), started_at)
        raise
    _report(rt, current, job, outcome, started_at)
    return outcome.model_dump()


def _report(
    rt: Runtime, current: Job, job: GenerationJob, outcome: JobOutcome, started_at: float
) -> None:
    if rt.figures is not None:  # a generation job's prefix-cache figures (prefix_report.py)
        rt.figures.count(outcome.prompt_tokens, outcome.cached_tokens)
    report(rt.redis, rt.keys, rt.worker_id, current, job, outcome, started_at)


def report(
    redis: Redis,
    keys: Keys,
    worker_id: str,
    current: Job,
    job: QueuedJob,
    outcome: JobOutcome,
    started_at: float,
) -> None:
    """Add the ended job to the fleet's figures; a Redis hiccup costs the figures, not the job."""
    enqueued = current.enqueued_at
    record = JobRecord(
        job_id=current.id,
        model=job.model,
        lane=job.lane,
        worker=worker_id,
        owner=job.owner,
        finish_reason=outcome.finish_reason,
        prompt_tokens=outcome.prompt_tokens,
        completion_tokens=outcome.completion_tokens,
        cached_tokens=outcome.cached_tokens,
        enqueued_at=started_at if enqueued is None else enqueued.timestamp(),
        started_at=started_at,
        first_token_at=outcome.first_token_at,
        ended_at=time.time(),
        error=outcome.error,
    )
    log_event(job_log, "job", **record.log_fields())
    times = (record.enqueued_at, record.started_at, record.first_token_at, record.ended_at)
    usage = (record.prompt_tokens, record.completion_tokens)
    tracing.job_spans(job, times, usage, record.finish_reason)
    pipe = redis.pipeline(transaction=False)
    record_job(pipe, keys, record)
    queued_tokens.release_job(pipe, keys, job)
    try:
        pipe.execute()
    except RedisError as err:
        log.warning("could not record job %s in the fleet's metrics: %s", current.id, err)


def _outcome(rt: Runtime, job: GenerationJob, route: Route, retries_left: int) -> JobOutcome:
    if job.batch_line is not None:
        return BatchLines(rt.redis, rt.keys).run(job, lambda: _run(rt, job, route), retries_left)
    outcome = _run(rt, job, route)
    if job.replay_ttl_s is not None:
        rt.redis.expire(rt.keys.replay(job.job_id), job.replay_ttl_s)
    return outcome


def _failed(err: MLXQError) -> JobOutcome:
    return JobOutcome(
        finish_reason="error", prompt_tokens=0, completion_tokens=0, error=err.message
    )


def _parse(job_id: str, payload: dict[str, Any]) -> GenerationJob:
    try:
        job = GenerationJob.model_validate(payload)
    except ValidationError as err:
        raise InvalidRequestError(f"malformed job payload: {err.error_count()} errors") from err
    if job.job_id != job_id:
        raise InvalidRequestError("job payload does not match its RQ job id")
    return job


def reply_to(payload: dict[str, Any]) -> str | None:
    """Where a malformed job's error goes: the API process it names, if that is an id at all."""
    reply_to = payload.get("reply_to")
    return reply_to if isinstance(reply_to, str) and is_valid_id(reply_to) else None


def _run(rt: Runtime, job: GenerationJob, route: Route) -> JobOutcome:
    try:
        return _generate(rt, job, route)
    except MLXQError as err:
        _publish(rt, route, ErrorEvent.from_error(err))
        return _failed(err)


def _generate(rt: Runtime, job: GenerationJob, route: Route) -> JobOutcome:
    if taken(rt.redis, rt.keys, rt.release, job):
        return JobOutcome(finish_reason="cancelled", prompt_tokens=0, completion_tokens=0)
    deadline = job.limits.queue_deadline
    if deadline is not None and time.time() > deadline:
        raise QueueTimeoutError(
            "The job waited in the queue past its deadline and was not started; retry later."
        )
    prepared = rt.engine.prepare(job)
    future = rt.loop.submit(prepared, route)
    limit_s = job.limits.run_limit_s
    try:
        return future.result(timeout=min(limit_s or rt.job_timeout_s, rt.job_timeout_s))
    except TimeoutError:
        if limit_s is None or limit_s >= rt.job_timeout_s:
            raise
    rt.loop.cancel(job.job_id)
    outcome = future.result(timeout=END_GRACE_S)
    if outcome.finish_reason != "cancelled":
        return outcome  # it ended on its own meanwhile
    return _end_at_limit(rt, route, job, outcome, limit_s)


def taken(redis: Redis, keys: Keys, release: Script, job: QueuedJob) -> bool:
    """Take the job out of its model's backlog; True if it was cancelled while queued."""
    pipe = redis.pipeline(transaction=False)
    release(keys=_backlog(keys, job.model), args=[job.job_id, "taken"], client=pipe)
    pipe.exists(keys.cancelled(job.job_id))
    _, cancelled = pipe.execute()
    return bool(cancelled)


def release_backlog(redis: Redis, keys: Keys, release: Script, model: str, job_id: str) -> None:
    """Take a job that will not run out of its model's backlog (a wrong or unreadable job)."""
    try:
        release(keys=_backlog(keys, model), args=[job_id, "taken"], client=redis)
    except (MLXQError, RedisError) as err:  # a model name no key can hold: nothing to release
        log.warning("could not release job %s from the backlog of %r: %s", job_id, model, err)


def _backlog(keys: Keys, model: str) -> list[str]:
    return [keys.backlog(model), keys.backlog_tokens(model), keys.order(model), keys.round(model)]


def _end_at_limit(
    rt: Runtime, route: Route, job: GenerationJob, outcome: JobOutcome, limit_s: float
) -> JobOutcome:
    if job.limits.on_run_limit == "error":
        err = GenerationTimeoutError(f"The generation ran past its limit of {limit_s:g} s.")
        _publish(rt, route, ErrorEvent.from_error(err))
        return outcome.model_copy(update={"finish_reason": "error", "error": err.message})
    usage = Usage(
        prompt_tokens=outcome.prompt_tokens,
        completion_tokens=outcome.completion_tokens,
        total_tokens=outcome.prompt_tokens + outcome.completion_tokens,
    )
    _publish(rt, route, DoneEvent(finish_reason="length", usage=usage))
    return outcome.model_copy(update={"finish_reason": "length"})


def _publish(rt: Runtime, route: Route, event: Event) -> None:
    rt.sink.send([(route, event)])
