"""POST /v1/messages and /v1/messages/count_tokens: Anthropic's Messages API, as a translation
at the edge onto the chat job (shared/wire/anthropic/messages.py in,
shared/wire/anthropic/message_answers.py out).

A message runs exactly as a chat completion does: the same job, queue lane, fair share (its
`metadata.user_id` is the chat request's `user`), metrics, request log line and trace. Errors on
these routes take Anthropic's shape (api/http/errors.py).
"""

from __future__ import annotations

import functools
import re
import time
from collections.abc import Callable, Iterator

from flask import Blueprint, Response, request

from api.http.json_response import json_response
from api.http.sse import named_frame, sse_response, token_framer
from api.http.validation import checked_images, parse_body
from api.limits.shares import takes_a_request
from api.queue.broker import broker
from api.queue.generation import KeepaliveEvent, Relayed, RunningJob, collect, start
from api.routes.generation_job import requested_job
from api.stores.idempotency import idempotent
from shared.queue.jobs import job_for
from shared.wire.anthropic.message_answers import (
    ContentBlockDelta,
    Message,
    MessageStream,
    Ping,
    StreamEvent,
    TextDelta,
    anthropic_error,
    message,
)
from shared.wire.anthropic.messages import (
    ANTHROPIC_VERSION_PATTERN,
    MessagesInput,
    MessagesRequest,
    TokenCount,
)
from shared.wire.chat.answers import chat_completion
from shared.wire.chat.completions import ChatCompletionRequest
from shared.wire.errors import InvalidRequestError, MLXQError
from shared.wire.events import DoneEvent, TokenEvent
from shared.wire.ids import new_id

bp = Blueprint("messages", __name__)


@bp.before_request
def check_version() -> None:
    """A 400 for an `anthropic-version` header that is not a version date."""
    version = request.headers.get("anthropic-version")
    if version is not None and not re.match(ANTHROPIC_VERSION_PATTERN, version):
        raise InvalidRequestError(
            f"anthropic-version '{version[:40]}' is not a version date such as 2023-06-01.",
            param="anthropic-version",
        )


@bp.post("/v1/messages")
@idempotent
def create_message() -> Response:
    req = parse_body(MessagesRequest)
    job = requested_job(new_id("msg_"), req, req.images())
    chat = req.chat_request()
    running = start(broker(), job)
    if req.stream:
        return sse_response(stream_message(running))
    return json_response(collect_message(running, chat))


@bp.post("/v1/messages/count_tokens")
@takes_a_request  # it renders and tokenizes a prompt: not free, so not unlimited
def count_tokens() -> Response:
    req = parse_body(MessagesInput)
    images = checked_images(req.images())
    b = broker()
    b.roster.require_model(req.model)
    job = job_for(new_id("msg_"), req, images=images)
    if images:  # counted only by a model that reads them (shared/queue/model_kinds.py)
        b.roster.require_kind(job)
    prompt = b.windows.measure(job)
    if prompt is None:
        raise InvalidRequestError(
            f"The worker serving '{req.model}' has not published a tokenizer this server can "
            "count with; count_tokens is not available for this model.",
            param="model",
        )
    return json_response(TokenCount(input_tokens=prompt.tokens))


def collect_message(running: RunningJob, chat: ChatCompletionRequest) -> Message:
    result = collect(running)
    completion = chat_completion(
        chat, running.job.job_id, int(time.time()), result.got, result.done
    )
    return message(completion, result.done)


def _frames(events: list[StreamEvent]) -> bytes:
    return b"".join(named_frame(event.type, event) for event in events)


_PING = _frames([Ping()])


@functools.cache
def _text_framer(index: int) -> Callable[[TokenEvent], bytes]:
    """The per-token frame of a text delta of block `index`: rendered once, then each token
    only escapes its text (api/http/sse.py `token_framer`), as chat's stream does."""
    framed = token_framer(lambda e: ContentBlockDelta(index=index, delta=TextDelta(text=e.text)))
    return lambda event: b"event: content_block_delta\n" + framed(event)


def frames_of(stream: MessageStream, event: Relayed) -> bytes:
    """The SSE bytes of one of the job's events in the message's stream; a ping while it is
    silent."""
    if isinstance(event, TokenEvent):
        if stream.continues_text(event):
            return _text_framer(stream.blocks - 1)(event)
        return _frames(stream.feed(event))
    if isinstance(event, KeepaliveEvent):
        return _PING
    if isinstance(event, DoneEvent):
        return _frames(stream.closing(event))
    return b""  # a choice's end (a message is one choice, ended by its DoneEvent), a vector


def stream_message(running: RunningJob) -> Iterator[bytes]:
    """The job's events as Anthropic's stream; a ping while nothing comes; a failure after the
    stream began as an `error` event. A client that goes away cancels the job (`finally`)."""
    stream = MessageStream(running.job.job_id, running.job.model)
    try:
        yield _frames(stream.opening(running.started.prompt_tokens))
        for batch in running.updates():
            yield b"".join(frames_of(stream, event) for event in batch)
    except MLXQError as err:
        _, body = anthropic_error(err.status, err.detail())
        yield named_frame("error", body)
    finally:
        running.close()
