"""Per-key quotas on what a key keeps in Redis, so that one key cannot fill the Redis that every
key shares (it runs `noeviction`: full, it refuses every caller's writes).

What each key (its owner, api/http/auth.py; without keys the one local owner) may keep at once
(shared/queue/config.py `QuotaSettings`, 0: no limit), by kind:
- `files`: its files, uploads and batch outputs, by count and by bytes;
- `responses`: its stored responses, by count and by their records' bytes;
- `batches`: its batches, whatever their status; `open_batches`: those not ended;
- `background`: its background responses queued or in progress;
- `idempotency`: its Idempotency-Key records, by count and by their kept answers' bytes.

Each object a key keeps is an entry in a sorted set of its owner and kind (keys.py `quota`),
scored by when its hold ends on Redis's clock: the object's own lifetime (a file's TTL, a stored
response's) or, for an object that ends on its own, its latest end. A file's bytes are also in
a hash beside them (keys.py `usage`), which lives no longer than they do. One script
(`RESERVE`) drops the entries past their end, checks the limits and adds the entry, in one
round trip, so two API processes cannot both take the last place, and an object that expires
needs no callback: its entry goes at the next check. Deleting an object takes its entry out
(`RELEASE`). An object is held before it is written: if writing it fails, its entry is
released.

Background responses and batches end when their jobs do, which nothing reports here: before a
check of those kinds, the owner's entries are looked up (the RQ job's status; the batch's status
and counters) and those ended are dropped. One not found ended too, unless it was held less
than `NEW_S` ago: its job or batch may not be written yet.

Over a quota of what a key keeps: 429 `insufficient_quota` (QuotaExceededError), which no wait
restores, with `x-should-retry: false`. Over a cap of what it runs at once (open background
responses and batches): 429 `rate_limit_exceeded` with the usual Retry-After, as for queued
tokens (api/limits/rates.py): some end soon. Batch outputs are counted but never refused:
they answer work the key was let start.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Literal

from flask import Flask, current_app
from redis import Redis
from redis.client import Pipeline
from rq.job import Job, JobStatus

from api.backend import Backend
from shared.queue.config import Settings
from shared.queue.connection import redis_errors_as_503
from shared.queue.keys import Keys
from shared.wire.batch.batches import COMPLETION_WINDOW_S, FINAL_STATUSES
from shared.wire.errors import MLXQError, QuotaExceededError, RateLimitError

Kind = Literal["files", "responses", "batches", "open_batches", "background", "idempotency"]
# How long after it was held an entry whose job or batch is not found still counts.
NEW_S = 60.0
_ENDED_JOB = frozenset(
    s.value for s in (JobStatus.FINISHED, JobStatus.FAILED, JobStatus.STOPPED, JobStatus.CANCELED)
)

# KEYS: the owner's entries of one kind, and their bytes (keys.py `usage`). ARGV: the object id,
# its hold (ms), the count limit (0: none), its bytes, the byte limit (0: none), 1 to check the
# limits (0: count it whatever). An entry held already is only ever held longer, and takes
# its new bytes if they are given (an Idempotency-Key's claim, then its kept answer): a claim
# of 0 bytes is refused once the kept bytes are past their limit. Both keys get
# every hold as their TTL, so the bytes never outlive the entries they sum. A hold of 0 holds
# nothing: it only trims and checks (`Quotas.ensure_room`). Returns 0 if held (1: over the count, 2:
# over the bytes), the count and the bytes after.
RESERVE = """
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local id, hold = ARGV[1], tonumber(ARGV[2])
for _, gone in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now)) do
  local size = redis.call('HGET', KEYS[2], 'object:' .. gone)
  if size then
    redis.call('HINCRBY', KEYS[2], 'total', -tonumber(size))
    redis.call('HDEL', KEYS[2], 'object:' .. gone)
  end
