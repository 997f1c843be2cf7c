"""A batch's finalization: its output and error files written, and its final status set, in a
process of its own (api/stores/batch_process.py), never on the API's hub.

The read that finds a batch due (api/stores/batches.py: its lines all answered, its window past,
or its cancel settled) moves it to `finalizing` (a cancelled one stays `cancelling`) and calls
`start`: it takes the batch's finalizing lock and launches this process with a `FinalizeOrder`,
then answers at once, `finalizing` (OpenAI's status for it) until the process has ended. The
process reads the batch's lines PAGE_LINES at a time in input order, with their recorded results
(a line never answered gets a `batch_cancelled` or `batch_expired` error line: `UNANSWERED`), and
writes each line to the output or the error file as it goes (api/stores/files.py `FileWriter`: a
chunk to Redis at a time, so it never holds a whole file, and no file needs one Redis value as
large as itself); then it sets the final status, the counts, the tokens and the file ids in one
step, and drops the lines and their results.

A batch of at most INLINE_LINES lines whose lines and answers hold at most INLINE_BYTES in Redis
is finalized by the read itself, before it answers: its files take milliseconds to write, where a
process takes most of a second of a core to start. A few lines of long answers are not small:
their bytes, not their count, are the work.

The lock holds a token of its finalizer's own and is renewed with each page; a process that dies
leaves it to expire (FINALIZE_LOCK_S), its half-written files unseen (their chunks expire with
their TTL), and the next read starts finalization again. A finalizer that finds its lock gone
or another's (a page took longer than the lock lasts, and a later read started another) stops
where it is, its files unwritten, rather than write the batch's files a second time; it never
deletes or renews another's lock.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from redis.typing import EncodableT, FieldT

from api.limits.quotas import Quotas
from api.queue.broker import Broker, standalone
from api.stores.batch_process import launch, read_order
from api.stores.files import FileStore
from shared.observe.logs import configure
from shared.queue import queued_tokens
from shared.queue.config import Settings
from shared.wire.batch.batches import BatchOutputLine, LineResult, StoredBatch

log = logging.getLogger(__name__)

# How long a finalization may go without renewing its lock before another may start.
FINALIZE_LOCK_S = 60
# Lines (and their results) read from Redis at a time.
PAGE_LINES = 1000
# A batch this small is finalized on the read's own hub: about 10 ms of work (50 us a line).
INLINE_LINES = 200
# ... and whose lines and answers hold at most this in Redis (200 lines of eight-word answers
# hold 87 KB).
INLINE_BYTES = 1 << 20
# The error line of a line never answered, by the batch's final status.
UNANSWERED = {
    "cancelled": ("batch_cancelled", "The batch was cancelled before this request finished."),
    "expired": (
        "batch_expired",
        "This request could not be executed before the completion window expired.",
    ),
    "completed": ("batch_failed", "This request was not answered."),
}
# The statuses of a batch whose finalization is due or under way.
ENDING = (b"finalizing", b"cancelling")
# The lock renewed, or deleted (ARGV[2] empty), only while it holds this finalizer's token.
_IF_MINE = """
if redis.call('get', KEYS[1]) ~= ARGV[1] then return 0 end
if ARGV[2] == '' then return redis.call('del', KEYS[1]) end
return redis.call('expire', KEYS[1], ARGV[2])
"""


def _small(broker: Broker, batch_id: str, lines: int) -> bool:
    """Whether the batch is small enough to finalize on the read's hub (module docstring)."""
    if lines > INLINE_LINES:
        return False
    keys = (broker.keys.batch_lines(batch_id), broker.keys.batch_results(batch_id))
    held = sum(int(broker.redis.memory_usage(key, samples=0) or 0) for key in keys)
    return held <= INLINE_BYTES


class LockLost(Exception):
    """The batch's finalizing lock expired under this finalizer, or another holds it now."""


@dataclass(frozen=True)
class FinalizeOrder:
    """What the API hands a batch's finalizer process (pickled on its stdin)."""

    settings: Settings
    owner: str
    stored: StoredBatch
    lock_token: str  # what the batch's finalizing lock holds while this finalization has it


def start(broker: Broker, owner: str, stored: StoredBatch, lines: int) -> bool:
    """Take the batch's finalizing lock and finalize it (of `lines` lines), here if it is small,
    else in its finalizer process; False where one holds the lock already."""
    lock, token = broker.keys.batch_finalizing(stored.id), secrets.token_hex(16)
    if not broker.redis.set(lock, token, nx=True, ex=FINALIZE_LOCK_S):
        return False
    order = FinalizeOrder(settings=broker.settings, owner=owner, stored=stored, lock_token=token)
    if _small(broker, stored.id, lines):
        try:
            Finalizer(order, broker).run()
        except Exception:  # as a process's failure: its lock expires, a later read tries again
            log.exception("the finalization of batch %s failed", stored.id)
        return True
    try:
        launch(__name__, order)
    except BaseException:
        broker.redis.delete(lock)
        raise
    return True


