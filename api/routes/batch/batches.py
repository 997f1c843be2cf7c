"""/v1/batches: create from an uploaded JSONL file, retrieve, list, cancel (OpenAI's Batch API)."""

from __future__ import annotations

from flask import Blueprint, Response

from api.http.auth import owner_id
from api.http.json_response import json_response
from api.http.validation import parse_body
from api.limits.shares import takes_a_request
from api.queue.broker import broker
from api.routes.batch.files import store as file_store
from api.stores.batches import BatchStore
from api.stores.idempotency import idempotent
from api.stores.listing import parse_query
from shared.wire.batch.batches import BatchCreateRequest, BatchListQuery

bp = Blueprint("batches", __name__)


def store() -> BatchStore:
    return BatchStore(broker(), file_store())


@bp.post("/v1/batches")
@takes_a_request
@idempotent
def create_batch() -> Response:
    return json_response(store().create(owner_id(), parse_body(BatchCreateRequest)))


@bp.get("/v1/batches")
def list_batches() -> Response:
    return json_response(store().listing(owner_id(), parse_query(BatchListQuery)))


@bp.get("/v1/batches/<batch_id>")
def retrieve_batch(batch_id: str) -> Response:
    return json_response(store().view(owner_id(), batch_id))


@bp.post("/v1/batches/<batch_id>/cancel")
def cancel_batch(batch_id: str) -> Response:
    return json_response(store().cancel(owner_id(), batch_id))
