"""Batches: created here, run line by line on the workers, finalized lazily by whoever reads them.

No coordinator process. Creation validates the input file (api/stores/batch_intake.py), writes the
batch hash (layout in shared/wire/batches.py), the custom_ids in input order and the lines refused
at intake, then puts one RQ job per line on its model's bulk queue (with RQ retries for lines whose
worker dies). Each worker records its line's answer in the batch's results hash, first write
wins, and bumps the counters (worker/runtime/batch_lines.py), only while the batch is `in_progress`.

Reading a batch settles it: once every line is recorded (or its completion window has passed)
the reader moves it to `finalizing` with a compare-and-set, takes the finalizing lock, writes the
output and error files from the results (lines never answered get a `batch_cancelled` or
`batch_expired` error line) and sets the final status. A reader that dies mid-way leaves the
lock to expire, and the next read finishes the job. Cancelling moves an `in_progress` batch to
`cancelling` and stops its running lines; queued lines are skipped by the workers; the next read
finalizes it as `cancelled`.

Choices: validation runs inside the create request, so a batch is never seen `validating`
(it answers `in_progress`, or `failed` with its errors); request_counts.failed counts every
line in the error file, cancelled and expired lines included.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

from redis.typing import EncodableT, FieldT
from rq.registry import StartedJobRegistry
from rq.serializers import JSONSerializer

from api.http.auth import is_owner
from api.queue.broker import Broker
from api.queue.rate_limits import hold_batch, release_hold
from api.stores.batch_intake import LineModels, take_in
from api.stores.files import FileStore
from api.stores.listing import page
from api.stores.quotas import Usage, quotas
from shared.queue import queued_tokens
from shared.wire.batches import (
    COMPLETION_WINDOW_S,
    FINAL_STATUSES,
    Batch,
    BatchCreateRequest,
    BatchError,
    BatchErrors,
    BatchList,
    BatchListQuery,
    BatchOutputLine,
    LineResult,
    StoredBatch,
    line_job_prefix,
)
from shared.wire.errors import (
    InvalidRequestError,
    MLXQError,
    ModelNotFoundError,
    NotFoundError,
    RateLimitError,
)
from shared.wire.ids import new_id
from shared.wire.messages import MESSAGES_PATH

# Moves a batch from one status to another only if it is still in the first one.
_MOVE = """
if redis.call('HGET', KEYS[1], 'status') ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'status', ARGV[2], 'ending', ARGV[3], ARGV[2] .. '_at', ARGV[4])
return 1
"""
FINALIZE_LOCK_S = 60
FINAL = FINAL_STATUSES
UNANSWERED = {
    "cancelled": ("batch_cancelled", "The batch was cancelled before this request finished."),
    "expired": (
        "batch_expired",
        "This request could not be executed before the completion window expired.",
    ),
    "completed": ("batch_failed", "This request was not answered."),
}


def _usages(batch_id: str) -> tuple[Usage, Usage]:
    """What a batch takes of its owner's quotas: a place among its batches, and among those
    open until it ends (api/stores/quotas.py finds out when)."""
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
        return self.start(owner, stored, self._files.content(owner, source.id))

    def start(self, owner: str, stored: StoredBatch, content: bytes, refuse: bool = False) -> Batch:
        """Take in the JSONL `content` and queue its lines. A batch whose file fails validation
        is stored as `failed` with its errors, or with `refuse` raised as a 400 and not stored
        (Anthropic's Message Batches). It takes its place among its owner's batches, kept and
        open, first (api/stores/quotas.py: a 429 when the key has no room)."""
        with self._quotas.holding(owner, *_usages(stored.id)):
            return self._start(owner, stored, content, refuse)

    def _start(self, owner: str, stored: StoredBatch, content: bytes, refuse: bool) -> Batch:
        now = stored.created_at
        models = LineModels(self._is_served, lambda model: self._broker.kinds([model])[model])
        intake = take_in(content, stored, models, owner)
        if intake.errors and refuse:
            first = intake.errors[0]
            raise InvalidRequestError(first.message, param=first.param, code=first.code)
        stored.models = sorted(intake.models)
        fields: dict[FieldT, EncodableT] = {"owner": owner, "record": stored.model_dump_json()}
        if intake.errors:
            errors = BatchErrors(data=intake.errors).model_dump_json()
            fields.update(status="failed", failed_at=now, errors=errors)
            self._write(stored, owner, fields, [], {})
            return self.view(owner, stored.id)
        try:
            jobs = hold_batch(stored.id, intake.jobs, stored.expires_at)
        except RateLimitError as over:
            if refuse:
                raise
            # As OpenAI: the batch fails with `token_limit_exceeded`.
            error = BatchError(code="token_limit_exceeded", line=None, message=over.message)
            fields.update(
                status="failed", failed_at=now, errors=BatchErrors(data=[error]).model_dump_json()
            )
            self._write(stored, owner, fields, [], {})
            return self.view(owner, stored.id)
        fields.update(
            status="in_progress",
            in_progress_at=now,
            total=len(intake.custom_ids),
            completed=0,
            failed=len(intake.refused),
        )
        self._write(stored, owner, fields, intake.custom_ids, intake.refused)
        try:
            self._broker.submit_bulk(jobs, retries=self._settings.batch_line_retries)
        except MLXQError as err:
            self._move(
                keys=[self._keys.batch(stored.id)], args=["in_progress", "failed", "failed", now]
            )
            release_hold(stored.id)
            raise err
        return self.view(owner, stored.id)

    def _is_served(self, model: str) -> bool:
        try:
            self._broker.require_model(model)
        except ModelNotFoundError:
            return False
        return True

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
        found = self._load(owner, batch_id)
        if batch.status != "in_progress" or found is None:
            return batch
        stored, _ = found
        key = self._keys.batch(batch_id)
        now = int(time.time())
        if self._move(keys=[key], args=["in_progress", "cancelling", "cancelled", now]):
            self._stop_running_lines(stored)
            release_hold(batch_id)  # its queued lines are skipped: none gives its share back
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

    def _stop_running_lines(self, stored: StoredBatch) -> None:
        """Cancel the lines workers are generating now; queued ones see the status and skip."""
        prefix = line_job_prefix(stored.id)
        for model in stored.models:
            registry = StartedJobRegistry(
                self._keys.batch_queue(model), connection=self._redis, serializer=JSONSerializer
            )
            for job_id in registry.get_job_ids(cleanup=False):
                if job_id.startswith(prefix):
                    self._broker.cancel(job_id)

    def _settle(self, owner: str, stored: StoredBatch, fields: dict[str, str]) -> bool:
        """Move a batch towards its end if it is due; True if anything changed."""
        status = fields.get("status")
        key = self._keys.batch(stored.id)
        now = int(time.time())
        if status == "in_progress":
            done = int(fields.get("completed", 0)) + int(fields.get("failed", 0))
            if done >= int(fields.get("total", 0)):
                self._move(keys=[key], args=["in_progress", "finalizing", "completed", now])
            elif now >= stored.expires_at:
                if self._move(keys=[key], args=["in_progress", "finalizing", "expired", now]):
                    self._stop_running_lines(stored)
            else:
                return False
            status = "finalizing"
        if status in ("finalizing", "cancelling"):
            self._finalize(owner, stored)
            return True
        return False

    def _finalize(self, owner: str, stored: StoredBatch) -> None:
        lock = self._keys.batch_finalizing(stored.id)
        if not self._redis.set(lock, 1, nx=True, ex=FINALIZE_LOCK_S):
            return
        try:
            found: Any = self._redis.hmget(self._keys.batch(stored.id), ["status", "ending"])
            status, ending = found
            if status in (b"finalizing", b"cancelling"):
                self._write_files(owner, stored, bytes(ending or b"completed").decode())
        finally:
            self._redis.delete(lock)

    def _write_files(self, owner: str, stored: StoredBatch, ending: str) -> None:
        raw: Any = self._redis.hgetall(self._keys.batch_results(stored.id))
        results = {int(i): LineResult.model_validate_json(r) for i, r in raw.items()}
        custom_ids: Any = self._redis.lrange(self._keys.batch_lines(stored.id), 0, -1)
        code, message = UNANSWERED[ending]
        parts: dict[str, list[str]] = {"output": [], "error": []}
        tokens = [0, 0]
        for index, custom_id in enumerate(custom_ids):
            result = results.get(index) or LineResult(
                part="error",
                line=BatchOutputLine.unanswered(bytes(custom_id).decode(), code, message),
            )
            parts[result.part].append(result.line.model_dump_json())
            tokens[0] += result.input_tokens
            tokens[1] += result.output_tokens
        ttl = stored.output_expires_after.seconds if stored.output_expires_after else None
        fields: dict[FieldT, EncodableT] = {
            "status": ending,
            f"{ending}_at": int(time.time()),
            "completed": len(parts["output"]),
            "failed": len(parts["error"]),
            "input_tokens": tokens[0],
            "output_tokens": tokens[1],
        }
        for part, field in (("output", "output_file_id"), ("error", "error_file_id")):
            if parts[part]:
                content = ("\n".join(parts[part]) + "\n").encode()
                name = f"{stored.id}_{part}.jsonl"
                fields[field] = self._files.create(owner, name, "batch_output", content, ttl).id
        pipe = self._redis.pipeline()
        pipe.hset(self._keys.batch(stored.id), mapping=fields)
        pipe.expire(self._keys.batch(stored.id), self._settings.batch_ttl_s)
        pipe.delete(self._keys.batch_results(stored.id), self._keys.batch_lines(stored.id))
        queued_tokens.release(pipe, self._keys, owner, stored.id)  # what lines did not give back
        pipe.execute()
