"""POST /v1/completions: OpenAI (legacy) text completions, streamed or as one body."""

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
from shared.wire.chat.answers import Completion, TextChoice, text_completion
from shared.wire.chat.completions import CompletionRequest, FinishReason
from shared.wire.events import ChoiceEndEvent, DoneEvent, TokenEvent
from shared.wire.generation.logprobs import TextLogprobs
from shared.wire.ids import new_id

bp = Blueprint("completions", __name__)


@bp.post("/v1/completions")
@idempotent
def create_completion() -> Response:
    req = parse_body(CompletionRequest)
    running = start(broker(), requested_job(new_id("cmpl-"), req))
    if req.stream:
        return sse_response(stream_completion(running, req))
    return json_response(collect_answer(running, req, text_completion))


def stream_completion(running: RunningJob, req: CompletionRequest) -> Iterator[bytes]:
    head = Completion(
        id=running.job.job_id, created=int(time.time()), model=running.job.model, choices=[]
    )
    ended: set[int] = set()
    prompts = req.prompts()
    choices = req.n * len(prompts)
    # Where each choice's next token starts in its text (legacy logprobs' text_offset); an
    # echo's logprobs begin with the prompt's tokens.
    offsets = dict.fromkeys(range(choices), 0)

    def chunk(index: int, text: str, finish_reason: FinishReason | None = None) -> bytes:
        choice = TextChoice(index=index, text=text, finish_reason=finish_reason)
        return frame(head.model_copy(update={"choices": [choice]}))

    def choice_end(end: ChoiceEndEvent) -> bytes:
        ended.add(end.index)
        return chunk(end.index, "", end.finish_reason)

    def closing(done: DoneEvent) -> list[bytes]:
        frames = [chunk(i, "", done.finish_reason) for i in range(choices) if i not in ended]
        if req.include_usage():
            frames.append(frame(head.model_copy(update={"usage": done.usage})))
        return frames

    def with_token(event: TokenEvent) -> Completion:
        index = event.index or 0
        logprobs = None
        if event.logprobs is not None:
            logprobs = TextLogprobs.of(event.logprobs, offsets[index])
            offsets[index] += sum(len(entry.token) for entry in event.logprobs)
        choice = TextChoice(index=index, text=event.text, logprobs=logprobs)
        return head.model_copy(update={"choices": [choice]})

    echoed = [p if isinstance(p, str) else "" for p in prompts]
    opening = [chunk(i, echoed[i // req.n]) for i in range(choices)] if req.echo else []
    return stream_frames(running, opening, token_framer(with_token), closing, choice_end)
