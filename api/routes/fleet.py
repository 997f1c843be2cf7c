"""GET /v1/fleet: the fleet snapshot (shared/observe/fleet.py) as JSON, for the page's live view;
GET /v1/fleet/history: the fleet's samples of the last quarter of an hour
(shared/observe/history.py), for the page's charts.

Same API-key rule as /metrics and /v1 (api/http/auth.py). An operator (an `MLXQ_ADMIN_KEYS` key,
or anyone when the API has no keys) sees the whole fleet; any other caller sees the models and
their queues and its own recent jobs only (`FleetSnapshot.of_owner`). `recent` (0..50, default
20) is how many of the last finished jobs come with the snapshot (a caller's own among the
fleet's last 50); `since` (unix s) keeps the history to the samples taken after it.
"""

from __future__ import annotations

from flask import Blueprint, Response

from api.backend import backend
from api.http.auth import is_operator, owner_id
from api.http.json_response import json_response
from api.stores.listing import parse_query
from shared.observe.fleet import FleetQuery, read_snapshot
from shared.observe.history import HistoryQuery, read_history
from shared.observe.metrics import RECENT_JOBS
from shared.queue.connection import redis_errors_as_503

bp = Blueprint("fleet", __name__)


@bp.get("/v1/fleet")
def fleet() -> Response:
    query = parse_query(FleetQuery)
    b = backend()
    operator = is_operator()
    recent = query.recent if operator else RECENT_JOBS  # a caller's own, among the fleet's
    with redis_errors_as_503():
        snapshot = read_snapshot(b.redis, b.keys, b.settings.heartbeat_s, recent=recent)
    if not operator:
        snapshot = snapshot.of_owner(owner_id(), query.recent)
    return json_response(snapshot)


@bp.get("/v1/fleet/history")
def history() -> Response:
    query = parse_query(HistoryQuery)
    b = backend()
    with redis_errors_as_503():
        samples = read_history(b.redis, b.keys, b.settings.heartbeat_s, since=query.since)
    return json_response(samples)
