"""Gunicorn settings for the API, from the same environment as everything else.

gthread workers: each open SSE stream holds one thread that mostly waits on its subscription
queue, so threads are cheap here, and unlike gevent nothing needs monkey-patching (redis-py,
RQ and the relay thread run as written).
"""

from typing import Any

from api.auth import check_bind
from shared import tracing
from shared.config import Settings
from shared.logs import configure

_settings = Settings()
configure(_settings)  # in the arbiter: its forked workers keep the handler

bind = _settings.api_bind
worker_class = "gthread"
workers = _settings.api_workers
threads = _settings.api_threads
# A stream may stay silent while its job waits in the queue; keepalives cover the client side.
timeout = 120
graceful_timeout = 30
keepalive = 5
accesslog = "-" if _settings.api_access_log else None


def post_fork(server: Any, worker: Any) -> None:
    """Tracing (shared/tracing.py) exports from a thread: start it in each forked worker."""
    tracing.setup("mlxq-api")


def on_starting(server: Any) -> None:
    """Refuse to listen beyond loopback without API keys (the final binds, CLI flags included)."""
    line = check_bind(server.cfg.bind, keys_configured=bool(_settings.api_keys))
    if line is not None:
        server.log.info(line)
