"""The API's writes and reads of the bulk lanes (background responses, batch lines): each job
queued on its caller's list, in turn with the other callers' (shared/queue/turns.py), read back
for a response's `queue_position` and taken off again on a cancel.

RQ records each job as ever, with its lane's queue as its origin; only where its id waits
differs: `ShareIntake` is the lane's RQ queue with its push sent to the share's list. The ids of
a chunk go to their lists and each share joins the turns after its ids are there, in one
transaction, so a worker's take never sees a share without its jobs, nor jobs without a turn.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from redis import Redis
from redis.client import Pipeline
from rq import Queue, Retry
from rq.serializers import JSONSerializer

from shared.queue import turns
from shared.queue.jobs import JOB_FUNCTION, GenerationJob, Lane
from shared.queue.keys import RQ_QUEUE_PREFIX, Keys

# Bulk jobs enqueued per Redis round trip.
BULK_CHUNK = 500


class ShareIntake(Queue):
    """A bulk lane's RQ queue whose jobs wait in one share's list (RQ 3.0's `push_job_id` is
    the one place its enqueue pushes an id; pyproject.toml pins rq's minor release)."""

    def __init__(self, name: str, share_key: str, connection: Redis):
        super().__init__(name, connection=connection, serializer=JSONSerializer)
        self.share_key = share_key

    def push_job_id(
        self, job_id: str, pipeline: Pipeline | None = None, at_front: bool = False
    ) -> None:
        connection: Any = pipeline if pipeline is not None else self.connection
        (connection.lpush if at_front else connection.rpush)(self.share_key, job_id)


class BulkLanes:
    def __init__(self, redis: Redis, keys: Keys, call: Callable[[Callable[[], Any]], Any]):
        self._redis, self._keys, self._call = redis, keys, call
        self._join = redis.register_script(turns.JOIN)
        self._remove = redis.register_script(turns.REMOVE)
        self._position = redis.register_script(turns.POSITION)
        self._intakes: dict[str, ShareIntake] = {}  # each asks Redis its version once

    def submit(
        self,
        jobs: list[GenerationJob],
        options: Callable[[GenerationJob], dict[str, Any]],
        retries: int,
    ) -> None:
        """Queue `jobs` on their lanes, each on its share's list in order; `options`: RQ's
        options of a job (its payload, id and TTLs)."""
        retry = Retry(max=retries) if retries else None
        for start in range(0, len(jobs), BULK_CHUNK):
            pipe = self._redis.pipeline(transaction=True)
            joined: dict[tuple[str, Lane, str], None] = {}
            for queued in jobs[start : start + BULK_CHUNK]:
                lane: Lane = "batch" if queued.batch_line is not None else "background"
                job = queued.model_copy(update={"lane": lane})  # recorded in metrics and logs
                data = Queue.prepare_data(
                    JOB_FUNCTION,
                    **options(job),
                    retry=retry,
                    description=job.job_id,  # RQ's default repeats the whole payload
                )
                share = job.share or "anonymous"
                self._intake(job.model, lane, share).enqueue_many([data], pipeline=pipe)
                joined[(job.model, lane, share)] = None
            for model, lane, share in joined:  # after every id of the chunk is on its list
                name = self._keys.share_queue(model, lane, share)
                keys = [self._keys.turns(model, lane), RQ_QUEUE_PREFIX + name, turns.RQ_QUEUES]
                self._join(keys=keys, args=[share], client=pipe)
            self._call(pipe.execute)

    def remove(self, job_id: str, model: str, lane: Lane, share: str | None) -> bool:
        """Take a queued job off its lane (a cancel); whether it was still there. Without its
        share every list of the lane is searched."""
        keys, prefix = turns.script_keys(self._keys, model, lane)
        args = [prefix, job_id, share or ""]
        return bool(self._call(lambda: self._remove(keys=keys, args=args)))

    def position(self, job_id: str, model: str, lane: Lane, share: str) -> int | None:
        """How many jobs are taken before a queued one if nothing else comes (turns.POSITION);
        None if it is not queued."""
        keys, prefix = turns.script_keys(self._keys, model, lane)
        found = int(self._call(lambda: self._position(keys=keys, args=[prefix, job_id, share])))
        return None if found < 0 else found

    def _intake(self, model: str, lane: Lane, share: str) -> ShareIntake:
        name = self._keys.share_queue(model, lane, share)
        if name not in self._intakes:
            lane_name = self._keys.lane(model, lane)
            self._intakes[name] = ShareIntake(lane_name, RQ_QUEUE_PREFIX + name, self._redis)
        return self._intakes[name]
