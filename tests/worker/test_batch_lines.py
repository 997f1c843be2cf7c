"""A batch line's work around its generation (worker/runtime/kinds/batch_lines.py), on the session's
real Redis: a line always ends its batch's count, even when its events were lost."""

from __future__ import annotations

import time

import pytest
from redis import Redis

from shared.queue.config import Settings
from shared.queue.jobs import GenerationJob, JobOutcome
from shared.queue.keys import Keys
from shared.wire.batch.batches import BatchLine, LineResult
from tests.support import MODEL
from worker.runtime.kinds.batch_lines import BatchLines, server_error

BATCH = "batch_0123456789abcdef0123456789abcdef"


def _line_job(redis: Redis, keys: Keys) -> GenerationJob:
    """The batch's one line, its batch running, and no event of it in Redis."""
    redis.hset(keys.batch(BATCH), mapping={"status": "in_progress", "total": 1})
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
    line = BatchLine(
        batch_id=BATCH,
        index=0,
        custom_id="line-0",
        endpoint="/v1/chat/completions",
        body=body,
        expires_at=int(time.time()) + 600,
    )
    return GenerationJob(job_id=line.job_id(), model=MODEL, prompt="hi", batch_line=line)


def _events_lost() -> JobOutcome:
    """A generation that ended while every event it published was dropped."""
    return JobOutcome(finish_reason="stop", prompt_tokens=8, completion_tokens=4)


def test_a_line_whose_events_were_lost_runs_again_then_ends_as_a_500(
    redis: Redis, app_settings: Settings
) -> None:
    keys = Keys(app_settings.namespace)
    job = _line_job(redis, keys)
    lines = BatchLines(redis, keys)

    with pytest.raises(RuntimeError, match="has no end"):  # RQ runs it again
        lines.run(job, _events_lost, retries_left=1)
    assert redis.hlen(keys.batch_results(BATCH)) == 0

    outcome = lines.run(job, _events_lost, retries_left=0)
    assert outcome.finish_reason == "error"
    assert redis.hget(keys.batch(BATCH), "failed") == b"1"  # the batch's count is complete
    raw = redis.hget(keys.batch_results(BATCH), "0")
    assert raw is not None
    result = LineResult.model_validate_json(raw)
    assert result.part == "error"
    assert result.line.response is not None and result.line.response.status_code == 500


def test_a_cancelled_line_records_nothing(redis: Redis, app_settings: Settings) -> None:
    keys = Keys(app_settings.namespace)
    job = _line_job(redis, keys)

    def cancelled() -> JobOutcome:
        return JobOutcome(finish_reason="cancelled", prompt_tokens=0, completion_tokens=0)

    outcome = BatchLines(redis, keys).run(job, cancelled, retries_left=1)
    assert outcome.finish_reason == "cancelled"
    assert redis.hlen(keys.batch_results(BATCH)) == 0  # the finalizer writes its line


def test_a_line_that_already_has_its_answer_is_skipped_without_generating(
    redis: Redis, app_settings: Settings
) -> None:
    """RQ can run a line again after its answer was recorded, when Redis lost RQ's record of
    its end; the second run must not generate (or count) it again."""
    keys = Keys(app_settings.namespace)
    job = _line_job(redis, keys)
    lines = BatchLines(redis, keys)
    answered = server_error("line-0")
    assert lines.record(job, answered)

    def generate() -> JobOutcome:
        raise AssertionError("an answered line generated again")

    outcome = lines.run(job, generate, retries_left=1)
    assert outcome.finish_reason == "skipped"
    assert redis.hget(keys.batch(BATCH), "failed") == b"1"
