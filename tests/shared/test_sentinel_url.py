"""REDIS_URL naming Sentinels (shared/queue/connection.py): what the URL says, that other URLs
are left to redis-py, and that its security settings (TLS, the Sentinels' own password) reach
both the Sentinel connections and the primary's, on a real Sentinel where it can be shown
without certificates."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest
from redis import Redis
from redis.connection import SSLConnection
from redis.sentinel import MasterNotFoundError, SentinelConnectionPool, SentinelManagedSSLConnection

from shared.queue.connection import SentinelAddress, client_for
from worker.ops.cluster import free_port, start_redis, start_sentinel, stop

TLS_URL = (
    "rediss+sentinel://app:pr%2Fimary@10.0.0.1:26380,10.0.0.2/mlxq/3"
    "?ssl_ca_certs=/etc/mlxq/ca.crt&ssl_certfile=/etc/mlxq/c.crt&ssl_keyfile=/etc/mlxq/c.key"
    "&ssl_check_hostname=false&sentinel_username=watcher&sentinel_password=se%26ntinel"
)
TLS = {
    "ssl_ca_certs": "/etc/mlxq/ca.crt",
    "ssl_certfile": "/etc/mlxq/c.crt",
    "ssl_keyfile": "/etc/mlxq/c.key",
    "ssl_check_hostname": False,
}


def test_a_sentinel_url_names_the_sentinels_the_service_the_db_and_the_primarys_password() -> None:
    address = SentinelAddress.parse("redis+sentinel://:p%40ss@10.0.0.1:26380,10.0.0.2/mlxq/3")
    assert address == SentinelAddress(
        sentinels=[("10.0.0.1", 26380), ("10.0.0.2", 26379)],
        service="mlxq",
        db=3,
        password="p@ss",
    )


def test_a_rediss_sentinel_url_keeps_its_tls_options_and_the_sentinels_own_credentials() -> None:
    assert SentinelAddress.parse(TLS_URL) == SentinelAddress(
        sentinels=[("10.0.0.1", 26380), ("10.0.0.2", 26379)],
        service="mlxq",
        db=3,
        username="app",
        password="pr/imary",
        sentinel_username="watcher",
        sentinel_password="se&ntinel",
        tls=TLS,
    )


def test_tls_and_the_sentinels_password_reach_the_sentinel_and_the_primary_connections() -> None:
    primary = client_for(TLS_URL, socket_timeout=1.0)  # nothing is connected yet
    pool = primary.connection_pool
    assert isinstance(pool, SentinelConnectionPool)
    assert pool.connection_class is SentinelManagedSSLConnection
    assert {k: pool.connection_kwargs[k] for k in TLS} == TLS
    assert (pool.connection_kwargs["username"], pool.connection_kwargs["password"]) == (
        "app",
        "pr/imary",
    )
    for sentinel in pool.sentinel_manager.sentinels:
        kwargs = sentinel.connection_pool.connection_kwargs
        assert sentinel.connection_pool.connection_class is SSLConnection
        assert {k: kwargs[k] for k in TLS} == TLS
        assert (kwargs["username"], kwargs["password"]) == ("watcher", "se&ntinel")
        assert kwargs["socket_timeout"] == 1.0


def test_without_tls_or_a_sentinel_password_neither_is_sent() -> None:
    primary = client_for("redis+sentinel://:pw@10.0.0.1/mlxq")
    pool = primary.connection_pool
    assert isinstance(pool, SentinelConnectionPool)
    assert not issubclass(pool.connection_class, SSLConnection)
    sentinel = pool.sentinel_manager.sentinels[0].connection_pool
    assert not issubclass(sentinel.connection_class, SSLConnection)
    assert sentinel.connection_kwargs.get("password") is None


def test_other_urls_are_not_sentinel_urls() -> None:
    assert SentinelAddress.parse("redis://127.0.0.1:6379/0") is None
    assert SentinelAddress.parse("rediss://user:pw@host:6380/0") is None


@pytest.mark.parametrize("url", ["redis+sentinel://h:1", "redis+sentinel://h:1/a/0/extra"])
def test_a_sentinel_url_without_a_service_is_refused(url: str) -> None:
    with pytest.raises(ValueError, match="service"):
        SentinelAddress.parse(url)


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("redis+sentinel://h:1/a?ssl_ca_certs=/ca.crt", "rediss"),  # TLS asked, TLS off
        ("rediss+sentinel://h:1/a?ssl_cert_reqs_typo=none", "ssl_cert_reqs_typo"),
        ("rediss+sentinel://h:1/a?ssl_check_hostname=maybe", "true or false"),
        ("redis+sentinel://h:1/a?password=x", "'password'"),
    ],
)
def test_a_security_option_the_url_cannot_honour_is_refused_not_dropped(url: str, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        SentinelAddress.parse(url)


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, str, str]]:
    """A primary and a Sentinel, each with its own password: (the Sentinel's port, the
    primary's password, the Sentinel's)."""
    primary_pw, sentinel_pw = secrets.token_hex(8), secrets.token_hex(8)
    primary_port, port = free_port(), free_port()
    primary = start_redis(
        primary_port,
        extra=["--requirepass", primary_pw],
        url=f"redis://:{primary_pw}@127.0.0.1:{primary_port}/0",
    )
    folder: Path = tmp_path_factory.mktemp("sentinel")
    sentinel = start_sentinel(
        port,
        primary_port,
        "guarded",
        folder,
        extra=[f"sentinel auth-pass guarded {primary_pw}", f"requirepass {sentinel_pw}"],
        url=f"redis://:{sentinel_pw}@127.0.0.1:{port}/0",
    )
    try:
        yield port, primary_pw, sentinel_pw
    finally:
        stop(sentinel)
        stop(primary)


def test_a_sentinel_that_requires_a_password_is_reached_with_the_urls(
    guarded: tuple[int, str, str],
) -> None:
    port, primary_pw, sentinel_pw = guarded
    url = f"redis+sentinel://:{primary_pw}@127.0.0.1:{port}/guarded?sentinel_password={sentinel_pw}"
    primary: Redis = client_for(url, socket_timeout=2.0, socket_connect_timeout=2.0)
    assert primary.set("written-through-sentinel", "yes") and primary.ping()
    without = client_for(url.split("?")[0], socket_timeout=2.0, socket_connect_timeout=2.0)
    with pytest.raises(MasterNotFoundError):  # the Sentinel refused to say where the primary is
        without.ping()
