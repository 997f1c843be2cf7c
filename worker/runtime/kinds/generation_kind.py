"""The generation kind of job, as the one engine loop (worker/runtime/loop.py) and job function
(worker/runtime/job_function.py) run it on the token batch (worker/engine/generation/engine.py).

A step's outputs become, in order: a token event for each output with new text, reasoning,
logprobs or tool calls; a choice-end event for each choice that ends in a job of several; the
done (or error) event of each job that ends. Each job's completion tokens, first-token time
and cached tokens are counted on its admission as they come, for its outcome.

Around the job: a batch line's skip and record (worker/runtime/kinds/batch_lines.py); a stored
response's replay log kept as long as its record. At its run limit, a generation ends as its
job says (`JobLimits.on_run_limit`).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Literal

from redis import Redis

from shared.queue.jobs import JOB_FUNCTION, GenerationJob, JobOutcome
from shared.queue.keys import Keys
from shared.wire.chat.completions import (
    CompletionTokensDetails,
    FinishReason,
    PromptTokensDetails,
    Usage,
)
from shared.wire.errors import GenerationError
from shared.wire.events import ChoiceEndEvent, DoneEvent, ErrorEvent, Event, TokenEvent
from shared.wire.fleet.catalog import ModelKind
from worker.engine.generation.step_output import StepOutput
from worker.engine.prepare import PreparedJob
from worker.runtime.job_function import Run
from worker.runtime.kinds.batch_lines import BatchLines
from worker.runtime.loop import Admission, Ending
from worker.runtime.publish import Route


class GenerationKind:
    """A generation job's `JobKind` (worker/runtime/job_function.py)."""

    function = JOB_FUNCTION
    job_model = GenerationJob
    serves: ModelKind = "chat"
    failure = "generation failed"

    def route(self, keys: Keys, job: GenerationJob) -> Route:
        return Route.of(keys, job.job_id, job.reply_to, job.replayed, job.replay_ttl_s)

    def run(
        self, redis: Redis, keys: Keys, job: GenerationJob, retries_left: int, run: Run
    ) -> JobOutcome:
        if job.batch_line is not None:
            return BatchLines(redis, keys).run(job, run, retries_left)
        outcome = run()
        if job.replay_ttl_s is not None:
            redis.expire(keys.replay(job.job_id), job.replay_ttl_s)
        return outcome

    def on_run_limit(self, job: GenerationJob) -> Literal["length", "error"]:
        return job.limits.on_run_limit

    def worked(
        self, outputs: list[StepOutput], running: Mapping[str, Admission[PreparedJob]]
    ) -> int:
        return len(outputs)  # one token per running sequence

    def events(
        self, outputs: list[StepOutput], running: Mapping[str, Admission[PreparedJob]]
    ) -> list[tuple[Route, Event]]:
        events: list[tuple[Route, Event]] = []
        now = time.time()
        for out in outputs:
            admission = running[out.job_id]
            admission.completion_tokens = out.completion_tokens
            if admission.first_token_at is None:
                admission.first_token_at = now
            route = admission.route
            if out.text or out.reasoning or out.logprobs or out.call_deltas or out.tool_calls:
                token = TokenEvent(
                    text=out.text,
                    reasoning=out.reasoning or None,
                    logprobs=out.logprobs,
                    call_deltas=out.call_deltas,
                    tool_calls=out.tool_calls,
                    index=out.index or None,
                )
                events.append((route, token))
            if out.finish_reason is None:
                continue
            if len(admission.prepared.choices) > 1 and out.error is None:
                end = ChoiceEndEvent(index=out.index, finish_reason=_reason(out.finish_reason))
                events.append((route, end))
            if out.ends_job:
                admission.cached_tokens = out.cached_tokens
                events.append((route, _final(out)))
        return events

    def ending(self, out: StepOutput) -> Ending:
        return Ending(out.finish_reason or "error", _error_message(out))


def _error_message(out: StepOutput) -> str | None:
    return None if out.error is None else f"generation failed: {out.error}"


def _final(out: StepOutput) -> DoneEvent | ErrorEvent:
    message = _error_message(out)
    if message is not None:  # this sequence failed, the rest of the batch goes on
        return ErrorEvent.from_error(GenerationError(message))
    usage = Usage(
        prompt_tokens=out.prompt_tokens,
        completion_tokens=out.completion_tokens,
        total_tokens=out.prompt_tokens + out.completion_tokens,
        prompt_tokens_details=PromptTokensDetails(cached_tokens=out.cached_tokens),
        completion_tokens_details=CompletionTokensDetails(
            reasoning_tokens=out.reasoning_tokens,
            accepted_prediction_tokens=out.accepted_prediction_tokens,
            rejected_prediction_tokens=out.rejected_prediction_tokens,
        ),
    )
    return DoneEvent(
        finish_reason=_reason(out.finish_reason), usage=usage, stop_sequence=out.stop_sequence
    )


def _reason(engine_reason: str | None) -> FinishReason:
    if engine_reason == "tool_calls":
        return "tool_calls"
    return "stop" if engine_reason == "stop" else "length"