@dataclass
class _Tally:
    """What the lines written so far add up to."""

    completed: int = 0
    failed: int = 0
    input_tokens: int = 0
    output_tokens: int = 0

    def add(self, result: LineResult) -> None:
        if result.part == "output":
            self.completed += 1
        else:
            self.failed += 1
        self.input_tokens += result.input_tokens
        self.output_tokens += result.output_tokens


class Finalizer:
    def __init__(self, order: FinalizeOrder, broker: Broker | None = None):
        """`broker`: the API process's, where it runs there (None: its own process's)."""
        broker = broker or standalone(order.settings)
        self._order, self._stored = order, order.stored
        self._redis, self._keys = broker.redis, broker.keys
        quotas = Quotas(broker.redis, broker.keys, order.settings)
        self._files = FileStore.of(broker.redis, broker.keys, order.settings, quotas)
        self._lock_script = broker.redis.register_script(_IF_MINE)

    def run(self) -> None:
        """Finalize the batch if it is still due; the lock goes once it has ended (a failure
        leaves it to expire: the next read tries again then)."""
        found: Any = self._redis.hmget(self._keys.batch(self._stored.id), ["status", "ending"])
        status, ending = found
        if status in ENDING:
            self._finalize(bytes(ending or b"completed").decode())
        self._if_mine("")  # another's lock, taken over since, stays

    def _renew(self) -> None:
        if not self._if_mine(FINALIZE_LOCK_S):
            raise LockLost(f"batch {self._stored.id}'s finalizing lock is no longer this one's")

    def _if_mine(self, expire_s: int | str) -> bool:
        """Renew the lock for `expire_s` ("": delete it) if it is still this finalizer's."""
        lock = self._keys.batch_finalizing(self._stored.id)
        return bool(self._lock_script(keys=[lock], args=[self._order.lock_token, expire_s]))

    def _finalize(self, ending: str) -> None:
        owner, stored = self._order.owner, self._stored
        ttl = stored.output_expires_after.seconds if stored.output_expires_after else None
        writers = {
            part: self._files.writer(owner, f"{stored.id}_{part}.jsonl", "batch_output", ttl)
            for part in ("output", "error")
        }
        tally = _Tally()
        try:
            for result in self._results(ending):
                writers[result.part].write(result.line.model_dump_json().encode() + b"\n")
                tally.add(result)
            fields = self._ended(ending, tally)
            for part, field in (("output", "output_file_id"), ("error", "error_file_id")):
                if writers[part].size:
                    fields[field] = writers[part].close().id
        except BaseException:
            for writer in writers.values():
                writer.discard()
            raise
        pipe = self._redis.pipeline()
        pipe.hset(self._keys.batch(stored.id), mapping=fields)
        pipe.expire(self._keys.batch(stored.id), self._order.settings.batch_ttl_s)
        pipe.delete(self._keys.batch_results(stored.id), self._keys.batch_lines(stored.id))
        queued_tokens.release(pipe, self._keys, owner, stored.id)  # what lines did not give back
        pipe.execute()

    def _ended(self, ending: str, tally: _Tally) -> dict[FieldT, EncodableT]:
        """The batch's fields once it has ended `ending` with `tally`."""
        return {
            "status": ending,
            f"{ending}_at": int(time.time()),
            "completed": tally.completed,
            "failed": tally.failed,
            "input_tokens": tally.input_tokens,
            "output_tokens": tally.output_tokens,
        }

    def _results(self, ending: str) -> Iterator[LineResult]:
        """Each line's result in input order, PAGE_LINES at a time, renewing the lock with
        each page; a line never answered gets its error line (`UNANSWERED`)."""
        code, message = UNANSWERED[ending]
        lines_key = self._keys.batch_lines(self._stored.id)
        results_key = self._keys.batch_results(self._stored.id)
        start = 0
        while True:
            custom_ids: Any = self._redis.lrange(lines_key, start, start + PAGE_LINES - 1)
            if not custom_ids:
                return
            indexes = list(range(start, start + len(custom_ids)))
            found: Any = self._redis.hmget(results_key, indexes)
            for custom_id, raw in zip(custom_ids, found, strict=True):
                if raw is not None:
                    yield LineResult.model_validate_json(raw)
                else:
                    line = BatchOutputLine.unanswered(bytes(custom_id).decode(), code, message)
                    yield LineResult(part="error", line=line)
            self._renew()
            start += len(custom_ids)


def main() -> None:
    order = read_order(FinalizeOrder)
    configure(order.settings)
    try:
        Finalizer(order).run()
    except Exception:
        log.exception("the finalization of batch %s failed", order.stored.id)
        raise
