"""/v1/responses (text): create (sync, streamed or background), retrieve, resume, cancel, delete.

Without `background` a response runs on the interactive queue like a chat completion. With it,
the job goes on the model's bulk queue and the answer is the response as `queued`; the job runs
whatever the client does next. A stored response (store=true, the default) can be retrieved,
and its events streamed from any sequence number, from any API process, for MLXQ_RESPONSE_TTL_S.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

from flask import Blueprint, Response, request

from api.http.auth import owner_id
from api.http.json_response import json_response
from api.http.sse import KEEPALIVE, event_frame, sse_response
from api.http.validation import parse_body
from api.limits.quotas import quotas
from api.queue.admission import admit_background
from api.queue.broker import broker
from api.queue.generation import KeepaliveEvent, Relayed, RunningJob, collect, start
from api.routes.generation_job import requested_job
from api.stores.idempotency import idempotent
from api.stores.listing import parse_query
from api.stores.responses import ResponseStore
from shared.wire.digits import parse_integer
from shared.wire.errors import InvalidRequestError, MLXQError, NotFoundError
from shared.wire.events import ErrorEvent, RequeuedEvent
from shared.wire.ids import new_id
from shared.wire.responses.response_events import ResponseStream, StreamEvent
from shared.wire.responses.response_state import Progress, lost_error, render
from shared.wire.responses.responses import (
    ResponseObject,
    ResponsesRequest,
    RetrieveQuery,
    StoredResponse,
)

bp = Blueprint("responses", __name__)

# A resumed stream reads the job's event log this often; a silent one sends a keepalive.
POLL_S = 0.1
KEEPALIVE_S = 5.0
# How often a resumed stream with nothing new asks the queue whether the job is still alive.
ALIVE_CHECK_S = 1.0


def store() -> ResponseStore:
    return ResponseStore(broker())


@bp.post("/v1/responses")
@idempotent
def create_response() -> Response:
    req = parse_body(ResponsesRequest)
    responses = store()
    replay_ttl_s = responses.ttl_s if req.store else None
    job = requested_job(new_id("resp_"), req, req.images(), replay_ttl_s)
    stored = StoredResponse(
        id=job.job_id,
        created_at=int(time.time()),
        background=req.background,
        request=req,
    )
    running: RunningJob | None = None
    # Its places in the key's quotas first: a key without room gets its 429 before anything runs.
    record = responses.record(stored)
    with quotas().holding(owner_id(), *responses.usages(stored, len(record.encode()))):
        if req.background:
            b = broker()
            queued = admit_background(b, job)
            responses.create(owner_id(), stored.id, record)
            b.submit_bulk([queued])
        else:
            running = start(broker(), job)
            if req.store:
                responses.create(owner_id(), stored.id, record)
    if running is None:  # a background response, queued
        if req.stream:
            return sse_response(replay_stream(responses, owner_id(), stored, after=-1))
        return json_response(responses.derive(stored, False))
    if req.stream:
        return sse_response(live_stream(running, stored, responses))
    result = collect(running)
    progress = Progress.finished(result.got.choice(0), result.done)
    return json_response(render(stored, progress, progress.status()))


@bp.get("/v1/responses/<response_id>")
def retrieve_response(response_id: str) -> Response:
    query = parse_query(RetrieveQuery)
    responses = store()
    if not query.stream:
        return json_response(responses.view(owner_id(), response_id))
    stored, _ = responses.load(owner_id(), response_id)
    after = query.starting_after
    if after is None:
        last_event_id = parse_integer(request.headers.get("Last-Event-ID", ""))
        after = -1 if last_event_id is None else last_event_id
    return sse_response(replay_stream(responses, owner_id(), stored, after))


@bp.post("/v1/responses/<response_id>/cancel")
def cancel_response(response_id: str) -> Response:
    responses = store()
    stored, _ = responses.load(owner_id(), response_id)
    if not stored.background:
        raise InvalidRequestError(
            "Only responses created with background=true can be cancelled.", param="response_id"
        )
    return json_response(responses.cancel_unless_final(owner_id(), response_id))


@bp.delete("/v1/responses/<response_id>")
def delete_response(response_id: str) -> Response:
    return json_response(store().delete(owner_id(), response_id))


def _frames(events: list[StreamEvent], after: int) -> Iterator[bytes]:
    for event in events:
        if event.sequence_number > after:
            yield event_frame(event.type, event, event.sequence_number)


def _live_frames(stream: ResponseStream, batch: list[Relayed]) -> Iterator[bytes]:
    """The frames of a group of the job's events; a keep-alive comment while it is silent."""
    for event in batch:
        if isinstance(event, KeepaliveEvent):
            yield KEEPALIVE
        else:
            yield from _frames(stream.feed(event), -1)


def live_stream(
    running: RunningJob, stored: StoredResponse, responses: ResponseStore
) -> Iterator[bytes]:
    """A response streamed as its job runs (relayed events); a client that leaves cancels it."""
    stream = ResponseStream(stored)
    try:
        yield from _frames(stream.opening(), -1)
        yield from _frames(stream.feed(running.started), -1)
        for batch in running.updates():
            yield b"".join(_live_frames(stream, batch))
    except MLXQError as err:
        yield from _frames(stream.feed(ErrorEvent.from_error(err)), -1)
    finally:
        running.close()
        if not stream.progress.final and stored.request.store:
            responses.cancel(stored)


def replay_stream(
    responses: ResponseStore, owner: str, stored: StoredResponse, after: int
) -> Iterator[bytes]:
    """A stored response's events after sequence number `after`, from its event log: replayed
    if it ended, followed live while it runs. The numbering is the original stream's."""
    stream = ResponseStream(stored)
    yield from _frames(stream.opening(), after)
    cursor, attempt = 0, 1
    last_sent = last_check = time.monotonic()
    while True:
        # A requeued job's log starts over (worker/runtime/liveness/reaper.py): then read it from
        # its start.
        events, begin = responses.events_since(stored.id, cursor, attempt)
        cursor = begin + len(events)
        for event in events:
            if isinstance(event, RequeuedEvent):
                attempt = event.attempt
            yield from _frames(stream.feed(event), after)
        if stream.progress.final:
            return
        now = time.monotonic()
        if events:
            last_sent = now
        elif now - last_check >= ALIVE_CHECK_S:
            last_check = now
            ended = _ended_without_final(responses, owner, stored, cursor)
            if ended is not None:
                if ended.status == "failed":
                    lost = ErrorEvent(status=500, error=lost_error())
                    yield from _frames(stream.feed(lost), after)
                return
        if now - last_sent >= KEEPALIVE_S:
            last_sent = now
            yield KEEPALIVE
        time.sleep(POLL_S)


def _ended_without_final(
    responses: ResponseStore, owner: str, stored: StoredResponse, cursor: int
) -> ResponseObject | None:
    """The response, if its job is over (cancelled, finished, failed, gone, deleted) and its
    log has nothing new; else None."""
    try:
        current = responses.view(owner, stored.id)
    except NotFoundError:
        return render(stored, Progress(), "cancelled")
    if current.status in ("queued", "in_progress") or responses.events(stored.id, cursor):
        return None
    return current
