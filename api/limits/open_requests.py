"""Open requests per key: the most requests, streams included, an API key has open at once.

A key with `:open=N` in MLXQ_API_KEYS (shared/queue/config.py) holds one place from the moment
an interactive request is admitted until its answer ends, however it ends; past N open ones
every API process answers 429 `rate_limit_exceeded` of type `open_requests`, with Retry-After,
so one key cannot hold every connection and slot the others need. A key without it pays
nothing.

The places are one sorted set per key (`Keys.open_requests`), job id -> when the place ends at
the latest, on Redis's clock: its queue deadline, plus the longest a job runs. An API process
that dies mid-request leaves its places behind, and they end then; every other ends with its
request. One script trims, counts and takes, so all API processes share the count.
"""

from __future__ import annotations

from flask import Flask, current_app
from redis import Redis

from api.backend import Backend
from api.http.auth import key_limits, owner_id
from shared.queue.connection import redis_errors_as_503
from shared.queue.keys import Keys
from shared.wire.errors import RateLimitError

# KEYS[1]: the key's set. ARGV: the job id, the cap, the place's life (ms). 1: taken; 0: full.
_TAKE = """
local now = redis.call('TIME')
local ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ms)
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[2]) then
  return 0
end
local ends = ms + tonumber(ARGV[3])
redis.call('ZADD', KEYS[1], ends, ARGV[1])
if redis.call('PTTL', KEYS[1]) < tonumber(ARGV[3]) then
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
end
return 1
"""


class OpenRequests:
    """The places of the current request's key (`take`, `give_back`)."""

    def __init__(self, redis: Redis, keys: Keys, life_s: float, retry_after_s: int):
        """`life_s`: the longest a request stays open (its queue wait and its run)."""
        self._redis = redis
        self._keys = keys
        self._life_ms = int(life_s * 1000)
        self._retry_after_ms = retry_after_s * 1000
        self._take = redis.register_script(_TAKE)

    def take(self, job_id: str) -> str | None:
        """Take a place for `job_id` if the caller's key has a cap, or raise the 429: the owner
        whose place it took (None: no cap, nothing taken), for `give_back`."""
        limits = key_limits()
        if limits is None or limits.open is None:
            return None
        owner = owner_id()
        key = self._keys.open_requests(owner)
        with redis_errors_as_503():
            taken = self._take(keys=[key], args=[job_id, limits.open, self._life_ms])
        if not taken:
            raise RateLimitError(
                f"Open request limit reached: Limit {limits.open}. Please try again once some "
                "of your open requests have ended.",
                kind="open_requests",
                retry_after_ms=self._retry_after_ms,
            )
        return owner

    def give_back(self, owner: str | None, job_id: str) -> None:
        """End the place `take` gave (`owner` None: none was taken). A Redis that is gone
        keeps it until its life ends."""
        if owner is None:
            return
        with redis_errors_as_503():
            self._redis.zrem(self._keys.open_requests(owner), job_id)


def open_requests() -> OpenRequests:
    found: OpenRequests = current_app.extensions["mlxq.open_requests"]
    return found


def init_app(app: Flask, b: Backend) -> None:
    s = b.settings
    life_s = s.queue_timeout_s + s.job_timeout_s
    app.extensions["mlxq.open_requests"] = OpenRequests(b.redis, b.keys, life_s, s.retry_after_s)
