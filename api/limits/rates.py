"""Per-key rate limits: requests and tokens per minute, fleet-wide, stated as OpenAI states them.

A key's limits come from its MLXQ_API_KEYS entry (`sk-key:rpm=60:tpm=40000`,
shared/queue/config.py). Each limit is a bucket that holds at most the limit and refills
continuously at limit/60 per second; a generation request (chat, text completion, response,
background or not) takes one request and its tokens from the buckets, and every other creating
request (a file upload, a batch, a message batch: `takes_a_request`) one request, or is refused
with 429
`rate_limit_exceeded` and a `Retry-After` (and `retry-after-ms`) saying when it would fit. One
Lua script decides and takes, against Redis's clock, so every API process shares the buckets
and two processes cannot both take the last request.

Tokens at admission, as OpenAI counts them: the prompt's tokens (counted once per request with
the model's published tokenizer and chat template, for the context window too, by
api/queue/admission.py; estimated as UTF-8 bytes / 4 when the model published none) plus the
most the completion may produce (`max_tokens`, else MLXQ_DEFAULT_MAX_TOKENS within what the
context window leaves), times the choices. A request
larger than the tokens per minute can never fit: it is refused with `x-should-retry: false`.

A key with a queued-token limit (`:queued=N`, OpenAI's batch queue limit) may hold at most N
tokens, counted the same way, in jobs accepted but not yet ended (shared/queue/queued_tokens.py
keeps and gives them back). The same script checks it and takes the request's share, all limits
or none: over it, 429 `rate_limit_exceeded` of type `queued_tokens` with the usual Retry-After
(MLXQ_RETRY_AFTER_S: nobody knows when jobs end), or `x-should-retry: false` for a request larger
than the limit. A batch takes its lines' tokens a chunk at a time as they pass intake, into one
entry, and over the limit fails as OpenAI's does, `failed` with the error
`token_limit_exceeded` (an Anthropic message batch ends with every request `errored`).
OpenAI states no header for it, so none is sent.

Every answer to a key with per-minute limits carries `x-ratelimit-limit-requests`,
`x-ratelimit-remaining-requests`, `x-ratelimit-reset-requests` (the time until the bucket is full
again, as "1s", "6m0s", "20ms") and the `-tokens` counterparts, for the limits the key has: the
state right after this request took its share, or, for requests that take nothing (a retrieve,
an upload), the state now.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from redis import Redis

from api.queue.context_window import PromptCount
from shared.queue import backlog, queued_tokens
from shared.queue.config import KeyLimits, Settings
from shared.queue.jobs import EmbeddingJob, GenerationJob, QueuedJob
from shared.queue.keys import Keys
from shared.wire.errors import ContextLengthError, RateLimitError

WINDOW_MS = 60_000
TOO_LARGE = -1
# How long past its computed end a job's queued-token entry is kept before admission drops it.
HOLD_GRACE_S = 60.0

# KEYS: the key's bucket hash, its queued-token entries and their deadlines
# (shared/queue/queued_tokens.py). ARGV: requests per minute, tokens per minute (0: no limit),
# tokens asked, 1 to take them (0: only look), the queued-token limit (0: none), the entry that
# holds them (a job or batch id) and how many ms it may hold them at most.
# Returns: 1 if taken, requests left, tokens left (as strings: Lua numbers reach the client
# as integers), ms until the request would fit (0: it fits; -1: it never can), the tokens the
# key holds queued (after taking), 0 if the queued tokens fit (1: not now; -1: never).
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
local limit, queued, full = tonumber(ARGV[5]), 0, 0
if limit > 0 then
  for _, lost in ipairs(redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now)) do
    redis.call('HDEL', KEYS[2], lost)
  end
  redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now)
  for _, entry in ipairs(redis.call('HVALS', KEYS[2])) do queued = queued + tonumber(entry) end
  if asked > limit then full = -1 elseif queued + asked > limit then full = 1 end
end
local taken = 0
if ARGV[4] == '1' and wait == 0 and full == 0 then
  taken = 1
  if rpm > 0 or tpm > 0 then
    if rpm > 0 then requests = requests - 1 end
    if tpm > 0 then tokens = tokens - asked end
    redis.call('HSET', KEYS[1], 'requests', requests, 'tokens', tokens, 'at', now)
    redis.call('PEXPIRE', KEYS[1], 60000)
  end
  if limit > 0 then
    local hold = tonumber(ARGV[7])
    redis.call('HINCRBY', KEYS[2], ARGV[6], asked)  -- a batch's entry grows a chunk at a time
    redis.call('ZADD', KEYS[3], now + hold, ARGV[6])
    for i = 2, 3 do  -- both live as long as their longest entry
      if redis.call('PTTL', KEYS[i]) < hold then redis.call('PEXPIRE', KEYS[i], hold) end
    end
    queued = queued + asked
  end
end
return {taken, tostring(requests), tostring(tokens), math.ceil(wait), queued, full}
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


@dataclass(frozen=True)
class Hold:
    """What a request asks of its key's queued tokens: `entry` (its job or batch id) holds its
    tokens for at most `hold_ms`."""

    entry: str
    hold_ms: int


@dataclass(frozen=True)
class Verdict:
    """What one TAKE decided: the buckets after it; `wait_ms` 0 if the per-minute limits took
    the request (else when they would, `TOO_LARGE`: never); the tokens the key holds queued and
    `queued_full` 0 if the request's fit among them (1: not now, `TOO_LARGE`: never)."""

    buckets: Buckets
    wait_ms: int
    queued: int
    queued_full: int

    @property
    def taken(self) -> bool:
        return self.wait_ms == 0 and self.queued_full == 0


