"""Batches: created here, taken in by a process of their own, run line by line on the workers,
finalized by a process of their own that whoever reads them once they are due starts.

No coordinator process. Creation writes the batch hash `validating` (layout in
shared/wire/batch/batches.py) and starts its intake process (api/stores/batch_feed.py), then
answers: that process reads and checks the input (api/stores/batch_intake.py) off the API's hub and
records and queues the lines a chunk at a time (api/stores/batch_queue.py), one RQ job per line
on its model's batch lane (with RQ retries for lines whose worker dies); the first chunk moves
the batch to `in_progress`, a batch that fails validation ends `failed` with its errors. Each
worker records its line's answer in the batch's results hash, first write wins, and bumps the
counters (worker/runtime/kinds/batch_lines.py), only while the batch is `in_progress`.

Reading a batch settles it: once its intake has ended and every line is recorded (or its
completion window has passed) the reader moves it to `finalizing` with a compare-and-set and
starts its finalizer (api/stores/batch_finalize.py: the finalizing lock held, a process of its
own writes the output and error files from the results, lines never answered getting a
`batch_cancelled` or `batch_expired` error line, and sets the final status), then answers
`finalizing` without waiting for it. A finalizer that dies leaves the lock to expire, and the
next read starts another; a batch whose intake process stopped renewing it is failed by the next
read. Cancelling moves a `validating` or `in_progress` batch to `cancelling`, stops its running
lines and drops its queued ones from the lanes in one step; once its intake has stopped (at its
next chunk), the next read starts its finalization, and it reads `cancelling` until it has ended
`cancelled`.

Choices: request_counts.failed counts every line in the error file, cancelled and expired lines
included; request_counts.total counts the lines taken in so far while the intake runs.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

from redis.typing import EncodableT, FieldT

from api.http.auth import cache_scope, is_owner, key_limits
from api.limits.quotas import Usage, quotas
from api.limits.shares import release_hold
from api.queue.broker import Broker
from api.stores import batch_finalize as finalization
from api.stores.batch_feed import LEASE_S, IntakeOrder, launch, verdict
from api.stores.batch_queue import BatchQueue
from api.stores.files import FileStore
from api.stores.listing import page
from shared.wire.anthropic.messages import MESSAGES_PATH
from shared.wire.batch.batches import (
    COMPLETION_WINDOW_S,
    FINAL_STATUSES,
    Batch,
    BatchCreateRequest,
    BatchError,
    BatchList,
    BatchListQuery,
    LineResult,
    StoredBatch,
)
from shared.wire.errors import InvalidRequestError, MLXQError, NotFoundError
from shared.wire.ids import new_id

# Moves a batch from one status to another only if it is still in the first one.
_MOVE = """
if redis.call('HGET', KEYS[1], 'status') ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'status', ARGV[2], 'ending', ARGV[3], ARGV[2] .. '_at', ARGV[4])
return 1
"""
FINAL = FINAL_STATUSES


_INTAKE_LOST = BatchError(
    code="server_error",
    message="The batch's intake stopped before it had read the whole input; create it again.",
)


def _usages(batch_id: str) -> tuple[Usage, Usage]:
    """What a batch takes of its owner's quotas: a place among its batches, and among those
    open until it ends (api/limits/quotas.py finds out when)."""
    return Usage("batches", batch_id), Usage("open_batches", batch_id)


class BatchStore:
    def __init__(self, broker: Broker, files: FileStore):
        self._broker = broker
        self._redis = broker.redis
        self._keys = broker.keys
        self._settings = broker.settings
        self._files = files
        self._move = self._redis.register_script(_MOVE)
        self._quotas = quotas()
        self._lines = BatchQueue(broker)

    def create(self, owner: str, req: BatchCreateRequest) -> Batch:
        source = self._files.get(owner, req.input_file_id)
        if source.purpose != "batch":
            raise InvalidRequestError(
                f"The file {source.id} has purpose '{source.purpose}', not 'batch'.",
                param="input_file_id",
            )
        now = int(time.time())
        stored = StoredBatch(
            id=new_id("batch_"),
            created_at=now,
            expires_at=now + COMPLETION_WINDOW_S,
            endpoint=req.endpoint,
            input_file_id=req.input_file_id,
            metadata=req.metadata,
            output_expires_after=req.output_expires_after,
        )
        return self.start(owner, stored)

    def start(self, owner: str, stored: StoredBatch, requests: bytes | None = None) -> Batch:
        """Write the batch `validating` and start its intake process, which takes in the input
        file, or a message batch's `requests` (its request body, which the process parses while
        this waits: a 400 if it is not one). It takes its place
        among its owner's batches, kept and open, first (api/limits/quotas.py: a 429 when the
        key has no room)."""
        with self._quotas.holding(owner, *_usages(stored.id)):
            now = stored.created_at
            fields: dict[FieldT, EncodableT] = {
                "owner": owner,
                "record": stored.model_dump_json(),
                "status": "validating",
                "intake_until": now + LEASE_S,  # the intake renews it
            }
            self._write(stored, owner, fields, [], {})
            limits = key_limits()
            order = IntakeOrder(
                settings=self._settings,
                owner=owner,
                cache_scope=cache_scope(),
                stored=stored,
                file_id=stored.input_file_id,
                queued_limit=limits.queued if limits is not None else None,
                requests=requests,
            )
            process = launch(order)
            if requests is not None:
                try:
                    verdict(process)
                except MLXQError:  # not a message batch: it never existed
                    self._redis.delete(self._keys.batch(stored.id))
                    self._redis.zrem(self._keys.batches(owner), stored.id)
                    raise
        return self.view(owner, stored.id)

    def _write(
        self,
        stored: StoredBatch,
        owner: str,
        fields: dict[FieldT, EncodableT],
        custom_ids: list[str],
        refused: dict[int, LineResult],
    ) -> None:
        ttl_s = self._settings.batch_ttl_s
        keys = (
            self._keys.batch(stored.id),
            self._keys.batch_lines(stored.id),
            self._keys.batch_results(stored.id),
        )
        pipe = self._redis.pipeline()
        pipe.hset(keys[0], mapping=fields)
        for start in range(0, len(custom_ids), 1000):
            pipe.rpush(keys[1], *custom_ids[start : start + 1000])
        if refused:
            pipe.hset(keys[2], mapping={i: r.model_dump_json() for i, r in refused.items()})
        for key in keys:
            pipe.expire(key, ttl_s)
        pipe.zadd(self._keys.batches(owner), {stored.id: time.time()})
        pipe.expire(self._keys.batches(owner), ttl_s)
        pipe.execute()

    def line_ids(self, batch_id: str) -> list[str]:
        """The custom_ids of a batch's lines taken in, in input order (a batch read as its
        owner's already)."""
        found: Any = self._redis.lrange(self._keys.batch_lines(batch_id), 0, -1)
        return [bytes(custom_id).decode() for custom_id in found]

    def _load(self, owner: str, batch_id: str) -> tuple[StoredBatch, dict[str, str]] | None:
        raw: Any = self._redis.hgetall(self._keys.batch(batch_id))
        fields = {bytes(k).decode(): bytes(v).decode() for k, v in raw.items()}
        if not is_owner(fields.get("owner"), owner) or "record" not in fields:
            return None
        return StoredBatch.model_validate_json(fields["record"]), fields

    def view(self, owner: str, batch_id: str, settle: bool = True) -> Batch:
        found = self._load(owner, batch_id)
        if found is None:
            raise NotFoundError(f"No batch found with id '{batch_id}'.", param="batch_id")
        stored, fields = found
        if settle and self._settle(owner, stored, fields):
            return self.view(owner, batch_id, settle=False)
        return Batch.of(stored, fields)

    def listing(self, owner: str, query: BatchListQuery, messages: bool = False) -> BatchList:
        """The owner's batches of OpenAI's Batch API, or (`messages`) of Anthropic's."""

        def load(ids: list[str]) -> list[Batch | None]:
            found: list[Batch | None] = []
            for batch_id in ids:
                try:
                    found.append(self.view(owner, batch_id))
                except NotFoundError:
                    found.append(None)
            return found

        def keep(batch: Batch) -> bool:
            return (batch.endpoint == MESSAGES_PATH) == messages

        key = self._keys.batches(owner)
        batches, more = page(self._redis, key, query.after, query.limit, load, keep=keep)
        return BatchList(
            data=batches,
            first_id=batches[0].id if batches else None,
            last_id=batches[-1].id if batches else None,
            has_more=more,
        )

    def cancel(self, owner: str, batch_id: str) -> Batch:
        batch = self.view(owner, batch_id)
        if batch.status not in ("validating", "in_progress"):
            return batch
        key = self._keys.batch(batch_id)
        now = int(time.time())
        for status in ("validating", "in_progress"):
            if self._move(keys=[key], args=[status, "cancelling", "cancelled", now]):
                found = self._load(owner, batch_id)  # its models as its intake has seen them
                if found is not None:
                    self._lines.stop(found[0])
                release_hold(batch_id)  # its dropped lines give nothing back themselves
                break
        return self.view(owner, batch_id, settle=False)

    def delete(self, owner: str, batch_id: str) -> Batch:
        """Delete an ended batch, its output and error files; a running one is a 400."""
        batch = self.view(owner, batch_id)
        if batch.status not in FINAL:
            raise InvalidRequestError(
                f"Batch {batch_id} is {batch.status}: only a batch that has ended can be "
                "deleted; cancel it first.",
                param="batch_id",
            )
        for file_id in (batch.output_file_id, batch.error_file_id):
            if file_id is not None:
                with contextlib.suppress(NotFoundError):
                    self._files.delete(owner, file_id)
        pipe = self._redis.pipeline()
        pipe.delete(self._keys.batch(batch_id))
        pipe.zrem(self._keys.batches(owner), batch_id)
        self._quotas.release(owner, *_usages(batch_id), pipe=pipe)
        pipe.execute()
        return batch

    def _settle(self, owner: str, stored: StoredBatch, fields: dict[str, str]) -> bool:
        """Move a batch towards its end if it is due; True if anything changed."""
        status = fields.get("status")
        key = self._keys.batch(stored.id)
        now = int(time.time())
        intake_until = fields.get("intake_until")
        if status in ("validating", "in_progress", "cancelling") and intake_until:
            if float(intake_until) >= time.time():
                return False  # its lines are still being taken in, or it is winding down
            if status != "cancelling":
                self._lines.fail(stored, owner, [_INTAKE_LOST], now)
                return True
        if status == "in_progress":
            done = int(fields.get("completed", 0)) + int(fields.get("failed", 0))
            if done >= int(fields.get("total", 0)):
                self._move(keys=[key], args=["in_progress", "finalizing", "completed", now])
            elif now >= stored.expires_at:
                if self._move(keys=[key], args=["in_progress", "finalizing", "expired", now]):
                    self._lines.stop(stored)
            else:
                return False
            status = "finalizing"
        if status in ("finalizing", "cancelling"):
            lines = int(fields.get("total", 0))
            finalization.start(self._broker, owner, stored, lines)  # unless one holds the lock
            return True
        return False
