"""POST /v1/chat/completions: OpenAI chat completions, streamed or as one body."""

from __future__ import annotations

import time
from collections.abc import Iterator

from flask import Blueprint, Response

from api.http.json_response import json_response
from api.http.sse import frame, sse_response, token_framer
from api.http.validation import parse_body
from api.queue.broker import broker
from api.queue.generation import RunningJob, collect_answer, start, stream_frames
from api.routes.generation_job import requested_job
from api.stores.idempotency import idempotent
from shared.wire.chat.answers import (
    ChatChunkChoice,
    ChatCompletionChunk,
    ChunkDelta,
    chat_completion,
)
from shared.wire.chat.completions import ChatCompletionRequest, FinishReason
from shared.wire.events import ChoiceEndEvent, DoneEvent, TokenEvent
from shared.wire.generation.logprobs import ChoiceLogprobs
from shared.wire.ids import new_id

bp = Blueprint("chat", __name__)


@bp.post("/v1/chat/completions")
@idempotent
def create_chat_completion() -> Response:
    req = parse_body(ChatCompletionRequest)
    running = start(broker(), requested_job(new_id("chatcmpl-"), req, req.images()))
    if req.stream:
        return sse_response(stream_chat(running, req))
    return json_response(collect_answer(running, req, chat_completion))


def stream_chat(running: RunningJob, req: ChatCompletionRequest) -> Iterator[bytes]:
    head = ChatCompletionChunk(
        id=running.job.job_id,
        created=int(time.time()),
        model=running.job.model,
        choices=[],
        service_tier=req.service_tier,
    )
    ended: set[int] = set()

    def chunk(index: int, delta: ChunkDelta, finish_reason: FinishReason | None = None) -> bytes:
        choice = ChatChunkChoice(index=index, delta=delta, finish_reason=finish_reason)
        return frame(head.model_copy(update={"choices": [choice]}))

    def choice_end(end: ChoiceEndEvent) -> bytes:
        ended.add(end.index)
        return chunk(end.index, ChunkDelta(), end.finish_reason)

    def closing(done: DoneEvent) -> list[bytes]:
        frames = [
            chunk(i, ChunkDelta(), done.finish_reason) for i in range(req.n) if i not in ended
        ]
        if req.include_usage():
            frames.append(frame(head.model_copy(update={"usage": done.usage})))
        return frames

    def with_token(event: TokenEvent) -> ChatCompletionChunk:
        index = event.index or 0
        logprobs = None if event.logprobs is None else ChoiceLogprobs(content=event.logprobs)
        delta = ChunkDelta(content=event.text)
        if event.reasoning is not None:
            delta.reasoning_content = delta.reasoning = event.reasoning
            delta.content = event.text or None
        if event.call_deltas:  # the calls as they are written (their whole forms add nothing)
            delta.tool_calls = event.call_deltas
            delta.content = event.text or None
        choice = ChatChunkChoice(index=index, delta=delta, logprobs=logprobs)
        return head.model_copy(update={"choices": [choice]})

    opening = [chunk(i, ChunkDelta(role="assistant", content="")) for i in range(req.n)]
    return stream_frames(running, opening, token_framer(with_token), closing, choice_end)
