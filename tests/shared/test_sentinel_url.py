"""REDIS_URL naming Sentinels (shared/queue/connection.py): what the URL says, and that other
URLs are left to redis-py."""

from __future__ import annotations

import pytest

from shared.queue.connection import SentinelAddress


def test_a_sentinel_url_names_the_sentinels_the_service_the_db_and_the_primarys_password() -> None:
    address = SentinelAddress.parse("redis+sentinel://:p%40ss@10.0.0.1:26380,10.0.0.2/mlxq/3")
    assert address == SentinelAddress(
        sentinels=[("10.0.0.1", 26380), ("10.0.0.2", 26379)],
        service="mlxq",
        db=3,
        password="p@ss",
    )


def test_other_urls_are_not_sentinel_urls() -> None:
    assert SentinelAddress.parse("redis://127.0.0.1:6379/0") is None
    assert SentinelAddress.parse("rediss://user:pw@host:6380/0") is None


@pytest.mark.parametrize("url", ["redis+sentinel://h:1", "redis+sentinel://h:1/a/0/extra"])
def test_a_sentinel_url_without_a_service_is_refused(url: str) -> None:
    with pytest.raises(ValueError, match="service"):
        SentinelAddress.parse(url)
