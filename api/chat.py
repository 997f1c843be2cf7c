"""POST /v1/chat/completions: OpenAI chat completions, streamed or as one body."""

from __future__ import annotations

import time
from collections.abc import Iterator

from flask import Blueprint, Response

from api.broker import broker
from api.generation import RunningJob, collect, start, stream_frames
from api.sse import frame, sse_response, token_framer
from api.validation import parse_body
from shared.answers import chat_completion
from shared.completions import (
    ChatChunkChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChoiceLogprobs,
    ChunkDelta,
    FinishReason,
)
from shared.events import DoneEvent, TokenEvent
from shared.ids import new_id
from shared.jobs import job_for

bp = Blueprint("chat", __name__)


@bp.post("/v1/chat/completions")
def create_chat_completion() -> Response:
    req = parse_body(ChatCompletionRequest)
    running = start(broker(), job_for(new_id("chatcmpl-"), req))
    if req.stream:
        return sse_response(stream_chat(running, req))
    return Response(collect_chat(running, req).model_dump_json(), mimetype="application/json")


def collect_chat(running: RunningJob, req: ChatCompletionRequest) -> ChatCompletion:
    result = collect(running)
    return chat_completion(req, running.job.job_id, int(time.time()), result.got, result.done)


def stream_chat(running: RunningJob, req: ChatCompletionRequest) -> Iterator[bytes]:
    head = ChatCompletionChunk(
        id=running.job.job_id,
        created=int(time.time()),
        model=running.job.model,
        choices=[],
        service_tier=req.service_tier,
    )

    def chunk(delta: ChunkDelta, finish_reason: FinishReason | None = None) -> bytes:
        choice = ChatChunkChoice(delta=delta, finish_reason=finish_reason)
        return frame(head.model_copy(update={"choices": [choice]}))

    def closing(done: DoneEvent) -> list[bytes]:
        frames = [chunk(ChunkDelta(), done.finish_reason)]
        if req.include_usage():
            frames.append(frame(head.model_copy(update={"usage": done.usage})))
        return frames

    def with_token(event: TokenEvent) -> ChatCompletionChunk:
        logprobs = None if event.logprobs is None else ChoiceLogprobs(content=event.logprobs)
        choice = ChatChunkChoice(delta=ChunkDelta(content=event.text), logprobs=logprobs)
        return head.model_copy(update={"choices": [choice]})

    opening = [chunk(ChunkDelta(role="assistant", content=""))]
    return stream_frames(running, opening, token_framer(with_token), closing)
