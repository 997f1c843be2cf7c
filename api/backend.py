"""The API process's context: its settings, its Redis keys and connection, and its id.

One Backend per API process, attached with `init_app` (Flask's extension pattern, as its
tutorial keeps `get_db`) and reached with `backend()`. Everything of the API that reads or writes
Redis is built over it: the queue's writes (api/queue/broker.py), the roster of what is served
(api/queue/roster.py), the stores, the limits and auth. Any Redis failure of a `call` surfaces as
BackendUnavailableError (503).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from flask import Flask, current_app

from shared.queue.config import Settings
from shared.queue.connection import connect, redis_errors_as_503
from shared.queue.keys import Keys
from shared.wire.ids import new_id

T = TypeVar("T")


class Backend:
    def __init__(self, settings: Settings):
        self.settings = settings
        self.keys = Keys(settings.namespace)
        self.redis = connect(settings)
        self.api_id = new_id("api-")  # names this process's reply channel

    def init_app(self, app: Flask) -> None:
        app.extensions["mlxq.backend"] = self

    def call(self, fn: Callable[[], T]) -> T:
        """`fn()`, a Redis failure in it a 503."""
        with redis_errors_as_503():
            return fn()

    def ping(self) -> bool:
        return bool(self.call(self.redis.ping))


def backend() -> Backend:
    found: Backend = current_app.extensions["mlxq.backend"]
    return found