end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local count = redis.call('ZCARD', KEYS[1])
local bytes = tonumber(redis.call('HGET', KEYS[2], 'total')) or 0
local held = redis.call('ZSCORE', KEYS[1], id)
local size, full = tonumber(ARGV[4]), 0
if not held and ARGV[6] == '1' then
  local most, most_bytes = tonumber(ARGV[3]), tonumber(ARGV[5])
  if most > 0 and count >= most then
    full = 1
  elseif most_bytes > 0 and bytes + size > most_bytes then
    full = 2
  end
end
if full == 0 and hold > 0 then
  redis.call('ZADD', KEYS[1], 'GT', now + hold, id)
  if not held then count = count + 1 end
  local old = tonumber(redis.call('HGET', KEYS[2], 'object:' .. id)) or 0
  if size > 0 and size ~= old then  -- a held entry's object may be written bigger (a claim's)
    redis.call('HSET', KEYS[2], 'object:' .. id, size)
    bytes = redis.call('HINCRBY', KEYS[2], 'total', size - old)
  end
  for i = 1, 2 do  -- each lives as long as its longest entry
    if redis.call('PTTL', KEYS[i]) < hold then redis.call('PEXPIRE', KEYS[i], hold) end
  end
end
return {full, count, bytes}
"""

# KEYS: as RESERVE's. ARGV: the object id. Idempotent.
RELEASE = """
if redis.call('ZREM', KEYS[1], ARGV[1]) == 1 then
  local size = redis.call('HGET', KEYS[2], 'object:' .. ARGV[1])
  if size then
    redis.call('HINCRBY', KEYS[2], 'total', -tonumber(size))
    redis.call('HDEL', KEYS[2], 'object:' .. ARGV[1])
  end
