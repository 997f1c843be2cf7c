"""The embedding kind of job, as the one engine loop (worker/runtime/loop.py) and job function
(worker/runtime/job_function.py) run it on the embedding engine
(worker/engine/embedding/engine.py).

A step's outputs become an embedding event per input encoded (base64 of its vector's
little-endian float32 bytes) and the done event of each job whose last vector it was, with the
job's prompt tokens as its usage. A step worked on the tokens of the inputs it encoded.

An embedding job keeps no replay log (only the client waiting on it reads its vectors), has
nothing to do around its run, and ends at its run limit in an error: its vectors are all or
nothing.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from typing import Literal

from redis import Redis

from shared.queue.jobs import EMBEDDING_JOB_FUNCTION, EmbeddingJob, JobOutcome
from shared.queue.keys import Keys
from shared.wire.chat.completions import Usage
from shared.wire.events import DoneEvent, EmbeddingEvent, Event
from shared.wire.fleet.catalog import ModelKind
from worker.engine.embedding.engine import EmbeddingOutput, PreparedEmbedding
from worker.runtime.job_function import Run
from worker.runtime.loop import Admission, Ending
from worker.runtime.publish import Route

STOPPED = Ending("stop")


class EmbeddingKind:
    """An embedding job's `JobKind` (worker/runtime/job_function.py)."""

    function = EMBEDDING_JOB_FUNCTION
    job_model = EmbeddingJob
    serves: ModelKind = "embedding"
    failure = "embedding failed"

    def route(self, keys: Keys, job: EmbeddingJob) -> Route:
        return Route.of(keys, job.job_id, job.reply_to, replayed=False)

    def run(
        self, redis: Redis, keys: Keys, job: EmbeddingJob, retries_left: int, run: Run
    ) -> JobOutcome:
        return run()

    def on_run_limit(self, job: EmbeddingJob) -> Literal["length", "error"]:
        return "error"

    def worked(
        self, outputs: list[EmbeddingOutput], running: Mapping[str, Admission[PreparedEmbedding]]
    ) -> int:
        return sum(len(running[o.job_id].prepared.inputs[o.index]) for o in outputs)

    def events(
        self, outputs: list[EmbeddingOutput], running: Mapping[str, Admission[PreparedEmbedding]]
    ) -> list[tuple[Route, Event]]:
        events: list[tuple[Route, Event]] = []
        for out in outputs:
            route = running[out.job_id].route
            data = base64.b64encode(out.vector).decode()
            events.append((route, EmbeddingEvent(index=out.index, data=data)))
            if out.ends_job:
                tokens = out.prompt_tokens
                usage = Usage(prompt_tokens=tokens, completion_tokens=0, total_tokens=tokens)
                events.append((route, DoneEvent(finish_reason="stop", usage=usage)))
        return events

    def ending(self, out: EmbeddingOutput) -> Ending:
        return STOPPED
