"""GET /v1/fleet: the fleet snapshot (shared/observe/fleet.py) as JSON, for the page's live view;
GET /v1/fleet/history: the fleet's samples of the last quarter of an hour
(shared/observe/history.py), for the page's charts.

Same API-key rule as /metrics and /v1 (api/http/auth.py). `recent` (0..50, default 20) is how many
of the last finished jobs come with the snapshot; `since` (unix s) keeps the history to the
samples taken after it.
"""

from __future__ import annotations

from flask import Blueprint, Response

from api.queue.broker import broker
from api.stores.listing import parse_query
from shared.observe.fleet import FleetQuery, read_snapshot
from shared.observe.history import HistoryQuery, read_history
from shared.queue.connection import redis_errors_as_503

bp = Blueprint("fleet", __name__)


@bp.get("/v1/fleet")
def fleet() -> Response:
    query = parse_query(FleetQuery)
    b = broker()
    with redis_errors_as_503():
        snapshot = read_snapshot(b.redis, b.keys, b.settings.heartbeat_s, recent=query.recent)
    return Response(snapshot.model_dump_json(), mimetype="application/json")


@bp.get("/v1/fleet/history")
def history() -> Response:
    query = parse_query(HistoryQuery)
    b = broker()
    with redis_errors_as_503():
        samples = read_history(b.redis, b.keys, b.settings.heartbeat_s, since=query.since)
    return Response(samples.model_dump_json(), mimetype="application/json")
