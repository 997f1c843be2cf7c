"""POST /v1/completions: OpenAI (legacy) text completions, streamed or as one body."""

from __future__ import annotations

import time
from collections.abc import Iterator

from flask import Blueprint, Response

from api.broker import broker
from api.generation import RunningJob, collect, new_id, start, stream_frames
from api.sse import frame, sse_response, text_framer
from api.validation import parse_body
from shared.completions import Completion, CompletionRequest, FinishReason, TextChoice
from shared.events import DoneEvent
from shared.jobs import GenerationJob, job_for

bp = Blueprint("completions", __name__)


@bp.post("/v1/completions")
def create_completion() -> Response:
    req = parse_body(CompletionRequest)
    running = start(broker(), _job(req))
    if req.stream:
        return sse_response(stream_completion(running, req))
    return Response(collect_completion(running, req).model_dump_json(), mimetype="application/json")


def _job(req: CompletionRequest) -> GenerationJob:
    return job_for(new_id("cmpl"), req)


def collect_completion(running: RunningJob, req: CompletionRequest) -> Completion:
    result = collect(running)
    text = req.prompt + result.text if req.echo else result.text
    return Completion(
        id=running.job.job_id,
        created=int(time.time()),
        model=running.job.model,
        choices=[TextChoice(text=text, finish_reason=result.done.finish_reason)],
        usage=result.done.usage,
    )


def stream_completion(running: RunningJob, req: CompletionRequest) -> Iterator[bytes]:
    head = Completion(
        id=running.job.job_id, created=int(time.time()), model=running.job.model, choices=[]
    )

    def chunk(text: str, finish_reason: FinishReason | None = None) -> bytes:
        choice = TextChoice(text=text, finish_reason=finish_reason)
        return frame(head.model_copy(update={"choices": [choice]}))

    def closing(done: DoneEvent) -> list[bytes]:
        frames = [chunk("", done.finish_reason)]
        if req.include_usage():
            frames.append(frame(head.model_copy(update={"usage": done.usage})))
        return frames

    def with_text(text: str) -> Completion:
        return head.model_copy(update={"choices": [TextChoice(text=text)]})

    opening = [chunk(req.prompt)] if req.echo else []
    return stream_frames(running, opening, text_framer(with_text), closing)
