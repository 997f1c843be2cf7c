"""Per-key rate limits: requests and tokens per minute, fleet-wide, stated as OpenAI states them.

A key's limits come from its MLXQ_API_KEYS entry (`sk-key:rpm=60:tpm=40000`,
shared/queue/config.py). Each limit is a bucket that holds at most the limit and refills
continuously at limit/60 per second; a generation request (chat, text completion, response,
background or not) takes one request and its tokens from the buckets, or is refused with 429
`rate_limit_exceeded` and a `Retry-After` (and `retry-after-ms`) saying when it would fit. One
Lua script decides and takes, against Redis's clock, so every API process shares the buckets
and two processes cannot both take the last request.

Tokens at admission, as OpenAI counts them: the prompt's tokens (counted with the model's
published tokenizer and chat template, as for the context window; estimated as UTF-8 bytes / 4
when the model published none) plus the most the completion may produce (`max_tokens`, else
MLXQ_DEFAULT_MAX_TOKENS within what the context window leaves), times the choices. A request
larger than the tokens per minute can never fit: it is refused with `x-should-retry: false`.

Every answer to a key with limits carries `x-ratelimit-limit-requests`,
`x-ratelimit-remaining-requests`, `x-ratelimit-reset-requests` (the time until the bucket is full
again, as "1s", "6m0s", "20ms") and the `-tokens` counterparts, for the limits the key has: the
state right after this request took its share, or, for requests that take nothing (a retrieve,
an upload), the state now.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from flask import Flask, Response, current_app, g
from redis import Redis
from redis.exceptions import RedisError

from api.http.auth import key_limits, owner_id
from api.queue.broker import Broker, broker
from shared.queue import backlog
from shared.queue.config import KeyLimits
from shared.queue.connection import redis_errors_as_503
from shared.queue.context_window import completion_budget
from shared.queue.jobs import EmbeddingJob, QueuedJob
from shared.queue.keys import Keys
from shared.wire.errors import RateLimitError

WINDOW_MS = 60_000
TOO_LARGE = -1

# KEYS: the key's bucket hash. ARGV: requests per minute, tokens per minute (0: no limit),
# tokens asked, 1 to take them (0: only look).
# Returns: 1 if taken, requests left, tokens left (as strings: Lua numbers reach the client
# as integers), ms until the request would fit (0: it fits; -1: it never can).
TAKE = """
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local rpm, tpm, asked = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local held = redis.call('HMGET', KEYS[1], 'requests', 'tokens', 'at')
local elapsed = math.max(0, now - (tonumber(held[3]) or now))
local function level(stored, limit)
  if limit == 0 then return 0 end
  return math.min(limit, (tonumber(stored) or limit) + elapsed * limit / 60000)
end
local requests, tokens = level(held[1], rpm), level(held[2], tpm)
local wait = 0
if rpm > 0 and requests < 1 then wait = (1 - requests) * 60000 / rpm end
if tpm > 0 and asked > tpm then
  wait = -1
elseif tpm > 0 and tokens < asked then
  wait = math.max(wait, (asked - tokens) * 60000 / tpm)
end
local taken = 0
if ARGV[4] == '1' and wait == 0 then
  taken = 1
  if rpm > 0 then requests = requests - 1 end
  if tpm > 0 then tokens = tokens - asked end
  redis.call('HSET', KEYS[1], 'requests', requests, 'tokens', tokens, 'at', now)
  redis.call('PEXPIRE', KEYS[1], 60000)
end
return {taken, tostring(requests), tostring(tokens), math.ceil(wait)}
"""


def duration(ms: float) -> str:
    """A time span as OpenAI writes its resets: "20ms", "1s", "1.5s", "6m0s"."""
    whole = math.ceil(ms)
    if whole <= 0:
        return "0s"
    if whole < 1000:
        return f"{whole}ms"
    minutes, rest = divmod(whole, WINDOW_MS)
    seconds = f"{rest / 1000:.3f}".rstrip("0").rstrip(".") + "s"
    return f"{minutes}m{seconds}" if minutes else seconds


@dataclass(frozen=True)
class Buckets:
    """A key's limits and what is left of them."""

    limits: KeyLimits
    requests: float
    tokens: float

    def headers(self) -> dict[str, str]:
        out: dict[str, str] = {}
        for kind, limit, left in (
            ("requests", self.limits.rpm, self.requests),
            ("tokens", self.limits.tpm, self.tokens),
        ):
            if limit is not None:
                out[f"x-ratelimit-limit-{kind}"] = str(limit)
                out[f"x-ratelimit-remaining-{kind}"] = str(max(0, math.floor(left)))
                out[f"x-ratelimit-reset-{kind}"] = duration((limit - left) * WINDOW_MS / limit)
        return out


