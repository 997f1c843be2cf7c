"""Per-key rate limits (api/limits/rates.py) on a real Redis: the buckets, shared by every
limiter on the namespace as by every API process; OpenAI's headers and error on the app."""

from __future__ import annotations

import time

import pytest
from flask import Flask
from redis import Redis

from api import create_app
from api.limits.rates import TOO_LARGE, Hold, RateLimiter, duration, refusal
from shared.queue import queued_tokens
from shared.queue.config import KeyLimits, Settings
from shared.queue.keys import Keys
from tests.support import MESSAGES, assert_openai_error

LIMITED = "sk-limited"


def test_resets_are_written_as_openai_writes_them() -> None:
    assert [duration(ms) for ms in (0, 20, 999.2, 1000, 1500, 59_999, 60_000, 360_000)] == [
        "0s",
        "20ms",
        "1s",
        "1s",
        "1.5s",
        "59.999s",
        "1m0s",
        "6m0s",
    ]


@pytest.fixture
def limiters(redis: Redis, keys: Keys) -> tuple[RateLimiter, RateLimiter]:
    """Two limiters on the test's namespace, as two API processes have."""
    return RateLimiter(redis, keys), RateLimiter(redis, keys)


def test_two_limiters_share_a_keys_buckets_and_a_burst_gets_exactly_the_limit(
    limiters: tuple[RateLimiter, RateLimiter],
) -> None:
    first, second = limiters
    limits = KeyLimits(rpm=5)
    waits = [(first if i % 2 else second).take("alice", limits, 0).wait_ms for i in range(8)]
    assert waits[:5] == [0] * 5
    assert all(5_000 < wait <= 12_000 for wait in waits[5:])  # one request per 12 s comes back
    assert first.peek("bob", limits).requests == 5  # another key's buckets are its own
    assert second.peek("alice", limits).headers()["x-ratelimit-remaining-requests"] == "0"


def test_tokens_are_taken_only_with_the_request_and_a_request_over_the_limit_never_fits(
    redis: Redis, keys: Keys
) -> None:
    limiter = RateLimiter(redis, keys)
    limits = KeyLimits(rpm=100, tpm=1000)
    assert limiter.take("carol", limits, 600).wait_ms == 0
    verdict = limiter.take("carol", limits, 600)
    buckets = verdict.buckets
    assert verdict.wait_ms > 0 and 399 < buckets.tokens < 410 and 98 < buckets.requests < 99.1
    verdict = limiter.take("carol", limits, 1001)
    assert verdict.wait_ms == TOO_LARGE
    refused = refusal(limits, verdict, 1001, retry_after_s=5)
    assert (refused.status, refused.type, refused.code) == (429, "tokens", "rate_limit_exceeded")
    assert refused.headers() == {"x-should-retry": "false"}


def test_queued_tokens_are_held_by_their_entry_until_released_or_past_their_deadline(
    redis: Redis, keys: Keys, limiters: tuple[RateLimiter, RateLimiter]
) -> None:
    first, second = limiters
    limits = KeyLimits(queued=1000)
    hour = 3_600_000
    assert first.take("dave", limits, 600, Hold("job-a", hour)).taken
    refused = second.take("dave", limits, 600, Hold("job-b", hour))
    assert (refused.taken, refused.wait_ms, refused.queued, refused.queued_full) == (
        False,
        0,
        600,
        1,
    )
    assert second.take("erin", limits, 600, Hold("job-c", hour)).taken  # another key's own
    assert first.take("dave", limits, 1001, Hold("job-d", hour)).queued_full == TOO_LARGE
    pipe = redis.pipeline()
    queued_tokens.release(pipe, keys, "dave", "job-a")
    pipe.execute()
    assert second.take("dave", limits, 600, Hold("job-b", 50)).queued == 600
    time.sleep(0.1)  # job-b's release was lost: past its deadline, admission drops it
    assert first.take("dave", limits, 1000, Hold("job-e", hour)).queued == 1000


def test_a_key_with_only_a_queued_limit_takes_nothing_per_minute(redis: Redis, keys: Keys) -> None:
    verdict = RateLimiter(redis, keys).take("frank", KeyLimits(queued=10), 5, Hold("job", 60_000))
    assert verdict.taken and verdict.queued == 5
    assert not redis.exists(keys.rate_limit("frank"))
    assert 0 < redis.pttl(keys.queued_tokens("frank")) <= 60_000  # gone with its last entry


def _limited_app(app_settings: Settings, entry: str) -> Flask:
    return create_app(
        app_settings.model_copy(update={"api_keys": Settings(api_keys=entry).api_keys})
    )


def test_every_answer_to_a_limited_key_states_its_limits(app_settings: Settings) -> None:
    http = _limited_app(app_settings, f"{LIMITED}:rpm=30:tpm=9000,sk-free").test_client()
    answer = http.get("/v1/models", headers={"Authorization": f"Bearer {LIMITED}"})
    assert answer.status_code == 200
    assert {k: v for k, v in answer.headers.items() if k.startswith("x-ratelimit")} == {
        "x-ratelimit-limit-requests": "30",
        "x-ratelimit-remaining-requests": "30",
        "x-ratelimit-reset-requests": "0s",
        "x-ratelimit-limit-tokens": "9000",
        "x-ratelimit-remaining-tokens": "9000",
        "x-ratelimit-reset-tokens": "0s",
    }
    free = http.get("/v1/models", headers={"Authorization": "Bearer sk-free"})
    assert not [name for name, _ in free.headers if name.lower().startswith("x-ratelimit")]


def test_a_request_over_the_limit_is_a_429_with_retry_after_and_the_headers(
    app_settings: Settings,
) -> None:
    http = _limited_app(app_settings, f"{LIMITED}:tpm=100").test_client()
    body = {"model": "m", "messages": MESSAGES, "max_tokens": 200}
    refused = http.post(
        "/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {LIMITED}"}
    )
    assert_openai_error(refused, 429)
    assert refused.get_json()["error"]["code"] == "rate_limit_exceeded"
    assert refused.headers["x-should-retry"] == "false"
    assert refused.headers["x-ratelimit-limit-tokens"] == "100"
