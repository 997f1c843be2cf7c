"""A request's share of its key's rate limits (api/limits/rates.py), in Flask: admission takes
a generation's (`take_share`), a creating route's wrapper one request (`takes_a_request`), and
every answer to a key with per-minute limits states its buckets (the `x-ratelimit-*` headers).
The key and its limits are the request's (api/http/auth.py).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

from flask import Flask, Response, current_app, g
from redis.exceptions import RedisError

from api.backend import Backend, backend
from api.http.auth import key_limits, owner_id
from api.limits.rates import (
    HOLD_GRACE_S,
    Buckets,
    Hold,
    RateLimiter,
    admission_tokens,
    refusal,
)
from api.queue.context_window import PromptCount
from shared.queue import queued_tokens
from shared.queue.config import KeyLimits, Settings
from shared.queue.connection import redis_errors_as_503
from shared.queue.jobs import JobLimits, QueuedJob


def counts_tokens() -> bool:
    """Whether the caller's key has a limit its requests' tokens count against (tokens per
    minute, queued tokens): only then does taking a share need the prompt counted."""
    limits = key_limits()
    return limits is not None and (limits.tpm is not None or limits.queued is not None)


def take_share(
    job: QueuedJob, prompt: PromptCount | None, limits: JobLimits, wait_s: float
) -> int | None:
    """Take the job's share of its key's limits (nothing for a key without limits), or raise
    the 429. Returns the queued tokens the job now holds (None: its key has no such limit), for
    the job to carry and whoever ends it to give back; it holds them at most `wait_s` in its
    queue and then its longest run under `limits`."""
    key = key_limits()
    if key is None or not (key.per_minute or key.queued is not None):  # none of its limits
        return None
    settings = backend().settings
    hold = None
    if key.queued is not None:
        hold = Hold(job.job_id, _hold_ms(settings, limits, wait_s))
    counted = key.tpm is not None or hold is not None
    tokens = admission_tokens(settings, job, prompt) if counted else 0
    with redis_errors_as_503():
        verdict = limiter().take(owner_id(), key, tokens, hold)
    if key.per_minute:
        g.mlxq_rate = verdict.buckets  # the answer states the buckets as this request left them
    if not verdict.taken:
        raise refusal(key, verdict, tokens, settings.retry_after_s)
    return tokens if hold is not None else None


def takes_a_request(view: Callable[[], Response]) -> Callable[[], Response]:
    """Wrap a route that generates nothing itself (an upload; a batch, whose lines are not
    counted per minute; count_tokens, which renders and counts a prompt) so that it takes one
    request of its key's per-minute buckets, or answers their 429, before anything of the
    request, its body included, is read."""

    @functools.wraps(view)
    def wrapped() -> Response:
        key = key_limits()
        if key is not None and key.per_minute:
            per_minute = KeyLimits(rpm=key.rpm, tpm=key.tpm)  # its tokens: none
            with redis_errors_as_503():
                verdict = limiter().take(owner_id(), per_minute, 0)
            g.mlxq_rate = verdict.buckets
            if not verdict.taken:
                raise refusal(key, verdict, 0, backend().settings.retry_after_s)
        return view()

    return wrapped


def _hold_ms(settings: Settings, limits: JobLimits, wait_s: float) -> int:
    """The longest a job may hold its queued tokens: `wait_s` in its queue, then its longest
    run."""
    run_s = min(limits.run_limit_s or settings.job_timeout_s, settings.job_timeout_s)
    return math.ceil((wait_s + run_s + HOLD_GRACE_S) * 1000)


def release_hold(entry: str) -> None:
    """Give back what `entry` (a job taken off its queue, a batch that ended) holds of the
    caller's queued tokens, where no worker will; nothing for a key without that limit."""
    limits = key_limits()
    if limits is None or limits.queued is None:
        return
    b = backend()
    pipe = b.redis.pipeline(transaction=False)
    queued_tokens.release(pipe, b.keys, owner_id(), entry)
    with redis_errors_as_503():
        pipe.execute()


def limiter() -> RateLimiter:
    found: RateLimiter = current_app.extensions["mlxq.rate_limits"]
    return found


def _state_headers(response: Response) -> Response:
    limits = key_limits()
    if limits is None or not limits.per_minute:  # OpenAI has no header for queued tokens
        return response
    buckets: Buckets | None = g.get("mlxq_rate")
    if buckets is None:
        try:
            buckets = limiter().peek(owner_id(), limits)
        except RedisError:  # the answer is a 503 already, or stands without the headers
            return response
    response.headers.update(buckets.headers())
    return response


def init_app(app: Flask, b: Backend) -> None:
    app.extensions["mlxq.rate_limits"] = RateLimiter(b.redis, b.keys)
    app.after_request(_state_headers)
