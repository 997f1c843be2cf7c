"""Acknowledged means replicated: with MLXQ_REDIS_WAIT_REPLICAS set, a POST that created
something (a file, a batch, a response, a cancel) is answered only once that many replicas hold
its writes, or MLXQ_REDIS_WAIT_MS has passed.

Redis replicates asynchronously, so a primary that dies may take its last writes with it, and a
Sentinel failover then promotes a replica without them. `WAIT n ms` blocks until n replicas
acknowledge the writes made on its own connection; the writes of this request went out on
other connections of the pool, so a marker is written on the waiting connection first: the
replication stream is ordered, and a replica that holds the marker holds everything the primary
took before it. A WAIT that times out is logged, not answered as an error: the object exists on
the primary, and a client's retry would create it again.

Streamed answers (a stored response streamed as it runs) and chat and text completions, which
leave no record behind, are not waited for.
"""

from __future__ import annotations

import logging

from flask import Flask, Response, request
from redis.exceptions import RedisError

from api.backend import Backend

log = logging.getLogger(__name__)
RECORDLESS = frozenset({"chat.create_chat_completion", "completions.create_completion"})


def wait_for_replicas(b: Backend) -> int:
    """Block until `redis_wait_replicas` replicas hold every write so far; how many do."""
    pipe = b.redis.pipeline(transaction=False)
    pipe.set(b.keys.written(b.api_id), 1, ex=60)
    pipe.wait(b.settings.redis_wait_replicas, b.settings.redis_wait_ms)
    acked: int = pipe.execute()[-1]
    return acked


def init_app(app: Flask, b: Backend) -> None:
    if b.settings.redis_wait_replicas == 0:
        return

    @app.after_request
    def _replicated(response: Response) -> Response:
        created = request.method == "POST" and 200 <= response.status_code < 300
        if not created or response.is_streamed or request.endpoint in RECORDLESS:
            return response
        try:
            acked = wait_for_replicas(b)
        except RedisError as err:
            log.warning("could not wait for replicas: %s", err)
            return response
        if acked < b.settings.redis_wait_replicas:
            log.warning(
                "%d of %d replicas acknowledged within %d ms",
                acked,
                b.settings.redis_wait_replicas,
                b.settings.redis_wait_ms,
            )
        return response
