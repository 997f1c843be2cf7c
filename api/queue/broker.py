"""The queue's writes: the RQ queues of each model's lanes, admission's counts (the backlog's
caps, placement), the event relay and cancellation.

A Broker is built over the API process's Backend (api/backend.py) and the Roster of what is
served (api/queue/roster.py), which admission reads; `Broker.init_app(app)` attaches one per API
process and routes reach it with `broker()`. Any Redis failure surfaces as
BackendUnavailableError (503). Admission (api/queue/admission.py) calls its checks once each:
its queue's caps of jobs and of prompt tokens, in one round trip (shared/queue/backlog.py: 429
with Retry-After), and placement on the worker holding its prefix (api/queue/placement.py); then
`enqueue` queues the admitted job as it is. Every job it queues is watched until its request
ends (api/queue/watch.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

from flask import Flask, current_app
from rq import Queue
from rq.serializers import JSONSerializer

from api.backend import Backend
from api.queue.bulk import BulkLanes
from api.queue.context_window import ContextWindows, PromptCount
from api.queue.placement import Outcome, Placement
from api.queue.relay import EventRelay, Subscription
from api.queue.roster import Roster
from api.queue.watch import JobWatch
from shared.queue import backlog, fair_order
from shared.queue.backlog import Verdict
from shared.queue.config import Settings
from shared.queue.connection import connect_blocking
from shared.queue.jobs import GenerationJob, JobLimits, Lane, QueuedJob
from shared.wire.errors import QueueFullError

T = TypeVar("T")


class Broker:
    def __init__(self, backend: Backend, roster: Roster):
        settings = backend.settings
        self.backend = backend
        self.roster = roster  # what admission reads
        # What the broker itself reads, and the stores over it with it.
        self.settings, self.keys, self.redis = settings, backend.keys, backend.redis
        self.api_id = backend.api_id
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
        self.bulk = BulkLanes(self.redis, self.keys, self._call)
        self.placement = Placement(
            self.redis, self.keys, settings.placement_wait_s, settings.prefill_s_per_token
        )

    def init_app(self, app: Flask) -> None:
        app.extensions["mlxq.broker"] = self

    def _call(self, fn: Callable[[], T]) -> T:
        return self.backend.call(fn)

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

    def enqueue(self, job: QueuedJob, sub: Subscription) -> None:
        """Queue an admitted job (api/queue/admission.py) as it is, and watch it until its
        request ends; its events already come to `sub`. RQ appends the job; then it moves to its
        fair place (shared/queue/fair_order.py)."""
        queue = self.queue(job.model, job.lane)
        keys = [queue.key, self.keys.order(job.model)]
        keys += [self.keys.rounds(job.model), self.keys.round(job.model)]
        args: list[str | int] = [job.job_id, job.share or "anonymous", job.priority]
        try:
            self._call(lambda: queue.enqueue_call(job.function, **self._job_options(job)))
            self._call(lambda: self._place(keys=keys, args=args))
        except BaseException:
            self.relay.unsubscribe(sub)
            self.release(job.job_id, job.model)
            raise
        self.watch.add(job.job_id, job.model, sub)

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
        """Enqueue background responses or batch lines on their lane, each in its caller's turn
        (api/queue/bulk.py; no admission check).

        No client waits on a bulk job, so when its worker is lost it is retried from scratch,
        up to `retries` times (default `bulk_retries`; worker/runtime/liveness/reaper.py), instead
        of failed.
        """
        if retries is None:
            retries = self.settings.bulk_retries
        self.bulk.submit(jobs, self._job_options, retries)

    def cancel(self, job_id: str) -> None:
        pipe = self.redis.pipeline(transaction=False)
        pipe.set(self.keys.cancelled(job_id), 1, ex=self.settings.job_timeout_s)
        pipe.publish(self.keys.cancel_channel(), job_id)
        self._call(pipe.execute)


def standalone(settings: Settings) -> Broker:
    """A broker of its own outside the app, over a backend and roster of its own (batch intake's
    process, benchmarks)."""
    backend = Backend(settings)
    return Broker(backend, Roster(backend))


def broker() -> Broker:
    found: Broker = current_app.extensions["mlxq.broker"]
    return found
