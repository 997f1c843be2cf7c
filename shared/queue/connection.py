"""The Redis connection both sides use, with timeouts that make an outage fail fast."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from redis import Redis
from redis.backoff import ExponentialBackoff
from redis.exceptions import RedisError
from redis.retry import Retry

from shared.queue.config import Settings
from shared.wire.errors import BackendUnavailableError


def connect(settings: Settings) -> Redis:
    """A client whose calls fail within about `redis_timeout_s` when Redis is unreachable."""
    return Redis.from_url(
        settings.redis_url,
        socket_connect_timeout=settings.redis_timeout_s,
        socket_timeout=settings.redis_timeout_s,
        health_check_interval=30,
        max_connections=settings.redis_max_connections,
        retry=Retry(ExponentialBackoff(cap=0.2, base=0.02), retries=1),
    )


def connect_blocking(settings: Settings) -> Redis:
    """A client for blocking reads (subscribers, queue pops): silence is normal there."""
    return Redis.from_url(
        settings.redis_url,
        socket_connect_timeout=settings.redis_timeout_s,
        socket_keepalive=True,
        health_check_interval=10,
        max_connections=settings.redis_max_connections,
    )


def unavailable(err: RedisError) -> BackendUnavailableError:
    """The one translation of a Redis failure: BackendUnavailableError (503, OpenAI's body)."""
    return BackendUnavailableError(f"Redis is unreachable: {err}")


@contextmanager
def redis_errors_as_503() -> Iterator[None]:
    try:
        yield
    except RedisError as err:
        raise unavailable(err) from err