class RateLimiter:
    def __init__(self, redis: Redis, keys: Keys):
        self._keys = keys
        self._take = redis.register_script(TAKE)

    def _run(
        self, owner: str, limits: KeyLimits, tokens: int, take: bool, hold: Hold | None = None
    ) -> Verdict:
        keys = [self._keys.rate_limit(owner), *queued_tokens.hold_keys(self._keys, owner)]
        queued: list[str | int] = [limits.queued or 0, hold.entry, hold.hold_ms] if hold else [0]
        args = [limits.rpm or 0, limits.tpm or 0, tokens, int(take), *queued]
        _, requests, left, wait_ms, held, full = self._take(keys=keys, args=args)
        buckets = Buckets(limits, float(requests), float(left))
        return Verdict(buckets, int(wait_ms), int(held), int(full))

    def peek(self, owner: str, limits: KeyLimits) -> Buckets:
        return self._run(owner, limits, 0, take=False).buckets

    def take(self, owner: str, limits: KeyLimits, tokens: int, hold: Hold | None = None) -> Verdict:
        """Take one request and `tokens` from the key's per-minute buckets (those it has), and
        with `hold` put `tokens` among its queued tokens, if all of them have room: all or
        nothing."""
        return self._run(owner, limits, tokens, take=True, hold=hold)


def refusal(limits: KeyLimits, verdict: Verdict, tokens: int, retry_after_s: int) -> RateLimitError:
    """OpenAI's 429 for a request the buckets could not take; `retry_after_s` for queued
    tokens that may have room later (MLXQ_RETRY_AFTER_S: nobody knows when jobs end)."""
    if verdict.wait_ms == TOO_LARGE:
        return RateLimitError(
            f"Request too large for tokens per min (TPM): Limit {limits.tpm}, Requested "
            f"{tokens}. The input or output tokens must be reduced in order to run successfully.",
            kind="tokens",
            retry_after_ms=None,
        )
    if verdict.queued_full == TOO_LARGE or verdict.wait_ms == 0:  # the queued tokens had no room
        return _queued_refusal(
            verdict,
            retry_after_s,
            never=f"Request too large for queued tokens: Limit {limits.queued}, Requested "
            f"{tokens}. The input or output tokens must be reduced in order to run successfully.",
            later=f"Queued token limit reached: Limit {limits.queued}, Queued {verdict.queued}, "
            f"Requested {tokens}. Please try again once some of your queued or running "
            "requests have finished.",
        )
    buckets, wait_ms = verdict.buckets, verdict.wait_ms
    on_requests = limits.rpm is not None and buckets.requests < 1
    kind, short = ("requests", "RPM") if on_requests else ("tokens", "TPM")
    limit, asked = (limits.rpm, 1) if on_requests else (limits.tpm, tokens)
    return RateLimitError(
        f"Rate limit reached on {kind} per min ({short}): Limit {limit}, Requested {asked}. "
        f"Please try again in {duration(wait_ms)}.",
        kind=kind,
        retry_after_ms=wait_ms,
    )


