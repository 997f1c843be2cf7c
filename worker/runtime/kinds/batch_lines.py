"""A batch line's work around its generation, in the worker (the engine loop knows nothing of it).

Before: a line whose batch no longer runs (cancelled, failed, past its completion window), or
that already has its answer, is skipped without generating; a line that runs starts a fresh
event log, so a retried line (its first worker died) never mixes two attempts. After: its answer
is built from its event log (shared/wire/batch/batches.py `answer_body`: the endpoint's body, or the
error event's OpenAI error) and recorded in the batch's results hash under the line's index by
one Lua script that writes only while the batch is `in_progress`, only if no answer is there yet
(a retry never doubles a line), and then bumps the batch's counters. A cancelled line records
nothing: the batch's finalizer writes its `batch_cancelled` line.

An unexpected failure is re-raised while RQ has retries left for the line (RQ runs it again);
on the last try it is recorded as a 500 error line, so a batch always ends. A line that was not
cancelled and whose event log has no end (its events were dropped while Redis was away) counts
as such a failure.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from redis import Redis

from shared.queue import queued_tokens
from shared.queue.jobs import GenerationJob, JobOutcome, QueuedJob
from shared.queue.keys import Keys
from shared.wire.batch.batches import BatchLine, BatchOutputLine, LineResult, answer_body
from shared.wire.chat.answers import Transcripts
from shared.wire.errors import ErrorBody, ErrorDetail
from shared.wire.events import (
    ChoiceEndEvent,
    DoneEvent,
    ErrorEvent,
    RequeuedEvent,
    TokenEvent,
    decode_event,
)

log = logging.getLogger(__name__)

# With KEYS[3], KEYS[4] (its key has a queued-token limit), the line's tokens leave its batch's
# hold once its answer is written (shared/queue/queued_tokens.py).
_RECORD = (
    """
if redis.call('HGET', KEYS[1], 'status') ~= 'in_progress' then return 0 end
if redis.call('HSETNX', KEYS[2], ARGV[1], ARGV[2]) == 0 then return 0 end
redis.call('HINCRBY', KEYS[1], ARGV[3], 1)
redis.call('HINCRBY', KEYS[1], 'input_tokens', ARGV[4])
redis.call('HINCRBY', KEYS[1], 'output_tokens', ARGV[5])
"""
    + queued_tokens.LINE_RELEASE
    + "return 1"
)
SKIPPED = JobOutcome(finish_reason="skipped", prompt_tokens=0, completion_tokens=0)
FAILED = JobOutcome(finish_reason="error", prompt_tokens=0, completion_tokens=0)


class BatchLines:
    def __init__(self, redis: Redis, keys: Keys):
        self._redis = redis
        self._keys = keys
        self._record = redis.register_script(_RECORD)

    def wanted(self, line: BatchLine) -> bool:
        """Whether the line's batch still runs, its completion window is open and the line has
        no answer yet: a run whose answer was recorded can still come again when RQ's record
        of its end was lost (Redis went away as it ended), and it need not generate twice."""
        pipe = self._redis.pipeline(transaction=False)
        pipe.hget(self._keys.batch(line.batch_id), "status")
        pipe.hexists(self._keys.batch_results(line.batch_id), line.index)
        status, answered = pipe.execute()
        return status == b"in_progress" and not answered and time.time() < line.expires_at

    def run(
        self, job: GenerationJob, generate: Callable[[], JobOutcome], retries_left: int
    ) -> JobOutcome:
        line = job.batch_line
        assert line is not None
        if not self.wanted(line):
            return SKIPPED
        self._redis.delete(self._keys.replay(job.job_id))
        try:
            outcome = generate()
            result = self.result_of(job.job_id, line)
            if result is None and outcome.finish_reason != "cancelled":
                # Its end event never reached the log (dropped while Redis was away, as in a
                # failover): no answer can be built, and recording none would leave the batch
                # in progress for good. It runs again, or ends as a 500 on its last try.
                raise RuntimeError(f"the event log of {job.job_id} has no end")
        except Exception:
            if retries_left > 0:
                raise
            log.exception("batch line %s failed on its last try", job.job_id)
            outcome, result = FAILED, server_error(line.custom_id)
        if result is not None:
            self.record(job, result)
        return outcome

    def result_of(self, job_id: str, line: BatchLine) -> LineResult | None:
        """The line's answer from its event log; None if it was cancelled."""
        rows: Any = self._redis.lrange(self._keys.replay(job_id), 0, -1)
        got = Transcripts()
        for event in (decode_event(row) for row in rows):
            match event:
                case TokenEvent() | ChoiceEndEvent():
                    got.add(event)
                case RequeuedEvent():  # an earlier attempt's text: dropped
                    got.clear()
                case DoneEvent(usage=usage):
                    body = answer_body(line.endpoint, line.body, got, event, _now())
                    answered = BatchOutputLine.answered(
                        line.custom_id, 200, body.model_dump(mode="json")
                    )
                    return LineResult(
                        part="output",
                        line=answered,
                        input_tokens=usage.prompt_tokens,
                        output_tokens=usage.completion_tokens,
                    )
                case ErrorEvent(status=status, error=error):
                    return LineResult.failed(line.custom_id, status, ErrorBody(error=error))
        return None

    def record(self, job: QueuedJob, result: LineResult) -> bool:
        """Record the line's answer unless it has one or the batch no longer runs."""
        line = job.batch_line
        assert line is not None
        counter = "completed" if result.part == "output" else "failed"
        keys = [self._keys.batch(line.batch_id), self._keys.batch_results(line.batch_id)]
        args: list[str | int] = [
            line.index,
            result.model_dump_json(),
            counter,
            result.input_tokens,
            result.output_tokens,
        ]
        if job.queued_tokens is not None and job.owner is not None:
            keys += queued_tokens.hold_keys(self._keys, job.owner)
            args += [line.batch_id, job.queued_tokens]
        return bool(self._record(keys=keys, args=args))


def server_error(custom_id: str, message: str = "The server had an internal error.") -> LineResult:
    detail = ErrorDetail(message=message, type="server_error", code="server_error")
    return LineResult.failed(custom_id, 500, ErrorBody(error=detail))


def _now() -> int:
    return int(time.time())
