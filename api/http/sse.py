"""Server-sent event framing: the one place that writes SSE bytes."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator

from flask import Response, stream_with_context
from pydantic import BaseModel

from shared.wire.events import TokenEvent

DONE = b"data: [DONE]\n\n"
# A comment line with no blank line after it: a blank line would end an event, and SSE readers
# that keep the last event id (the OpenAI SDK among them) then hand the client an event with no
# data after every keepalive on a stream whose events carry ids (the Responses API's).
KEEPALIVE = b": keepalive\n"


def frame(payload: BaseModel) -> bytes:
    """One `data:` event holding the model as JSON (JSON never contains a raw newline)."""
    return (
        b"data: " + payload.__pydantic_serializer__.to_json(payload, exclude_none=False) + b"\n\n"
    )


# A placeholder no model output can contain; its JSON form marks where the text goes.
_SLOT = "\u0000mlxq-text-slot\u0000"
_SLOT_JSON = json.dumps(_SLOT).encode()


def token_framer(template: Callable[[TokenEvent], BaseModel]) -> Callable[[TokenEvent], bytes]:
    """A fast `frame(template(event))` for the per-token path: the payload of a plain token is
    rendered once with a placeholder, and each token only JSON-escapes its own text between the
    halves. A token that carries reasoning, log probabilities or pieces of tool calls, or belongs
    to a choice other than the first, is rendered whole."""
    prefix, suffix = frame(template(TokenEvent(text=_SLOT))).split(_SLOT_JSON)

    def framed(event: TokenEvent) -> bytes:
        if (
            event.reasoning is not None
            or event.logprobs is not None
            or event.call_deltas is not None
            or event.index is not None
        ):
            return frame(template(event))
        return prefix + json.dumps(event.text, ensure_ascii=False).encode() + suffix

    return framed


def sse_response(frames: Iterator[bytes]) -> Response:
    """A streaming response; headers go out before the first frame."""
    return Response(
        stream_with_context(frames),
        mimetype="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


def named_frame(name: str, payload: BaseModel) -> bytes:
    """A named event without an id, as Anthropic's Messages API streams them."""
    return f"event: {name}\n".encode() + frame(payload)


def event_frame(name: str, payload: BaseModel, event_id: int) -> bytes:
    """A named event with an id (a client resumes with `Last-Event-ID`), as the Responses API
    streams them."""
    return f"id: {event_id}\nevent: {name}\n".encode() + frame(payload)