def _queued_refusal(verdict: Verdict, retry_after_s: int, never: str, later: str) -> RateLimitError:
    """The 429 of a request or batch whose tokens the key's queued tokens had no room for:
    `never` when they are more than the limit itself (no wait helps), else `later`, to retry
    after MLXQ_RETRY_AFTER_S (nobody knows when queued jobs end)."""
    if verdict.queued_full == TOO_LARGE:
        return RateLimitError(never, kind="queued_tokens", retry_after_ms=None)
    retry_after_ms = retry_after_s * 1000
    return RateLimitError(later, kind="queued_tokens", retry_after_ms=retry_after_ms)


def admission_tokens(settings: Settings, job: QueuedJob, prompt: PromptCount | None) -> int:
    """What a job counts against tokens per minute (the module docstring says how), its prompt
    counted by admission (None: not countable, estimated); an embedding job generates nothing,
    so its inputs' estimated tokens are all it counts."""
    if isinstance(job, EmbeddingJob):
        return backlog.estimate_tokens(job)
    cap = job.max_tokens if job.max_tokens is not None else settings.default_max_tokens
    if prompt is None:
        return backlog.estimate_tokens(job) + cap * job.choices()
    room = prompt.room(job)
    return prompt.tokens * max(1, len(job.prompt_items())) + min(cap, room) * job.choices()


Measure = Callable[[GenerationJob], PromptCount | None]


@dataclass(frozen=True)
class BatchEntry:
    """A batch's entry among its owner's queued tokens: at most `limit`, until the batch
    expires."""

    owner: str
    limit: int
    batch_id: str
    expires_at: int


class BatchHold:
    """A batch's entry among its key's queued tokens (`limit`), taken a chunk of lines at a
    time as they pass intake (api/stores/batch_feed.py, outside any request), each line's
    share carried by its job; the entry holds what the batch's lines took until each is
    answered, or the batch ends."""

    def __init__(
        self, limiter: RateLimiter, measure: Measure, entry: BatchEntry, settings: Settings
    ):
        self._limiter, self._measure, self._settings = limiter, measure, settings
        self._owner, self._limit, self._entry = entry.owner, entry.limit, entry.batch_id
        hold_s = entry.expires_at - time.time() + settings.job_timeout_s + HOLD_GRACE_S
        self._hold_ms = math.ceil(hold_s * 1000)
        self.taken = 0  # tokens the batch's lines took so far

    def take(self, jobs: list[GenerationJob]) -> list[GenerationJob]:
        """The lines as they will be queued, their tokens taken; a RateLimitError (OpenAI's
        `token_limit_exceeded` text) when they do not fit."""
        counts = [self._line_tokens(job) for job in jobs]
        total = self.taken + sum(counts)
        if total > self._limit:
            raise RateLimitError(
                f"This batch holds {total} tokens or more, more than this API key's limit of "
                f"{self._limit} enqueued tokens: it can never run. Split it into smaller batches.",
                kind="queued_tokens",
                retry_after_ms=None,
            )
        queued_only = KeyLimits(queued=self._limit)  # a batch takes nothing per minute
        hold = Hold(self._entry, self._hold_ms)
        verdict = self._limiter.take(self._owner, queued_only, sum(counts), hold)
        if not verdict.taken:
            raise RateLimitError(
                f"Enqueued token limit reached for this API key. Limit: {self._limit} enqueued "
                f"tokens, queued now {verdict.queued}, this batch {total}. Please try again "
                "once some in_progress batches or requests have been completed.",
                kind="queued_tokens",
                retry_after_ms=None,
            )
        self.taken = total
        return [
            job.model_copy(update={"queued_tokens": count})  # before they are queued
            for job, count in zip(jobs, counts, strict=True)
        ]

    def _line_tokens(self, job: GenerationJob) -> int:
        """A batch line's admission tokens; a line over the context window fails alone on its
        worker without generating (its error line), so its prompt's estimate is all it holds."""
        try:
            return admission_tokens(self._settings, job, self._measure(job))
        except ContextLengthError:
            return backlog.estimate_tokens(job)
