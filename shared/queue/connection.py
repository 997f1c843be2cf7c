"""The Redis connection both sides use, with timeouts that make an outage fail fast.

REDIS_URL is a Redis URL (`redis://`, `rediss://`, `unix://`: redis-py's `from_url`), or the
Sentinels that follow a primary:
`redis+sentinel://[[user]:password@]host:port[,host:port...]/service[/db]`. Then every
connection asks a Sentinel where the service's primary is, and asks again when a connection
fails or finds a replica (redis-py's `SentinelConnectionPool`): after a failover the API and the
workers follow the new primary by themselves. The password is the primary's; the Sentinels
are reached without one.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

from redis import Redis
from redis.backoff import ExponentialBackoff
from redis.exceptions import RedisError
from redis.retry import Retry
from redis.sentinel import Sentinel

from shared.queue.config import Settings
from shared.wire.errors import BackendUnavailableError

SENTINEL_SCHEME = "redis+sentinel"
# What a client is told of any Redis failure (`unavailable`).
UNAVAILABLE = "The service's data store (Redis) is unavailable; retry in a few seconds."

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SentinelAddress:
    """Where the Sentinels are and which primary they watch, from a `redis+sentinel://` URL."""

    sentinels: list[tuple[str, int]]
    service: str
    db: int = 0
    username: str | None = None
    password: str | None = None

    @classmethod
    def parse(cls, url: str) -> SentinelAddress | None:
        """None for a URL of another scheme; ValueError for a malformed Sentinel URL."""
        parts = urlsplit(url)
        if parts.scheme != SENTINEL_SCHEME:
            return None
        _, _, hosts = parts.netloc.rpartition("@")
        sentinels = []
        for host in hosts.split(","):
            name, _, port = host.rpartition(":")
            sentinels.append((name or port, int(port) if name else 26379))
        path = [p for p in parts.path.split("/") if p]
        if not sentinels or not path or len(path) > 2:
            raise ValueError(f"expected {SENTINEL_SCHEME}://host:port[,host:port]/service[/db]")
        return cls(
            sentinels=sentinels,
            service=path[0],
            db=int(path[1]) if len(path) == 2 else 0,
            username=unquote(parts.username) if parts.username else None,
            password=unquote(parts.password) if parts.password else None,
        )


def client_for(url: str, **options: Any) -> Redis:
    """A client for REDIS_URL, whichever kind of address it is (module docstring)."""
    address = SentinelAddress.parse(url)
    if address is None:
        return Redis.from_url(url, **options)
    timeouts = {k: v for k, v in options.items() if k.startswith("socket_")}
    sentinel = Sentinel(address.sentinels, sentinel_kwargs=timeouts)
    primary: Redis = sentinel.master_for(
        address.service,
        db=address.db,
        username=address.username,
        password=address.password,
        **options,
    )
    return primary


def connect(settings: Settings) -> Redis:
    """A client whose calls fail within about `redis_timeout_s` when Redis is unreachable."""
    return client_for(
        settings.redis_url,
        socket_connect_timeout=settings.redis_timeout_s,
        socket_timeout=settings.redis_timeout_s,
        health_check_interval=30,
        max_connections=settings.redis_max_connections,
        retry=Retry(ExponentialBackoff(cap=0.2, base=0.02), retries=1),
    )


def connect_blocking(settings: Settings) -> Redis:
    """A client for blocking reads (subscribers, queue pops): silence is normal there."""
    return client_for(
        settings.redis_url,
        socket_connect_timeout=settings.redis_timeout_s,
        socket_keepalive=True,
        health_check_interval=10,
        max_connections=settings.redis_max_connections,
    )


def unavailable(err: RedisError) -> BackendUnavailableError:
    """The one translation of a Redis failure: BackendUnavailableError (503, OpenAI's body).

    What Redis said stays in the log: its text names the server's address (`Error 111
    connecting to host:port`), its memory (`OOM command not allowed`) and the ACL user and the
    commands it lacks (`NOPERM`), none of which a client, unauthenticated on /health, should
    learn. The client gets UNAVAILABLE."""
    log.warning("Redis failed: %s: %s", type(err).__name__, err)
    return BackendUnavailableError(UNAVAILABLE)


@contextmanager
def redis_errors_as_503() -> Iterator[None]:
    try:
        yield
    except RedisError as err:
        raise unavailable(err) from err
