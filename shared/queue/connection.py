"""The Redis connection both sides use, with timeouts that make an outage fail fast.

REDIS_URL is a Redis URL (`redis://`, `rediss://`, `unix://`: redis-py's `from_url`), or the
Sentinels that follow a primary:
`redis+sentinel://[[user]:password@]host:port[,host:port...]/service[/db][?option=value&...]`.
Then every connection asks a Sentinel where the service's primary is, and asks again when a
connection fails or finds a replica (redis-py's `SentinelConnectionPool`): after a failover the
API and the workers follow the new primary by themselves.

A Sentinel URL keeps the security a plain URL has, on both kinds of connection:
- `rediss+sentinel://` speaks TLS to the Sentinels and to the primary, with the options a
  `rediss://` URL takes (`ssl_ca_certs`, `ssl_ca_path`, `ssl_certfile`, `ssl_keyfile`,
  `ssl_cert_reqs`, `ssl_check_hostname`) for both;
- the user and password before the hosts are the primary's; the Sentinels' own, when they
  require one (their `requirepass` or an ACL user), are `sentinel_username` and
  `sentinel_password`. Without them the Sentinels are reached without a password.
An option the URL does not know, or a TLS option on a `redis+sentinel://` URL, is a ValueError:
a security setting is never dropped without a word.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

from redis import Redis
from redis.backoff import ExponentialBackoff
from redis.exceptions import RedisError
from redis.retry import Retry
from redis.sentinel import Sentinel

from shared.queue.config import Settings
from shared.wire.errors import BackendUnavailableError

SENTINEL_SCHEME = "redis+sentinel"
TLS_SENTINEL_SCHEME = "rediss+sentinel"
# The TLS options of a `rediss+sentinel://` URL, as redis-py names them; the boolean one apart.
TLS_OPTIONS = frozenset(
    {"ssl_ca_certs", "ssl_ca_path", "ssl_certfile", "ssl_keyfile", "ssl_cert_reqs"}
)
TLS_FLAGS = frozenset({"ssl_check_hostname"})
SENTINEL_AUTH = frozenset({"sentinel_username", "sentinel_password"})
_TRUE, _FALSE = frozenset({"1", "true", "yes", "on"}), frozenset({"0", "false", "no", "off"})
# What a client is told of any Redis failure (`unavailable`).
UNAVAILABLE = "The service's data store (Redis) is unavailable; retry in a few seconds."

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SentinelAddress:
    """Where the Sentinels are, which primary they watch and how to reach both, from a
    `redis+sentinel://` or `rediss+sentinel://` URL (module docstring)."""

    sentinels: list[tuple[str, int]]
    service: str
    db: int = 0
    username: str | None = None  # the primary's
    password: str | None = None
    sentinel_username: str | None = None  # the Sentinels' own
    sentinel_password: str | None = None
    tls: dict[str, str | bool] | None = None  # None: no TLS; else redis-py's ssl_* options

    @classmethod
    def parse(cls, url: str) -> SentinelAddress | None:
        """None for a URL of another scheme; ValueError for a malformed Sentinel URL."""
        parts = urlsplit(url)
        if parts.scheme not in (SENTINEL_SCHEME, TLS_SENTINEL_SCHEME):
            return None
        _, _, hosts = parts.netloc.rpartition("@")
        sentinels = []
        for host in hosts.split(","):
            name, _, port = host.rpartition(":")
            sentinels.append((name or port, int(port) if name else 26379))
        path = [p for p in parts.path.split("/") if p]
        if not sentinels or not path or len(path) > 2:
            raise ValueError(
                f"expected {SENTINEL_SCHEME}://host:port[,host:port]/service[/db][?options]"
            )
        query = dict(parse_qsl(parts.query, keep_blank_values=True))
        auth = {k: v for k, v in query.items() if k in SENTINEL_AUTH and v}
        return cls(
            sentinels=sentinels,
            service=path[0],
            db=int(path[1]) if len(path) == 2 else 0,
            username=unquote(parts.username) if parts.username else None,
            password=unquote(parts.password) if parts.password else None,
            sentinel_username=auth.get("sentinel_username"),
            sentinel_password=auth.get("sentinel_password"),
            tls=_tls(parts.scheme == TLS_SENTINEL_SCHEME, query),
        )

    def tls_options(self) -> dict[str, Any]:
        """What redis-py needs to speak TLS, to a Sentinel or to the primary ({} without TLS)."""
        return {} if self.tls is None else {"ssl": True, **self.tls}

    def sentinel_options(self) -> dict[str, Any]:
        """The Sentinels' credentials and TLS, for their connections only."""
        auth = {"username": self.sentinel_username, "password": self.sentinel_password}
        return {**{k: v for k, v in auth.items() if v is not None}, **self.tls_options()}


def _tls(on: bool, query: dict[str, str]) -> dict[str, str | bool] | None:
    """A Sentinel URL's TLS options; ValueError for an unknown option or TLS options without TLS."""
    unknown = sorted(set(query) - TLS_OPTIONS - TLS_FLAGS - SENTINEL_AUTH)
    if unknown:
        raise ValueError(f"a {SENTINEL_SCHEME} URL does not take the option {unknown[0]!r}")
    tls: dict[str, str | bool] = {k: v for k, v in query.items() if k in TLS_OPTIONS}
    for flag in TLS_FLAGS & set(query):
        value = query[flag].lower()
        if value not in _TRUE | _FALSE:
            raise ValueError(f"{flag} must be true or false, not {query[flag]!r}")
        tls[flag] = value in _TRUE
    if not on:
        if tls:
            raise ValueError(f"TLS options need a {TLS_SENTINEL_SCHEME}:// URL: {sorted(tls)}")
        return None
    return tls


def client_for(url: str, **options: Any) -> Redis:
    """A client for REDIS_URL, whichever kind of address it is (module docstring)."""
    address = SentinelAddress.parse(url)
    if address is None:
        return Redis.from_url(url, **options)
    timeouts = {k: v for k, v in options.items() if k.startswith("socket_")}
    sentinel = Sentinel(
        address.sentinels, sentinel_kwargs={**timeouts, **address.sentinel_options()}
    )
    primary: Redis = sentinel.master_for(
        address.service,
        db=address.db,
        username=address.username,
        password=address.password,
        **address.tls_options(),
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


def connect_blocking(settings: Settings, read_timeout_s: float | None = None) -> Redis:
    """A client for blocking reads (subscribers, queue pops): silence is normal there.
    `read_timeout_s`: for pops of bounded waits, how long a read may go unanswered."""
    return client_for(
        settings.redis_url,
        socket_connect_timeout=settings.redis_timeout_s,
        socket_timeout=read_timeout_s,
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
