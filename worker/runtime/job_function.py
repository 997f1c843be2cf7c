"""The job functions RQ runs: hand a job to the engine loop and wait for it, whatever its kind.

RQ calls `run_generation` or `run_embedding` (`shared.queue.jobs.JOB_FUNCTION`,
`EMBEDDING_JOB_FUNCTION`, through worker/runtime/intake/fixed_job.py) in a slot thread of a worker
process that has bound its runtime with `bind`; the model stays loaded in that process across
jobs. Both run the same steps; what differs by kind (how the job is read, where its events go,
what runs around it, how it ends at its run limit) is its `JobKind`
(worker/runtime/kinds/generation_kind.py, worker/runtime/kinds/embedding_kind.py). A job of the
kind its worker does not serve (chat on an embedding model, embeddings on a chat model) is answered
with a 400 naming the model, so the client hears of it at once instead of waiting out its deadline.
The API refuses such a job before it is queued (shared/queue/model_kinds.py); this is the same
refusal for one that still arrives.

Everything a client must see goes out on the job's channel; the return value is RQ's record.
The job's limits are kept here: a job taken after its queue deadline is failed without being
run (`queue_timeout`), and one that runs past its run limit is ended by the slot thread, which
waits on it anyway (`JobKind.on_run_limit`: "length", a normal end, or "error"). The run limit
counts from the job's first token: a prompt's prefill (minutes, for a 30,000-token prompt on a
CPU) is not running past it, and is bounded by the step budget and RQ's timeout. One that runs
past RQ's job timeout (`MLXQ_JOB_TIMEOUT_S`) is cancelled in the engine the same way before RQ
hears of it, so a retry never runs beside its first copy. Once a job has ended, however it
ended, its figures go to the fleet's metrics and recent jobs in one pipeline
(shared/observe/metrics.py), off the per-token path, which also gives back its key's queued
tokens (shared/queue/queued_tokens.py).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, Protocol, TypeVar

from pydantic import ValidationError
from redis import Redis
from redis.commands.core import Script
from redis.exceptions import RedisError
from rq import get_current_job
from rq.job import Job
from rq.timeouts import JobTimeoutException

from shared.observe import tracing
from shared.observe.logs import log_event
from shared.observe.metrics import JobRecord, record_job
from shared.queue import queued_tokens
from shared.queue.jobs import (
    EMBEDDING_JOB_FUNCTION,
    JOB_FUNCTION,
    EmbeddingJob,
    GenerationJob,
    JobOutcome,
)
from shared.queue.keys import Keys, is_valid_id
from shared.queue.model_kinds import wrong_kind
from shared.wire.chat.completions import Usage
from shared.wire.errors import (
    GenerationError,
    GenerationTimeoutError,
    InvalidRequestError,
    MLXQError,
    QueueTimeoutError,
)
from shared.wire.events import DoneEvent, ErrorEvent, Event
from shared.wire.fleet.catalog import ModelKind
from worker.runtime.loop import EngineLoop, O, P, SteppedEngine, StepReader
from worker.runtime.prefix.prefix_report import PrefixFigures
from worker.runtime.publish import EventSink, Route
from worker.runtime.recency import Recency

log = logging.getLogger(__name__)
# One structured line per ended job (shared/observe/logs.py).
job_log = logging.getLogger("mlxq.job")

# How long a slot waits for the loop to apply the cancel that ends a job at its run limit or at
# RQ's job timeout.
END_GRACE_S = 30.0

J = TypeVar("J", GenerationJob, EmbeddingJob)  # a kind of job: one of shared/queue/jobs.py's
J_contra = TypeVar("J_contra", GenerationJob, EmbeddingJob, contravariant=True)
Run = Callable[[], JobOutcome]


class PreparingEngine(SteppedEngine[P, O], Protocol[J_contra, P, O]):
    """An engine as the job function sees it: `prepare` refuses what it cannot run, in the slot
    thread, before the job reaches the loop."""

    def prepare(self, job: J_contra) -> P: ...


class JobKind(StepReader[P, O], Protocol[J, P, O]):
    """What a kind of job is to the skeleton: how its steps read (`StepReader`), and how the
    job function reads, routes and ends it."""

    @property
    def function(self) -> str:
        """The job function name its jobs are queued with (shared/queue/jobs.py)."""
        ...

    @property
    def job_model(self) -> type[J]: ...

    @property
    def serves(self) -> ModelKind:
        """The kind of model it runs on: a job of another kind is refused
        (shared/queue/model_kinds.py `wrong_kind`)."""
        ...

    def route(self, keys: Keys, job: J) -> Route: ...

    def run(self, redis: Redis, keys: Keys, job: J, retries_left: int, run: Run) -> JobOutcome:
        """Run the job (`run`), with whatever its kind does around it."""
        ...

    def on_run_limit(self, job: J) -> Literal["length", "error"]: ...


@dataclass(frozen=True)
class Runtime(Generic[J, P, O]):
    """What a job needs from its worker process."""

    kind: JobKind[J, P, O]
    engine: PreparingEngine[J, P, O]
    loop: EngineLoop[P, O]
    sink: EventSink
    redis: Redis
    keys: Keys
    job_timeout_s: float
    release: Script  # shared/queue/backlog.py RELEASE, registered on `redis`
    worker_id: str
    figures: PrefixFigures | None = None  # this worker's prefix-cache figures (fleet view)
    # When its last job ended and the keep_alive it asked for (the pool reads them: worker/pool/).
    recency: Recency = field(default_factory=Recency)
    # Run on each prepared job before it enters the loop (worker/runtime/prefix/prefix_fetch.py);
    # True when it waited on something, so that a cancel meanwhile is looked for again.
    prefetch: Callable[[P], bool] | None = None

    @classmethod
    def start(
        cls,
        kind: JobKind[J, P, O],
        engine: PreparingEngine[J, P, O],
        sink: EventSink,
        redis: Redis,
        keys: Keys,
        job_timeout_s: float,
        release: Script,
        worker_id: str,
        figures: PrefixFigures | None = None,
        prefetch: Callable[[P], bool] | None = None,
    ) -> Runtime[J, P, O]:
        """The runtime of a worker that serves `kind` on `engine`, with its engine loop (which
        the worker's main thread runs)."""
        loop = EngineLoop(engine, kind, sink, worker_id)
        plumbing = (sink, redis, keys, job_timeout_s, release, worker_id, figures)
        return cls(kind, engine, loop, *plumbing, prefetch=prefetch)


_runtime: Runtime[Any, Any, Any] | None = None


def bind(runtime: Runtime[J, P, O]) -> EngineLoop[P, O]:
    """Make `runtime` the one this process's job functions run on; its loop, to run."""
    global _runtime
    _runtime = runtime
    return runtime.loop


def run_generation(payload: dict[str, Any]) -> dict[str, Any]:
    return _run_as(JOB_FUNCTION, payload)


def run_embedding(payload: dict[str, Any]) -> dict[str, Any]:
    return _run_as(EMBEDDING_JOB_FUNCTION, payload)


def _run_as(function: str, payload: dict[str, Any]) -> dict[str, Any]:
    current = get_current_job()
    if current is None or _runtime is None:
        raise RuntimeError("a job function runs only as an RQ job inside an mlxq worker")
    if function != _runtime.kind.function:
        return _refused(_runtime, current.id, payload).model_dump()
    return _run_job(_runtime, current, payload).model_dump()


def _run_job(rt: Runtime[J, P, O], current: Job, payload: dict[str, Any]) -> JobOutcome:
    started_at = time.time()
    try:
        job = _parse(rt.kind.job_model, current.id, payload)
    except MLXQError as err:  # not a job: nobody reads it back, so no replay log
        route = Route.of(rt.keys, current.id, _reply_to(payload), replayed=False)
        _publish(rt, route, ErrorEvent.from_error(err))
        return _failed(err)
    route = rt.kind.route(rt.keys, job)
    retries_left = current.retries_left or 0
    try:
        outcome = rt.kind.run(rt.redis, rt.keys, job, retries_left, lambda: _run(rt, job, route))
    except Exception as err:  # a bug, not the client's fault: the client still hears of it now
        log.exception("job %s failed", current.id)
        error = GenerationError(f"the job failed: {type(err).__name__}")
        _publish(rt, route, ErrorEvent.from_error(error))
        report(rt, current, job, _failed(error), started_at)
        raise
    report(rt, current, job, outcome, started_at)
    return outcome


def _refused(rt: Runtime[J, P, O], job_id: str, payload: dict[str, Any]) -> JobOutcome:
    """A job of the kind this worker does not serve, answered with a 400 naming its model."""
    model = str(payload.get("model", ""))
    _release_backlog(rt, model, job_id)
    err = wrong_kind(model, rt.kind.serves)
    route = Route.of(rt.keys, job_id, _reply_to(payload), replayed=False)
    _publish(rt, route, ErrorEvent.from_error(err))
    return _failed(err)


def report(
    rt: Runtime[J, P, O], current: Job, job: J, outcome: JobOutcome, started_at: float
) -> None:
    """Add the ended job to the fleet's figures; a Redis hiccup costs the figures, not the job."""
    if rt.figures is not None:  # a generation job's prefix-cache figures (prefix_report.py)
        rt.figures.count(outcome.prompt_tokens, outcome.cached_tokens)
    rt.recency.note(time.time(), job.keep_alive_s)
    enqueued = current.enqueued_at
    record = JobRecord(
        job_id=current.id,
        model=job.model,
        lane=job.lane,
        worker=rt.worker_id,
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
    pipe = rt.redis.pipeline(transaction=False)
    record_job(pipe, rt.keys, record)
    queued_tokens.release_job(pipe, rt.keys, job)
    try:
        pipe.execute()
    except RedisError as err:
        log.warning("could not record job %s in the fleet's metrics: %s", current.id, err)


def _failed(err: MLXQError) -> JobOutcome:
    return JobOutcome(
        finish_reason="error", prompt_tokens=0, completion_tokens=0, error=err.message
    )


def _parse(model: type[J], job_id: str, payload: dict[str, Any]) -> J:
    try:
        job = model.model_validate(payload)
    except ValidationError as err:
        raise InvalidRequestError(f"malformed job payload: {err.error_count()} errors") from err
    if job.job_id != job_id:
        raise InvalidRequestError("job payload does not match its RQ job id")
    return job


def _reply_to(payload: dict[str, Any]) -> str | None:
    """Where a malformed job's error goes: the API process it names, if that is an id at all."""
    reply_to = payload.get("reply_to")
    return reply_to if isinstance(reply_to, str) and is_valid_id(reply_to) else None


def _run(rt: Runtime[J, P, O], job: J, route: Route) -> JobOutcome:
    try:
        return _start_and_wait(rt, job, route)
    except MLXQError as err:
        _publish(rt, route, ErrorEvent.from_error(err))
        return _failed(err)


def _start_and_wait(rt: Runtime[J, P, O], job: J, route: Route) -> JobOutcome:
    if _taken(rt, job):
        return JobOutcome(finish_reason="cancelled", prompt_tokens=0, completion_tokens=0)
    deadline = job.limits.queue_deadline
    if deadline is not None and time.time() > deadline:
        raise QueueTimeoutError(
            "The job waited in the queue past its deadline and was not started; retry later."
        )
    prepared = rt.engine.prepare(job)
    if rt.prefetch is not None and rt.prefetch(prepared) and _cancelled(rt, job):
        return JobOutcome(finish_reason="cancelled", prompt_tokens=0, completion_tokens=0)
    future = rt.loop.submit(prepared, route)
    limit_s = job.limits.run_limit_s
    try:
        return _awaited(rt, future, job.job_id, limit_s)
    except (TimeoutError, JobTimeoutException):  # RQ raises its job timeout in this thread
        # Out of the engine first, at its own limit or RQ's: a retry never runs beside it.
        rt.loop.cancel(job.job_id)
        outcome = future.result(timeout=END_GRACE_S)
        if outcome.finish_reason != "cancelled":
            return outcome  # it ended on its own meanwhile
        if limit_s is None or limit_s >= rt.job_timeout_s:
            raise  # past RQ's job timeout: RQ fails it, and retries it if it has retries left
        return _end_at_limit(rt, route, job, outcome, limit_s)


def _awaited(
    rt: Runtime[J, P, O], future: Future[JobOutcome], job_id: str, limit_s: float | None
) -> JobOutcome:
    """The job's outcome; TimeoutError once it has run `limit_s` past its first token (RQ's
    own timeout, raised in this thread, bounds the whole job)."""
    if limit_s is None or limit_s >= rt.job_timeout_s:
        return future.result(timeout=rt.job_timeout_s)
    wait = limit_s  # no sooner can it have run `limit_s` past its first token
    while True:
        try:
            return future.result(timeout=wait)
        except TimeoutError:
            first = rt.loop.first_token_at(job_id)
            if first is not None and (wait := first + limit_s - time.time()) <= 0:
                raise
            if first is None:  # still prefilling
                wait = limit_s


def _taken(rt: Runtime[J, P, O], job: J) -> bool:
    """Take the job out of its model's backlog; True if it was cancelled while queued."""
    pipe = rt.redis.pipeline(transaction=False)
    rt.release(keys=_backlog(rt.keys, job.model), args=[job.job_id, "taken"], client=pipe)
    pipe.exists(rt.keys.cancelled(job.job_id))
    _, cancelled = pipe.execute()
    return bool(cancelled)


def _cancelled(rt: Runtime[J, P, O], job: J) -> bool:
    try:
        return bool(rt.redis.exists(rt.keys.cancelled(job.job_id)))
    except RedisError:  # Redis failing: the job runs (a cancel it misses costs its tokens only)
        return False


def _release_backlog(rt: Runtime[J, P, O], model: str, job_id: str) -> None:
    """Take a job that will not run out of its model's backlog (a job of the wrong kind)."""
    try:
        rt.release(keys=_backlog(rt.keys, model), args=[job_id, "taken"], client=rt.redis)
    except (MLXQError, RedisError) as err:  # a model name no key can hold: nothing to release
        log.warning("could not release job %s from the backlog of %r: %s", job_id, model, err)


def _backlog(keys: Keys, model: str) -> list[str]:
    return [keys.backlog(model), keys.backlog_tokens(model), keys.order(model), keys.round(model)]


def _end_at_limit(
    rt: Runtime[J, P, O], route: Route, job: J, outcome: JobOutcome, limit_s: float
) -> JobOutcome:
    if rt.kind.on_run_limit(job) == "error":
        err = GenerationTimeoutError(f"The job ran past its limit of {limit_s:g} s.")
        _publish(rt, route, ErrorEvent.from_error(err))
        return outcome.model_copy(update={"finish_reason": "error", "error": err.message})
    usage = Usage(
        prompt_tokens=outcome.prompt_tokens,
        completion_tokens=outcome.completion_tokens,
        total_tokens=outcome.prompt_tokens + outcome.completion_tokens,
    )
    _publish(rt, route, DoneEvent(finish_reason="length", usage=usage))
    return outcome.model_copy(update={"finish_reason": "length"})


def _publish(rt: Runtime[J, P, O], route: Route, event: Event) -> None:
    rt.sink.send([(route, event)])
