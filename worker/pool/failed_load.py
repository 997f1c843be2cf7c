"""The bulk jobs of a model whose load failed: its background responses and batch lines fail as
its waiting interactive jobs do (api/queue/watch.py), with the same 503 `model_load_failed`
naming the model and why, instead of waiting in their queues for a load that may never work.

The pool agent that saw the load fail calls `fail_bulk` once per failure. Each job queued in
the model's background and batch lanes then (in any list of the lane: its own or a caller's,
shared/queue/turns.py) is taken off its queue (LREM: whoever removes it
owns it, so a job a worker took meanwhile runs there instead), its place in the fair order and
its backlog entry are released, RQ's record is failed, and an ErrorEvent goes to its replay log
and channel (a background response reads as failed). A batch line also gets its error line in
its batch (worker/runtime/kinds/batch_lines.py, first write wins), so the batch ends. Jobs queued
after the failure wait for the next try, as interactive ones do.
"""

from __future__ import annotations

import logging
from typing import Any

from redis import Redis
from rq.job import Job
from rq.job_lifecycle import record_job_failure
from rq.serializers import JSONSerializer

from shared.queue import backlog, queued_tokens, turns
from shared.queue.keys import Keys
from shared.queue.turns import BULK_LANES
from shared.wire.batch.batches import LineResult
from shared.wire.errors import ModelLoadError
from shared.wire.events import ErrorEvent
from worker.runtime.kinds.batch_lines import BatchLines
from worker.runtime.liveness.job_records import announce, queued_job

log = logging.getLogger(__name__)


def fail_bulk(
    redis: Redis, keys: Keys, model: str, error: ModelLoadError, replay_ttl_s: int
) -> int:
    """Fail the model's queued bulk jobs with `error` (module docstring); how many failed."""
    release = redis.register_script(backlog.RELEASE)
    released = [keys.backlog(model), keys.backlog_tokens(model)]
    released += [keys.order(model), keys.round(model)]
    taken: list[str] = []
    for queue in [q for lane in BULK_LANES for q in turns.lane_lists(redis, keys, model, lane)]:
        queued: Any = redis.lrange(queue, 0, -1)
        for raw in queued:
            job_id = raw.decode() if isinstance(raw, bytes) else str(raw)
            if redis.lrem(queue, 1, job_id):
                release(keys=released, args=[job_id, "withdrawn"])
                taken.append(job_id)
    jobs = Job.fetch_many(taken, connection=redis, serializer=JSONSerializer)
    for job in jobs:
        if job is not None:
            _fail(redis, keys, job, error, replay_ttl_s)
    if taken:
        log.warning("failed %d bulk jobs of %s: its load failed", len(taken), model)
    return len(taken)


def _fail(redis: Redis, keys: Keys, job: Job, error: ModelLoadError, replay_ttl_s: int) -> None:
    queued = queued_job(job)
    pipe: Any = redis.pipeline(transaction=True)
    record_job_failure(job, error.message, pipe)
    announce(pipe, keys, job, ErrorEvent.from_error(error), replay_ttl_s, reset=False)
    if queued is not None:
        queued_tokens.release_job(pipe, keys, queued)
    pipe.execute()
    if queued is not None and queued.batch_line is not None:
        result = LineResult.failed(queued.batch_line.custom_id, error.status, error.body())
        BatchLines(redis, keys).record(queued, result)
