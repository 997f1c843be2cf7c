"""/v1/messages/batches: Anthropic's Message Batches API (create, retrieve, list, cancel, delete,
results as JSONL, streamed a chunk of the batch's files at a time), on the Batch API's store and
queues (shared/wire/anthropic/message_batches.py says how one maps onto the other). Errors take
Anthropic's shape, as on every /v1/messages route.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator

from flask import Blueprint, Response, stream_with_context, url_for

from api.http.auth import owner_id
from api.http.json_response import json_response
from api.http.validation import json_body
from api.limits.shares import takes_a_request
from api.queue.broker import broker
from api.routes.anthropic.messages import check_version
from api.routes.batch.files import store as file_store
from api.stores.batches import FINAL, BatchStore
from api.stores.idempotency import idempotent
from api.stores.listing import parse_query
from shared.wire.anthropic.message_batches import (
    DeletedMessageBatch,
    IndividualResponse,
    MessageBatch,
    MessageBatchList,
    MessageBatchListQuery,
    failed_result,
    message_batch,
    result_of,
)
from shared.wire.anthropic.messages import MESSAGES_PATH
from shared.wire.batch.batches import (
    COMPLETION_WINDOW_S,
    Batch,
    BatchListQuery,
    BatchOutputLine,
    StoredBatch,
)
from shared.wire.errors import NotFoundError
from shared.wire.ids import new_id

bp = Blueprint("message_batches", __name__)
bp.before_request(check_version)


def store() -> BatchStore:
    return BatchStore(broker(), file_store())


def _batch(batches: BatchStore, batch_id: str) -> Batch:
    """The caller's message batch (a batch of OpenAI's Batch API is not one: 404)."""
    batch = batches.view(owner_id(), batch_id)
    if batch.endpoint != MESSAGES_PATH:
        raise NotFoundError(f"No message batch found with id '{batch_id}'.", param=None)
    return batch


def _results(batch: Batch) -> Iterator[IndividualResponse] | None:
    """Every request's result in input order of the files, once the batch has ended: read a
    chunk of its files at a time as the iterator is (the files are found, or a 404, now)."""
    if batch.status not in FINAL:
        return None
    if batch.status == "failed" and batch.errors is not None and batch.errors.data:
        error = batch.errors.data[0]
        return (failed_result(c, error) for c in store().line_ids(batch.id))
    files = file_store()
    found = [files.lines(owner_id(), f) for f in (batch.output_file_id, batch.error_file_id) if f]
    lines = itertools.chain.from_iterable(found)
    return (result_of(BatchOutputLine.model_validate_json(line)) for line in lines)


def _view(batch: Batch) -> MessageBatch:
    url = url_for("message_batches.batch_results", batch_id=batch.id, _external=True)
    return message_batch(batch, _results(batch), url)


@bp.post("/v1/messages/batches")
@takes_a_request
@idempotent
def create_message_batch() -> Response:
    requests = json_body()  # parsed by the batch's intake process, not on the hub
    now = int(time.time())
    stored = StoredBatch(
        id=new_id("msgbatch_"),
        created_at=now,
        expires_at=now + COMPLETION_WINDOW_S,
        endpoint=MESSAGES_PATH,
        input_file_id="",
    )
    return json_response(_view(store().start(owner_id(), stored, requests)))


@bp.get("/v1/messages/batches")
def list_message_batches() -> Response:
    query = parse_query(MessageBatchListQuery)
    listed = store().listing(
        owner_id(), BatchListQuery(after=query.after_id, limit=query.limit), messages=True
    )
    data = [_view(batch) for batch in listed.data]
    return json_response(
        MessageBatchList(
            data=data,
            has_more=listed.has_more,
            first_id=listed.first_id,
            last_id=listed.last_id,
        )
    )


@bp.get("/v1/messages/batches/<batch_id>")
def retrieve_message_batch(batch_id: str) -> Response:
    return json_response(_view(_batch(store(), batch_id)))


@bp.post("/v1/messages/batches/<batch_id>/cancel")
def cancel_message_batch(batch_id: str) -> Response:
    batches = store()
    _batch(batches, batch_id)
    return json_response(_view(batches.cancel(owner_id(), batch_id)))


@bp.delete("/v1/messages/batches/<batch_id>")
def delete_message_batch(batch_id: str) -> Response:
    batches = store()
    _batch(batches, batch_id)
    batches.delete(owner_id(), batch_id)
    return json_response(DeletedMessageBatch(id=batch_id))


@bp.get("/v1/messages/batches/<batch_id>/results")
def batch_results(batch_id: str) -> Response:
    batch = _batch(store(), batch_id)
    results = _results(batch)
    if results is None:
        raise NotFoundError(
            f"Message batch {batch_id} has not ended yet: its results come when it has.",
            param=None,
        )
    lines = (r.model_dump_json() + "\n" for r in results)
    return Response(stream_with_context(lines), mimetype="application/x-jsonl")
