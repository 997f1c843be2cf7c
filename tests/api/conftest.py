"""Fixtures of the API's plumbing tests: the keys of the test's own namespace, a stand-in worker
(tests/support.py) for it, an app whose requests give up soon, for tests that read the queue
meanwhile, and one whose files are kept in small chunks."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from flask import Flask
from flask.testing import FlaskClient
from redis import Redis
from redis.client import PubSub

from api import create_app
from shared.queue.config import Settings
from shared.queue.keys import Keys
from tests.support import SMALL_CHUNK, stand_in_worker


@pytest.fixture
def keys(app_settings: Settings) -> Keys:
    """The keys of the test's own namespace, empty before and after it (`app_settings`)."""
    return Keys(app_settings.namespace)


@pytest.fixture
def stand_in(redis: Redis, keys: Keys) -> Iterator[tuple[Keys, PubSub]]:
    """The test namespace's keys, with a live worker that takes nothing; closing the presence
    connection is the worker dying."""
    with stand_in_worker(redis, keys) as presence:
        yield keys, presence


@pytest.fixture
def chunked(app_settings: Settings) -> Iterator[FlaskClient]:
    """A client of an app whose files are kept in chunks of SMALL_CHUNK bytes, so that a small
    file is kept in several; its Redis connections are closed after the test (a streamed
    response's ties to the app would leave them to the collector, which warns)."""
    app = create_app(app_settings.model_copy(update={"file_chunk_bytes": SMALL_CHUNK}))
    yield app.test_client()
    app.extensions["mlxq.backend"].redis.close()


@pytest.fixture
def impatient_http(app_settings: Settings) -> FlaskClient:
    """A client of an app whose requests give up after 3 s in the queue (503), so that a test
    reads the queue while they wait and its threads end soon after."""
    app: Flask = create_app(app_settings.model_copy(update={"queue_timeout_s": 3.0}))
    return app.test_client()
