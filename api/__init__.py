"""The mlxq HTTP API: a Flask app factory that gunicorn calls (`api:create_app()`).

The factory lives in api/app.py and is imported when it is called: a batch's own processes
(api/stores/batch_process.py) import a few of the API's modules, and importing this package
must not import every route with them (a second of each such process's start).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from flask import Flask

    from shared.queue.config import Settings


def create_app(settings: Settings | None = None) -> Flask:
    from api.app import create_app as create

    return create(settings)