end
"""


@dataclass(frozen=True)
class Usage:
    """What one object takes of its owner's quota of `kind`: a place and `size` bytes, for
    `hold_s` (None: the kind's own, `Quotas.hold_s`)."""

    kind: Kind
    object_id: str
    size: int = 0
    hold_s: float | None = None


def _job_ended(answer: Any) -> bool | None:
    """Whether a background response's job ended (None: no such job)."""
    return None if answer is None else bytes(answer).decode() in _ENDED_JOB


def _batch_ended(answer: Any) -> bool | None:
    """Whether a batch ended (None: no such batch): a final status, or every line answered
    once its intake has taken them all in (its status moves when someone next reads it,
    api/stores/batches.py)."""
    fields = (None if v is None else bytes(v).decode() for v in answer)
    status, completed, failed, total, intake_until = fields
    if status is None:
        return None
    done = int(completed or 0) + int(failed or 0)
    answered = status == "in_progress" and not intake_until and done >= int(total or 0)
    return status in FINAL_STATUSES or answered


class Quotas:
    """The quotas of every owner under one namespace and its settings."""

    def __init__(self, redis: Redis, keys: Keys, settings: Settings):
        self._redis, self._keys, self._settings = redis, keys, settings
        self._reserve = redis.register_script(RESERVE)
        self._release = redis.register_script(RELEASE)

    def hold_s(self, kind: Kind) -> float:
        """The longest an entry of `kind` is held: the object's lifetime, or its latest end."""
        s = self._settings
        return {
            "files": s.batch_ttl_s,  # a file with its own expiry says so
            "responses": s.response_ttl_s,
            "batches": COMPLETION_WINDOW_S + s.batch_ttl_s,  # kept from its end
            "open_batches": COMPLETION_WINDOW_S + s.job_timeout_s,
            "background": s.response_ttl_s + s.job_timeout_s,  # it may wait as long as it is kept
            "idempotency": 24 * 3600,  # a kept answer's (api/stores/idempotency.py)
        }[kind]

    def limits(self, kind: Kind) -> tuple[int, int]:
        """The most objects of `kind` a key keeps, and bytes (0: no limit)."""
        s = self._settings
        count = {
            "files": s.quota_files,
            "responses": s.quota_responses,
            "batches": s.quota_batches,
            "open_batches": s.quota_open_batches,
            "background": s.quota_background,
            "idempotency": s.quota_idempotency_keys,
        }[kind]
        most_bytes = {
            "files": s.quota_file_bytes,
            "responses": s.quota_response_bytes,
            "idempotency": s.quota_idempotency_bytes,
        }
        return count, most_bytes.get(kind, 0)

    def ensure_room(self, owner: str, usage: Usage, at_least: bool = False) -> None:
        """Raise the refusal that `take` would give `usage` (`at_least`: its size is a lower
        bound), holding nothing, so a caller can refuse what cannot fit before reading it."""
        count, most_bytes = self.limits(usage.kind)
        if not (count or most_bytes):
            return
        keys = [self._keys.quota(owner, usage.kind), self._keys.usage(owner, usage.kind)]
        with redis_errors_as_503():
            # A hold of 0: RESERVE trims what expired and checks the limits, and adds nothing.
            args: list[str | int] = [usage.object_id, 0, count, usage.size, most_bytes, 1]
            full, held, size = self._reserve(keys=keys, args=args)
        if full:
            raise _refusal(self._settings, usage, int(held), int(size), count, most_bytes, at_least)

    def take(self, owner: str, *usages: Usage) -> None:
        """Hold each of `usages`, or none of them and raise the refusal of the first that does
        not fit. A kind without limits holds nothing."""
        taken: list[Usage] = []
        try:
            for usage in usages:
                if any(self.limits(usage.kind)):
                    self._take(owner, usage, check=True)
                    taken.append(usage)
        except BaseException:
            self.release(owner, *taken)
            raise

    def count(self, owner: str, usage: Usage) -> None:
        """Hold `usage` whatever the limits (an output file, a record kept longer)."""
        if any(self.limits(usage.kind)):
            self._take(owner, usage, check=False)

    @contextlib.contextmanager
    def holding(self, owner: str, *usages: Usage) -> Iterator[None]:
        """Hold `usages` while the objects are written; if that fails, release them."""
        self.take(owner, *usages)
        try:
            yield
        except BaseException:
            self.release(owner, *usages)
            raise

    def release(self, owner: str, *usages: Usage, pipe: Pipeline | None = None) -> None:
        """Give back what deleted (or never written) objects held; on `pipe` if given."""
        if not usages:
            return
        target = pipe if pipe is not None else self._redis.pipeline(transaction=False)
        for usage in usages:
            keys = [self._keys.quota(owner, usage.kind), self._keys.usage(owner, usage.kind)]
            self._release(keys=keys, args=[usage.object_id], client=target)
        if pipe is None:
            with redis_errors_as_503():
                target.execute()

    def _take(self, owner: str, usage: Usage, check: bool) -> None:
        count, most_bytes = self.limits(usage.kind)
        hold_s = usage.hold_s if usage.hold_s is not None else self.hold_s(usage.kind)
        keys = [self._keys.quota(owner, usage.kind), self._keys.usage(owner, usage.kind)]
        with redis_errors_as_503():
            if check and usage.kind in _OPEN:
                self._drop_ended(keys[0], usage.kind)
            args: list[str | int] = [usage.object_id, int(hold_s * 1000), count, usage.size]
            args += [most_bytes, int(check)]
            full, held, size = self._reserve(keys=keys, args=args)
        if full:
            raise _refusal(self._settings, usage, int(held), int(size), count, most_bytes)

    def _drop_ended(self, key: str, kind: Kind) -> None:
        """Drop the entries of `key` (a kind in `_OPEN`) whose job or batch ended."""
        entries: Any = self._redis.zrange(key, 0, -1, withscores=True)
        if not entries:
            return
        ask, ended = _OPEN[kind]
        pipe = self._redis.pipeline(transaction=False)
        pipe.time()
        for object_id, _ in entries:
            ask(pipe, self._keys, bytes(object_id).decode())
        (seconds, micros), *answers = pipe.execute()
        new_after = (seconds + micros / 1e6 - NEW_S) * 1000  # held after this: maybe unwritten
        held_ms = self.hold_s(kind) * 1000
        gone: list[bytes] = []
        for (object_id, until), answer in zip(entries, answers, strict=True):
            over = ended(answer)
            if over or (over is None and until - held_ms < new_after):
                gone.append(object_id)
        if gone:
            self._redis.zrem(key, *gone)


def _ask_job(pipe: Pipeline, keys: Keys, object_id: str) -> None:
    pipe.hget(Job.key_for(object_id), "status")


def _ask_batch(pipe: Pipeline, keys: Keys, object_id: str) -> None:
    pipe.hmget(keys.batch(object_id), ["status", "completed", "failed", "total", "intake_until"])


# The kinds of objects that end on their own: how to ask whether one did, and how to read it.
_OPEN: dict[str, tuple[Callable[[Pipeline, Keys, str], None], Callable[[Any], bool | None]]] = {
    "background": (_ask_job, _job_ended),
    "open_batches": (_ask_batch, _batch_ended),
}


def _refusal(
    settings: Settings,
    usage: Usage,
    count: int,
    size: int,
    most: int,
    most_bytes: int,
    at_least: bool = False,
) -> MLXQError:
    """What a key over its quota of `usage.kind` is told (`count` and `size`: what it keeps)."""
    later = settings.retry_after_s * 1000
    if usage.kind == "background":
        return RateLimitError(
            f"This API key has {count} background responses queued or in progress, its limit "
            f"of {most}. Please try again once some have finished.",
            kind="background_responses",
            retry_after_ms=later,
        )
    if usage.kind == "open_batches":
        return RateLimitError(
            f"This API key has {count} batches in progress, its limit of {most}. Please try "
            "again once some have ended.",
            kind="open_batches",
            retry_after_ms=later,
        )
    if usage.kind in _BYTES and (not most or count < most):  # the bytes are over, not the count
        return bytes_refusal(usage.kind, usage.size, size, most_bytes, at_least)
    what, remedy = _KEPT[usage.kind]
    return QuotaExceededError(
        f"This API key keeps {count} {what}, its quota. {remedy}",
        param="Idempotency-Key" if usage.kind == "idempotency" else None,
    )


def bytes_refusal(
    kind: Kind, size: int, held: int, most_bytes: int, at_least: bool = False
) -> QuotaExceededError:
    """What a key is told whose object of `size` bytes (`at_least`: or more, an upload told
    from its Content-Length) would pass its byte quota of `kind` (`held`: what its objects of
    that kind hold now)."""
    what, setting, param = _BYTES[kind]
    remedy = _KEPT[kind][1]
    if not size:  # a place whose bytes come later (an Idempotency-Key's answer)
        return QuotaExceededError(
            f"This API key's {what}s hold {held} bytes, its quota of {most_bytes} bytes "
            f"({setting}). {remedy}",
            param=param,
        )
    return QuotaExceededError(
        f"This {what} of {'at least ' if at_least else ''}{size} bytes would pass this API "
        f"key's quota of {most_bytes} bytes ({setting}): its {what}s hold {held}. {remedy}",
        param=param,
    )


# The kinds counted in bytes: what one is called, the setting of its quota, the param named.
_BYTES: dict[str, tuple[str, str, str | None]] = {
    "files": ("file", "MLXQ_QUOTA_FILE_BYTES", "file"),
    "responses": ("stored response", "MLXQ_QUOTA_RESPONSE_BYTES", None),
    "idempotency": ("Idempotency-Key record", "MLXQ_QUOTA_IDEMPOTENCY_BYTES", "Idempotency-Key"),
}

# What a key over its quota of a kind keeps, and what it can do.
_KEPT: dict[str, tuple[str, str]] = {
    "files": ("files", "Delete files you no longer need, or wait for them to expire."),
    "responses": (
        "stored responses",
        "Delete responses you no longer need, wait for them to expire, or send store=false.",
    ),
    "batches": (
        "batches",
        "Wait for ended batches to expire; an ended message batch can be deleted.",
    ),
    "idempotency": (
        "Idempotency-Key records",
        "Each is kept 24 hours: send the request without an Idempotency-Key, or send it once "
        "older records have expired.",
    ),
}


def quotas() -> Quotas:
    found: Quotas = current_app.extensions["mlxq.quotas"]
    return found


def init_app(app: Flask, b: Backend) -> None:
    app.extensions["mlxq.quotas"] = Quotas(b.redis, b.keys, b.settings)
