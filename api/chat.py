"""POST /v1/chat/completions: OpenAI chat completions, streamed or as one body."""

from __future__ import annotations

import time
from collections.abc import Iterator

from flask import Blueprint, Response

from api.broker import broker
from api.generation import RunningJob, collect, new_id, start, stream_frames
from api.sse import frame, sse_response, text_framer
from api.validation import parse_body
from shared.completions import (
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChunkDelta,
    FinishReason,
)
from shared.events import DoneEvent
from shared.jobs import GenerationJob, job_for

bp = Blueprint("chat", __name__)


@bp.post("/v1/chat/completions")
def create_chat_completion() -> Response:
    req = parse_body(ChatCompletionRequest)
    running = start(broker(), _job(req))
    if req.stream:
        return sse_response(stream_chat(running, req))
    return Response(collect_chat(running).model_dump_json(), mimetype="application/json")


def _job(req: ChatCompletionRequest) -> GenerationJob:
    return job_for(new_id("chatcmpl"), req)


def collect_chat(running: RunningJob) -> ChatCompletion:
    result = collect(running)
    return ChatCompletion(
        id=running.job.job_id,
        created=int(time.time()),
        model=running.job.model,
        choices=[
            ChatChoice(
                message=AssistantMessage(content=result.text),
                finish_reason=result.done.finish_reason,
            )
        ],
        usage=result.done.usage,
    )


def stream_chat(running: RunningJob, req: ChatCompletionRequest) -> Iterator[bytes]:
    head = ChatCompletionChunk(
        id=running.job.job_id, created=int(time.time()), model=running.job.model, choices=[]
    )

    def chunk(delta: ChunkDelta, finish_reason: FinishReason | None = None) -> bytes:
        choice = ChatChunkChoice(delta=delta, finish_reason=finish_reason)
        return frame(head.model_copy(update={"choices": [choice]}))

    def closing(done: DoneEvent) -> list[bytes]:
        frames = [chunk(ChunkDelta(), done.finish_reason)]
        if req.include_usage():
            frames.append(frame(head.model_copy(update={"usage": done.usage})))
        return frames

    def with_text(text: str) -> ChatCompletionChunk:
        choice = ChatChunkChoice(delta=ChunkDelta(content=text))
        return head.model_copy(update={"choices": [choice]})

    opening = [chunk(ChunkDelta(role="assistant", content=""))]
    return stream_frames(running, opening, text_framer(with_text), closing)
