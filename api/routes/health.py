"""GET /health: 200 when Redis answers and lists the live models, else 503."""

from __future__ import annotations

from flask import Blueprint, Response

from api.backend import backend
from api.http.json_response import json_response
from api.queue.roster import roster
from shared.wire.fleet.catalog import Health

bp = Blueprint("health", __name__)


@bp.get("/health")
def health() -> Response:
    backend().ping()  # raises BackendUnavailableError -> 503
    body = Health(models=[name for name, _ in roster().live_models()])
    return json_response(body)
