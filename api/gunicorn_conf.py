"""Gunicorn settings for the API, from the same environment as everything else.

gevent workers: an open SSE stream is a greenlet that waits on its job's subscription, and the
relay's reader hands it each event with a greenlet switch. With a thread per stream (gthread),
500 streams were 500 OS threads contending for the GIL on every token, and the relay topped out
near 7,000 events/s with added latency in the hundreds of milliseconds (commit ea117f9).

gevent must patch the standard library before anything imports it, so the patch is the first
statement here, and gunicorn is given this file by path (`--config api/gunicorn_conf.py`):
loading it as a module (`python:api.gunicorn_conf`) would import the `api` package, and with it
redis-py and the relay, before the patch.
"""

from gevent import monkey

monkey.patch_all()

from typing import Any  # noqa: E402 (after the patch, on purpose)

from api.http.exposure import check_bind  # noqa: E402
from shared.observe import tracing  # noqa: E402
from shared.observe.logs import configure, formatter  # noqa: E402
from shared.queue.config import Settings  # noqa: E402

_settings = Settings()
configure(_settings)  # in the arbiter: its forked workers keep the handler

bind = _settings.api_bind
worker_class = "gevent"
workers = _settings.api_workers
worker_connections = _settings.api_connections
# A stream may stay silent while its job waits in the queue; keepalives cover the client side.
timeout = 120
graceful_timeout = 30
keepalive = 5
accesslog = "-" if _settings.api_access_log else None


def _in_our_format(log: Any) -> None:
    """gunicorn's own error log in mlxq's format (shared/observe/logs.py): a request that
    raised past Flask (in a stream's body) is written as its frames and type, never as its
    exception's text, which may quote the request."""
    for handler in log.error_log.handlers:
        handler.setFormatter(formatter(_settings))


def post_fork(server: Any, worker: Any) -> None:
    """Tracing (shared/observe/tracing.py) exports from a thread: start it in each forked worker."""
    _in_our_format(worker.log)
    tracing.setup("mlxq-api")


def on_starting(server: Any) -> None:
    """Refuse to listen beyond loopback without API keys (the final binds, CLI flags included)."""
    _in_our_format(server.log)
    line = check_bind(server.cfg.bind, keys_configured=_settings.keyed)
    if line is not None:
        server.log.info(line)
