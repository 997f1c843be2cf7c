"""The API's side of Redis: model liveness, the RQ queues, the event relay, cancellation.

`Broker.init_app(app)` attaches one Broker per API process (Flask's extension pattern);
routes reach it with `broker()`. Any Redis failure surfaces as BackendUnavailableError (503).
Admission (api/queue/admission.py) calls its checks once each: the live workers of a job's
model (404 when none, unless a live pool may load it: shared/queue/pool.py), its queue's caps
of jobs and of prompt tokens, in one round trip (shared/queue/backlog.py: 429 with
Retry-After), and placement on the worker holding its prefix
(api/queue/placement.py); then `enqueue` queues the admitted job as it is. Every job it queues
is watched until its request ends (api/queue/watch.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from flask import Flask, current_app
from rq import Queue, Retry
from rq.serializers import JSONSerializer

from api.queue.context_window import ContextWindows, PromptCount
from api.queue.placement import Outcome, Placement
from api.queue.relay import EventRelay
from api.queue.watch import JobWatch
from shared.queue import backlog, fair_order
from shared.queue.backlog import Verdict
from shared.queue.config import Settings
from shared.queue.connection import connect, connect_blocking, redis_errors_as_503
from shared.queue.jobs import (
    JOB_FUNCTION,
    GenerationJob,
    JobLimits,
    Lane,
    QueuedJob,
)
from shared.queue.keys import Keys
from shared.queue.liveness import horizon, live_workers
from shared.queue.model_kinds import read_kinds, refuse_wrong_kind
from shared.queue.pool import Catalog, read_catalog
from shared.wire.catalog import ModelKind
from shared.wire.errors import ModelNotFoundError, QueueFullError
from shared.wire.ids import new_id

if TYPE_CHECKING:  # the type only: api/queue/admission.py imports this module
    from api.queue.admission import Admitted

T = TypeVar("T")
# Bulk jobs enqueued per Redis round trip.
BULK_CHUNK = 500


class Broker:
    def __init__(self, settings: Settings):
        self.settings = settings
        self.keys = Keys(settings.namespace)
        self.redis = connect(settings)
        self.api_id = new_id("api-")  # names this process's reply channel
        self.relay = EventRelay(
            connect_blocking(settings), self.keys.reply(self.api_id), settings.redis_timeout_s
        )
        self.windows = ContextWindows(self.redis, self.keys)
        self.watch = JobWatch(
            self.redis, self.keys, settings.heartbeat_s, self.relay.is_open, self.withdraw
        )
        self._accept = self.redis.register_script(backlog.ACCEPT)
        self._release = self.redis.register_script(backlog.RELEASE)
        self._place = self.redis.register_script(fair_order.PLACE)
        self._queues: dict[str, Queue] = {}
        self.placement = Placement(
            self.redis, self.keys, settings.placement_wait_s, settings.prefill_s_per_token
        )

    def init_app(self, app: Flask) -> None:
        app.extensions["mlxq.broker"] = self

    def _call(self, fn: Callable[[], T]) -> T:
        with redis_errors_as_503():
            return fn()

    def ping(self) -> bool:
        return bool(self._call(self.redis.ping))

    def live_models(self) -> list[tuple[str, float]]:
        """The models a live worker serves (shared/queue/liveness.py), with their last heartbeat."""
        oldest = horizon(time.time(), self.settings.heartbeat_s)
        rows: list[Any] = self._call(
            lambda: self.redis.zrangebyscore(self.keys.models(), oldest, "+inf", withscores=True)
        )
        seen = {bytes(name).decode(): float(score) for name, score in rows}
        live = self.live_workers(list(seen))
        return [(name, score) for name, score in seen.items() if live[name]]

    def require_model(self, model: str) -> None:
        """A 404 unless a live worker serves `model`: the rule `/v1/models` lists by."""
        self.served_by(model)

    def kinds(self, models: list[str]) -> dict[str, ModelKind | None]:
        """What each model is, as its workers announced it (None: not announced)."""
        return self._call(lambda: read_kinds(self.redis, self.keys, models))

    def require_kind(self, job: QueuedJob) -> None:
        """A 400 naming `model` when the job's model is of the other kind (an embedding model
        asked for a chat, a chat model for embeddings: shared/queue/model_kinds.py)."""
        refuse_wrong_kind(job, self.kinds([job.model])[job.model])

    def served_by(self, model: str) -> frozenset[str]:
        """The live workers serving `model`, read once for a job's admission. None while a
        live pool may load it (it waits in its queue: shared/queue/pool.py); a 404 if neither,
        a 400 naming the budget if it fits no pool."""
        workers = self.live_workers([model])[model]
        if not workers and not self.catalog().admits(model):
            raise ModelNotFoundError(
                f"The model '{model}' does not exist or no live worker serves it.", param="model"
            )
        return frozenset(workers)

    def catalog(self) -> Catalog:
        """The live pools' catalog (shared/queue/pool.py)."""
        heartbeat_s = self.settings.heartbeat_s
        return self._call(lambda: read_catalog(self.redis, self.keys, heartbeat_s))

    def live_workers(self, models: list[str]) -> dict[str, set[str]]:
        """The live workers of each of `models` (shared/queue/liveness.py)."""
        heartbeat_s = self.settings.heartbeat_s
        return self._call(lambda: live_workers(self.redis, self.keys, models, heartbeat_s))

    def queue(self, model: str, lane: Lane = "interactive") -> Queue:
        """A lane's queue (shared/queue/jobs.py): workers take interactive jobs first, then
        background ones, then batch lines."""
        return self._queue(self.keys.lane(model, lane))

    def _queue(self, name: str) -> Queue:
        if name not in self._queues:
            self._queues[name] = Queue(name, connection=self.redis, serializer=JSONSerializer)
        return self._queues[name]

    def interactive_limits(self) -> JobLimits:
        """The limits of a job a client waits on: it must start soon and not run forever. Its
        queue deadline is left out: admission stamps it last, as the job is queued
        (`queue_deadline`)."""
        return JobLimits(
            run_limit_s=self.settings.run_limit_s, on_run_limit=self.settings.run_limit_action
        )

    def queue_deadline(self) -> float:
        """The queue deadline of a job queued now. It counts from the enqueue: the checks before
        it (a fresh API process builds its prompt counter in the first: 110-270 ms on an idle
        2-core machine, more on a loaded one) are not time spent in the queue."""
        return time.time() + self.settings.queue_timeout_s

    def accept(self, job: QueuedJob) -> None:
        """Refuse at once a job its model's queue cannot take soon (429), else count it in the
        model's backlog (`release` takes it out)."""
        queue = self.queue(job.model, job.lane)
        keys = [queue.key, self.keys.backlog(job.model), self.keys.backlog_tokens(job.model)]
        args: list[str | float] = [
            self.settings.queue_cap,
            self.settings.queue_token_cap,
            job.job_id,
            backlog.estimate_tokens(job),
        ]
        verdict = Verdict(self._call(lambda: self._accept(keys=keys, args=args)))
        retry_after = self.settings.retry_after_s
        if verdict is Verdict.TOO_MANY_JOBS:
            raise QueueFullError(
                f"The queue for '{job.model}' holds {self.settings.queue_cap} jobs, its cap; "
                f"retry in {retry_after} s.",
                retry_after_s=retry_after,
            )
        if verdict is Verdict.TOO_MANY_TOKENS:
            raise QueueFullError(
                f"The queue for '{job.model}' holds {self.settings.queue_token_cap} prompt "
                f"tokens, its cap; retry in {retry_after} s.",
                retry_after_s=retry_after,
            )

    def place(
        self, job: QueuedJob, prompt: PromptCount | None, workers: frozenset[str]
    ) -> Outcome | None:
        """Place a generation job on the one of `workers` holding its prefix, if any
        (api/queue/placement.py); None: not placed (an embedding job, a prompt the API could
        not count or that is several, placement off)."""
        if not isinstance(job, GenerationJob) or prompt is None or prompt.ids is None:
            return None
        if not self.placement.enabled:
            return None
        ids = prompt.ids
        return self._call(lambda: self.placement.place(job, ids, workers))

    def enqueue(self, admitted: Admitted) -> None:
        """Queue an admitted job (api/queue/admission.py) as it is, and watch it until its
        request ends; its events already come to its subscription. RQ appends the job; then it
        moves to its fair place (shared/queue/fair_order.py)."""
        job = admitted.job
        queue = self.queue(job.model, job.lane)
        keys = [queue.key, self.keys.order(job.model)]
        keys += [self.keys.rounds(job.model), self.keys.round(job.model)]
        args: list[str | int] = [job.job_id, job.share or "anonymous", job.priority]
        try:
            self._call(lambda: queue.enqueue_call(job.function, **self._job_options(job)))
            self._call(lambda: self._place(keys=keys, args=args))
        except BaseException:
            self.relay.unsubscribe(admitted.sub)
            self.release(job.job_id, job.model)
            raise
        self.watch.add(job.job_id, job.model, admitted.sub)

    def release(self, job_id: str, model: str) -> None:
        """Take a job's prompt tokens out of its model's backlog, and forget its placement
        (idempotent)."""
        keys = [self.keys.backlog(model), self.keys.backlog_tokens(model)]
        keys += [self.keys.order(model), self.keys.round(model)]
        pipe = self.redis.pipeline(transaction=False)  # one round trip, as before placement
        self._release(keys=keys, args=[job_id, "withdrawn"], client=pipe)
        self.placement.forget(pipe, job_id, model)
        self._call(pipe.execute)

    def withdraw(self, job_id: str, model: str) -> None:
        """Cancel a job nobody will wait for, and take it off its queue if it is still there
        (the interactive lane, or the background one for `service_tier: flex`)."""
        self.cancel(job_id)
        for lane in ("interactive", "background"):
            queue = self.queue(model, lane)
            self._call(lambda: queue.remove(job_id))  # noqa: B023 (called at once)
        self.release(job_id, model)

    def _job_options(self, job: QueuedJob) -> dict[str, Any]:
        """What RQ gets for every generation job: the one function, the payload, the TTLs."""
        return {
            "args": (job.model_dump(mode="json"),),
            "job_id": job.job_id,
            "timeout": self.settings.job_timeout_s,
            "result_ttl": self.settings.result_ttl_s,
            "failure_ttl": self.settings.result_ttl_s,
        }

    def submit_bulk(self, jobs: list[GenerationJob], retries: int | None = None) -> None:
        """Enqueue background responses or batch lines on their lane, in order (no admission
        check).

        No client waits on a bulk job, so when its worker is lost it is retried from scratch,
        up to `retries` times (default `bulk_retries`; worker/runtime/reaper.py), instead of failed.
        """
        if retries is None:
            retries = self.settings.bulk_retries
        retry = Retry(max=retries) if retries else None
        for start in range(0, len(jobs), BULK_CHUNK):
            pipe = self.redis.pipeline(transaction=False)
            for queued in jobs[start : start + BULK_CHUNK]:
                lane: Lane = "batch" if queued.batch_line is not None else "background"
                job = queued.model_copy(update={"lane": lane})  # recorded in metrics and logs
                data = Queue.prepare_data(
                    JOB_FUNCTION,
                    **self._job_options(job),
                    retry=retry,
                    description=job.job_id,  # RQ's default repeats the whole payload
                )
                self.queue(job.model, lane).enqueue_many([data], pipeline=pipe)
            self._call(pipe.execute)

    def cancel(self, job_id: str) -> None:
        pipe = self.redis.pipeline(transaction=False)
        pipe.set(self.keys.cancelled(job_id), 1, ex=self.settings.job_timeout_s)
        pipe.publish(self.keys.cancel_channel(), job_id)
        self._call(pipe.execute)


def broker() -> Broker:
    found: Broker = current_app.extensions["mlxq.broker"]
    return found
