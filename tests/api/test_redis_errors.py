"""What Redis says never reaches a client (shared/queue/connection.py `unavailable`): not its
address, not `OOM`, not `NOPERM` and the ACL user, on /health (which needs no key) nor on any
other route. Each failure is a real one: an address where no redis-server listens, an ACL user
of the session's Redis without permissions, and a redis-server of the test's own that is out
of memory. The client gets one generic 503; the log keeps what Redis said."""

from __future__ import annotations

import io
import logging
import secrets
from collections.abc import Iterator

import pytest
from flask.testing import FlaskClient
from redis import Redis
from werkzeug.test import TestResponse

from api import create_app
from shared.queue.config import Settings
from shared.queue.connection import UNAVAILABLE
from tests.support import MESSAGES, MODEL, assert_openai_error
from worker.ops.cluster import free_port, start_redis, stop


def client(settings: Settings, redis_url: str) -> FlaskClient:
    return create_app(settings.model_copy(update={"redis_url": redis_url})).test_client()


def assert_generic_503(reply: TestResponse, *secrets_: str) -> None:
    assert_openai_error(reply, 503)
    assert reply.get_json()["error"]["code"] == "backend_unavailable"
    assert reply.get_json()["error"]["message"] == UNAVAILABLE
    text = reply.get_data(as_text=True)
    for secret in secrets_:
        assert secret not in text


def test_an_unreachable_redis_is_a_503_naming_no_address_and_the_log_keeps_it(
    app_settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    port = str(free_port())  # nothing listens there
    http = client(
        app_settings.model_copy(update={"redis_timeout_s": 0.3}), f"redis://127.0.0.1:{port}/0"
    )
    with caplog.at_level(logging.WARNING, logger="shared.queue.connection"):
        assert_generic_503(http.get("/health"), port, "127.0.0.1", "Error", "connect")
        chat = {"model": MODEL, "messages": MESSAGES}
        assert_generic_503(http.post("/v1/chat/completions", json=chat), port, "127.0.0.1")
    assert port in caplog.text  # the operator still learns where it failed


@pytest.fixture
def powerless_user(redis: Redis) -> Iterator[tuple[str, str]]:
    """An ACL user of the session's Redis that may run no command at all."""
    user, password = f"powerless-{secrets.token_hex(4)}", secrets.token_hex(8)
    redis.acl_setuser(
        user, enabled=True, passwords=[f"+{password}"], keys=["*"], commands=["-@all"]
    )
    try:
        yield user, password
    finally:
        redis.acl_deluser(user)


def test_a_redis_user_without_permissions_is_a_503_naming_neither_noperm_nor_the_user(
    app_settings: Settings, redis: Redis, powerless_user: tuple[str, str]
) -> None:
    user, password = powerless_user
    port = redis.connection_pool.connection_kwargs["port"]
    http = client(app_settings, f"redis://{user}:{password}@127.0.0.1:{port}/0")
    assert_generic_503(http.get("/health"), "NOPERM", "permission", user, password)
    assert_generic_503(http.get("/v1/models"), "NOPERM", user)
    assert_generic_503(http.get("/v1/batches"), "NOPERM", user)


def test_a_redis_out_of_memory_is_a_503_naming_no_oom(app_settings: Settings) -> None:
    port = free_port()
    # Any write is refused once used memory passes 1 byte, as a full Redis under noeviction.
    server = start_redis(port, extra=["--maxmemory", "1", "--maxmemory-policy", "noeviction"])
    try:
        http = client(app_settings, f"redis://127.0.0.1:{port}/0")
        upload = {"purpose": "batch", "file": (io.BytesIO(b"{}\n"), "in.jsonl")}
        assert_generic_503(http.post("/v1/files", data=upload), "OOM", "maxmemory", str(port))
    finally:
        stop(server)
