"""MLXQ_REDIS_WAIT_REPLICAS (api/stores/replicas.py): a creating POST waits for replicas
(Redis WAIT) before its answer; without replicas it waits MLXQ_REDIS_WAIT_MS and still answers."""

from __future__ import annotations

import time

from flask.testing import FlaskClient
from redis import Redis

from api import create_app
from shared.queue.config import Settings
from tests.support import post_file


def _waits(redis: Redis) -> int:
    stats = redis.info("commandstats").get("cmdstat_wait", {"calls": 0})
    return int(stats["calls"])


def test_a_creating_post_waits_for_replicas_and_a_read_does_not(
    app_settings: Settings, redis: Redis
) -> None:
    waiting = app_settings.model_copy(update={"redis_wait_replicas": 1, "redis_wait_ms": 300})
    http = create_app(waiting).test_client()
    before = _waits(redis)
    started = time.monotonic()
    assert post_file(http, b"{}\n").status_code == 200
    assert time.monotonic() - started >= 0.3  # no replica here: WAIT runs out its time
    assert http.get("/v1/files").status_code == 200
    assert _waits(redis) == before + 1


def test_without_the_setting_nothing_waits(http: FlaskClient, redis: Redis) -> None:
    before = _waits(redis)
    assert post_file(http, b"{}\n").status_code == 200
    assert _waits(redis) == before
