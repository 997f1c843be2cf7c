"""Stored responses: a small record per response; its state is derived, never stored.

The record (keys.py `response`) holds the owner, the `StoredResponse` (id, created_at,
background, the request) and a cancelled flag. Everything else comes from the job that
generates it (job id = response id): its event log (keys.py `replay`, kept by the worker for as
long as the record lives) and, while that log has no final event, its RQ record (queued with a
position, started, ended, failed or gone). shared/wire/responses/responses.py derives the response
object from those, so every API process answers the same, and nothing needs updating when the job
moves. A stored response, and a background one until it ends, takes a place in its owner's quotas
(api/limits/quotas.py) before its job is queued (`usages`); a stored one its record's bytes too.
"""

from __future__ import annotations

import time
from typing import Any

from redis import Redis
from rq.exceptions import NoSuchJobError
from rq.job import Job, JobStatus
from rq.serializers import JSONSerializer

from api.http.auth import is_owner
from api.http.off_hub import off_hub
from api.limits.quotas import Usage, quotas
from api.limits.shares import release_hold
from api.queue.broker import Broker
from shared.wire.errors import NotFoundError
from shared.wire.events import Event, RequeuedEvent, decode_event
from shared.wire.responses.response_state import JobView, Progress, derive
from shared.wire.responses.responses import (
    FINAL_STATUSES,
    ResponseDeleted,
    ResponseObject,
    StoredResponse,
)

_WAITING = {JobStatus.QUEUED, JobStatus.SCHEDULED, JobStatus.DEFERRED, JobStatus.CREATED}


class ResponseStore:
    def __init__(self, broker: Broker):
        self._broker = broker
        self._redis: Redis = broker.redis
        self._keys = broker.keys
        self.ttl_s = broker.settings.response_ttl_s
        self._quotas = quotas()

    @staticmethod
    def record(stored: StoredResponse) -> str:
        """What `create` writes, made once and off the hub: a record carrying a schema of
        megabytes takes a tenth of a second to serialize."""
        return off_hub(stored.model_dump_json)

    @staticmethod
    def usages(stored: StoredResponse, record_bytes: int = 0) -> list[Usage]:
        """What a response takes of its owner's quotas: a place among its stored responses
        and its record's bytes (unless store=false; the bytes are not needed to give the
        place back), and a place among its background responses not ended."""
        found = [Usage("responses", stored.id, size=record_bytes)] if stored.request.store else []
        return found + ([Usage("background", stored.id)] if stored.background else [])

    def create(self, owner: str, response_id: str, record: str) -> None:
        key = self._keys.response(response_id)
        pipe = self._redis.pipeline()
        pipe.hset(key, mapping={"owner": owner, "record": record})
        pipe.expire(key, self.ttl_s)
        pipe.execute()

    def load(self, owner: str, response_id: str) -> tuple[StoredResponse, bool]:
        """The record and its cancelled flag; 404 if unknown, expired or another owner's."""
        fields: Any = self._redis.hmget(
            self._keys.response(response_id), ["owner", "record", "cancelled"]
        )
        who, record, cancelled = fields
        if who is None or not is_owner(bytes(who).decode(), owner) or record is None:
            raise NotFoundError(f"Response with id '{response_id}' not found.", param="response_id")
        return StoredResponse.model_validate_json(record), cancelled is not None

    def events(self, response_id: str, start: int = 0) -> list[Event]:
        rows: Any = self._redis.lrange(self._keys.replay(response_id), start, -1)
        return [decode_event(row) for row in rows]

    def events_since(self, response_id: str, start: int, attempt: int) -> tuple[list[Event], int]:
        """The log's events from `start`, and where they begin: 0 instead of `start` when the
        job was requeued (worker/runtime/liveness/reaper.py resets the log to a RequeuedEvent) after
        `attempt`,
        so that a reader replays the new attempt from its beginning. One atomic read."""
        key = self._keys.replay(response_id)
        pipe = self._redis.pipeline(transaction=True)
        pipe.lindex(key, 0)
        pipe.lrange(key, start, -1)
        head, rows = pipe.execute()
        if start > 0 and head is not None:
            first = decode_event(head)
            if isinstance(first, RequeuedEvent) and first.attempt > attempt:
                rows = self._redis.lrange(key, 0, -1)
                start = 0
        return [decode_event(row) for row in rows], start

    def job_view(self, stored: StoredResponse) -> JobView:
        try:
            job = Job.fetch(stored.id, connection=self._redis, serializer=JSONSerializer)
        except NoSuchJobError:
            return JobView("gone")
        status = job.get_status(refresh=False)
        if status in _WAITING:
            model = stored.request.model
            if stored.background:  # in its caller's turn (shared/queue/turns.py)
                share = str(job.args[0].get("share") or "anonymous") if job.args else "anonymous"
                where = self._broker.bulk.position(stored.id, model, "background", share)
                return JobView("queued", position=where)
            queue = self._broker.queue(model, "interactive")
            return JobView("queued", position=queue.get_job_position(stored.id))
        if status == JobStatus.STARTED:
            return JobView("started")
        if status == JobStatus.FINISHED:
            result = job.return_value()
            outcome = result.get("finish_reason") if isinstance(result, dict) else None
            return JobView("ended", outcome=outcome)
        if status == JobStatus.CANCELED:
            return JobView("ended", outcome="cancelled")
        return JobView("failed")

    def view(self, owner: str, response_id: str) -> ResponseObject:
        stored, cancelled = self.load(owner, response_id)
        return self.derive(stored, cancelled)

    def derive(self, stored: StoredResponse, cancelled: bool) -> ResponseObject:
        progress = Progress.of(self.events(stored.id))
        job = None if cancelled or progress.final else self.job_view(stored)
        if job is not None and job.state in ("ended", "failed", "gone"):
            # The job may have ended between the two reads: its final event is logged before
            # RQ records the end, so read the events again before calling it lost.
            progress = Progress.of(self.events(stored.id))
            job = None if progress.final else job
        return derive(stored, progress, cancelled, job)

    def cancel(self, stored: StoredResponse) -> None:
        """Flag it cancelled (final), stop its job at the next step, take it off its queue."""
        self._redis.hset(self._keys.response(stored.id), "cancelled", int(time.time()))
        self._broker.cancel(stored.id)
        if self._broker.bulk.remove(stored.id, stored.request.model, "background", None):
            Job(stored.id, connection=self._redis, serializer=JSONSerializer).delete()
            release_hold(stored.id)  # no worker will end it (a running one gives them back)

    def cancel_unless_final(self, owner: str, response_id: str) -> ResponseObject:
        stored, cancelled = self.load(owner, response_id)
        current = self.derive(stored, cancelled)
        if current.status in FINAL_STATUSES:
            return current
        self.cancel(stored)
        self._quotas.release(owner, Usage("background", stored.id))  # it ends now
        return self.derive(stored, True)

    def delete(self, owner: str, response_id: str) -> ResponseDeleted:
        stored, cancelled = self.load(owner, response_id)
        if self.derive(stored, cancelled).status not in FINAL_STATUSES:
            self.cancel(stored)
        self._redis.delete(self._keys.response(response_id), self._keys.replay(response_id))
        self._quotas.release(owner, *self.usages(stored))
        return ResponseDeleted(id=response_id)