class RateLimiter:
    def __init__(self, redis: Redis, keys: Keys):
        self._keys = keys
        self._take = redis.register_script(TAKE)

    def _run(self, owner: str, limits: KeyLimits, tokens: int, take: bool) -> tuple[Buckets, int]:
        args = [limits.rpm or 0, limits.tpm or 0, tokens, int(take)]
        _, requests, left, wait_ms = self._take(keys=[self._keys.rate_limit(owner)], args=args)
        return Buckets(limits, float(requests), float(left)), int(wait_ms)

    def peek(self, owner: str, limits: KeyLimits) -> Buckets:
        return self._run(owner, limits, 0, take=False)[0]

    def take(self, owner: str, limits: KeyLimits, tokens: int) -> tuple[Buckets, int]:
        """Take one request and `tokens` from the key's buckets if both hold enough. Returns
        the buckets after, and 0 if taken, else the ms until they would hold enough
        (`TOO_LARGE`: never)."""
        return self._run(owner, limits, tokens, take=True)


def refusal(limits: KeyLimits, buckets: Buckets, tokens: int, wait_ms: int) -> RateLimitError:
    """OpenAI's 429 for a request the buckets could not take."""
    if wait_ms == TOO_LARGE:
        return RateLimitError(
            f"Request too large for tokens per min (TPM): Limit {limits.tpm}, Requested "
            f"{tokens}. The input or output tokens must be reduced in order to run successfully.",
            kind="tokens",
            retry_after_ms=None,
        )
    on_requests = limits.rpm is not None and buckets.requests < 1
    kind, short = ("requests", "RPM") if on_requests else ("tokens", "TPM")
    limit, asked = (limits.rpm, 1) if on_requests else (limits.tpm, tokens)
    return RateLimitError(
        f"Rate limit reached on {kind} per min ({short}): Limit {limit}, Requested {asked}. "
        f"Please try again in {duration(wait_ms)}.",
        kind=kind,
        retry_after_ms=wait_ms,
    )


def admission_tokens(b: Broker, job: QueuedJob) -> int:
    """What a job counts against tokens per minute (the module docstring says how); an
    embedding job generates nothing, so its inputs' estimated tokens are all it counts."""
    if isinstance(job, EmbeddingJob):
        return backlog.estimate_tokens(job)
    counter = b.windows.counter(job.model)
    cap = job.max_tokens if job.max_tokens is not None else b.settings.default_max_tokens
    if counter is None:
        return backlog.estimate_tokens(job) + cap * job.choices()
    prompt = counter.count(job)
    where = "messages" if job.messages is not None else "prompt"
    room = completion_budget(prompt, job.max_tokens, counter.context_length, where)
    return prompt * max(1, len(job.prompt_items())) + min(cap, room) * job.choices()


def admit(job: QueuedJob) -> None:
    """Take the job's share of its key's limits (nothing for a key without limits)."""
    limits = key_limits()
    if limits is None:
        return
    b = broker()
    with redis_errors_as_503():
        tokens = admission_tokens(b, job) if limits.tpm is not None else 0
        buckets, wait_ms = limiter().take(owner_id(), limits, tokens)
    g.mlxq_rate = buckets  # the answer states the buckets as this request left them
    if wait_ms != 0:
        raise refusal(limits, buckets, tokens, wait_ms)


def limiter() -> RateLimiter:
    found: RateLimiter = current_app.extensions["mlxq.rate_limits"]
    return found


def _state_headers(response: Response) -> Response:
    limits = key_limits()
    if limits is None:
        return response
    buckets: Buckets | None = g.get("mlxq_rate")
    if buckets is None:
        try:
            buckets = limiter().peek(owner_id(), limits)
        except RedisError:  # the answer is a 503 already, or stands without the headers
            return response
    response.headers.update(buckets.headers())
    return response


def init_app(app: Flask, b: Broker) -> None:
    app.extensions["mlxq.rate_limits"] = RateLimiter(b.redis, b.keys)
    app.after_request(_state_headers)
