"""A batch's lines on their way to the workers: recorded a chunk at a time as they pass intake,
and, when the batch stops (cancelled, failed, expired), stopped where they run and dropped from
the models' batch lanes in one step.

`record_chunk` writes a chunk's custom_ids, its lines refused alone and its counts, and moves
the batch from `validating` to `in_progress` with its first lines, in one script that writes
nothing once the batch has stopped (cancelled, failed): the intake process can never add lines
behind a cancel. `drop_queued` takes every still queued line of a batch off its models' batch
lanes in one script per lane (each of the lane's lists, its own and its callers'
(shared/queue/turns.py), is rewritten without them: O(lane), not a worker's take per line),
then deletes their RQ jobs; a line a worker took already is stopped by the caller (`stop`) or
sees the batch's status and skips (worker/runtime/kinds/batch_lines.py).

While its intake process runs (api/stores/batch_feed.py) a batch's hash holds `intake_until`,
the time by which the intake must next renew it; `close_intake` removes it once every line is
recorded, and until then no reader finalizes the batch.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from rq.job import Job
from rq.registry import StartedJobRegistry
from rq.serializers import JSONSerializer

from api.queue.broker import Broker
from shared.queue import queued_tokens, turns
from shared.wire.batch.batches import (
    BatchError,
    BatchErrors,
    LineResult,
    StoredBatch,
    line_job_prefix,
)

# KEYS: the batch hash, its lines list, its results hash. ARGV: now, the keys' TTL (s), the
# batch's record when it changed (else ''), the number of custom_ids n, the n custom_ids, then
# (index, result) pairs of the lines refused alone. Returns 1 if written, 0 if the batch stopped.
_RECORD_CHUNK = """
local status = redis.call('HGET', KEYS[1], 'status')
if status ~= 'validating' and status ~= 'in_progress' then return 0 end
local ttl, n = tonumber(ARGV[2]), tonumber(ARGV[4])
if ARGV[3] ~= '' then redis.call('HSET', KEYS[1], 'record', ARGV[3]) end
if n == 0 then return 1 end
if status == 'validating' then
  redis.call('HSET', KEYS[1], 'status', 'in_progress', 'in_progress_at', ARGV[1])
end
redis.call('RPUSH', KEYS[2], unpack(ARGV, 5, 4 + n))
redis.call('EXPIRE', KEYS[2], ttl)
local refused = 0
for i = 5 + n, #ARGV, 2 do
  redis.call('HSET', KEYS[3], ARGV[i], ARGV[i + 1])
  refused = refused + 1
end
if refused > 0 then redis.call('EXPIRE', KEYS[3], ttl) end
redis.call('HINCRBY', KEYS[1], 'total', n)
redis.call('HINCRBY', KEYS[1], 'failed', refused)
return 1
"""

# KEYS: a batch lane's list, its turns zset. ARGV: the batch's line job prefix, the lane's share
# list prefix (shared/queue/turns.py). Each list keeps every other job in its order; returns
# the ids taken off.
_DROP = (
    turns.LISTS
    + """
local dropped = {}
local prefix, n = ARGV[1], #ARGV[1]
for _, list in ipairs(lane_lists(KEYS[1], KEYS[2], ARGV[2])) do
  local ids = redis.call('LRANGE', list, 0, -1)
  local keep, found = {}, 0
  for _, id in ipairs(ids) do
    if string.sub(id, 1, n) == prefix then
      dropped[#dropped + 1] = id
      found = found + 1
    else
      keep[#keep + 1] = id
    end
  end
  if found > 0 then
    redis.call('DEL', list)
    for i = 1, #keep, 4000 do
      redis.call('RPUSH', list, unpack(keep, i, math.min(i + 3999, #keep)))
    end
  end
end
return dropped
"""
)
# KEYS: the batch hash. ARGV: now, its errors. Fails a batch still validating or running.
_FAIL = """
local status = redis.call('HGET', KEYS[1], 'status')
if status ~= 'validating' and status ~= 'in_progress' then return 0 end
redis.call('HSET', KEYS[1], 'status', 'failed', 'failed_at', ARGV[1], 'errors', ARGV[2])
return 1
"""
RUNNING = (b"validating", b"in_progress")
# RQ jobs deleted per round trip.
_DELETE_CHUNK = 1000


class BatchQueue:
    def __init__(self, broker: Broker):
        self._broker = broker
        self._redis = redis = broker.redis
        self._keys = broker.keys
        self._ttl_s = broker.settings.batch_ttl_s
        self._record = redis.register_script(_RECORD_CHUNK)
        self._drop = redis.register_script(_DROP)
        self._fail = redis.register_script(_FAIL)

    def renew(self, batch_id: str, until: float) -> None:
        """The intake is alive: no reader fails the batch before `until`."""
        self._redis.hset(self._keys.batch(batch_id), "intake_until", f"{until:.3f}")

    def close_intake(self, batch_id: str) -> None:
        """Every line is recorded: the batch may end once they are answered."""
        self._redis.hdel(self._keys.batch(batch_id), "intake_until")

    def running(self, batch_id: str) -> bool:
        """Whether the batch is still validating or in progress."""
        return self._redis.hget(self._keys.batch(batch_id), "status") in RUNNING

    def fail(self, stored: StoredBatch, owner: str, errors: list[BatchError], now: int) -> None:
        """Fail a batch still validating or running with `errors`, stop its lines, then end its
        intake."""
        body = BatchErrors(data=errors).model_dump_json()
        self._fail(keys=[self._keys.batch(stored.id)], args=[now, body])
        self.stopped(stored, owner)

    def name_all(self, batch_id: str, custom_ids: list[str]) -> None:
        """Set the batch's lines to every custom_id of its input, as its intake fails it."""
        key = self._keys.batch_lines(batch_id)
        pipe = self._redis.pipeline()
        pipe.delete(key)
        for start in range(0, len(custom_ids), _DELETE_CHUNK):
            pipe.rpush(key, *custom_ids[start : start + _DELETE_CHUNK])
        pipe.expire(key, self._ttl_s)
        pipe.execute()

    def stopped(self, stored: StoredBatch, owner: str) -> None:
        """The batch stopped while its intake ran: stop its lines, give back what it held, and
        end the intake."""
        self.stop(stored)
        pipe = self._redis.pipeline(transaction=False)
        queued_tokens.release(pipe, self._keys, owner, stored.id)
        pipe.hdel(self._keys.batch(stored.id), "intake_until")
        pipe.execute()

    def stop(self, stored: StoredBatch) -> None:
        """Cancel the lines workers are generating now and drop the queued ones."""
        prefix = line_job_prefix(stored.id)
        for model in stored.models:
            registry = StartedJobRegistry(
                self._keys.batch_queue(model), connection=self._redis, serializer=JSONSerializer
            )
            for job_id in registry.get_job_ids(cleanup=False):
                if job_id.startswith(prefix):
                    self._broker.cancel(job_id)
        self.drop_queued(stored.id, stored.models)

    def record_chunk(
        self,
        stored: StoredBatch,
        custom_ids: list[str],
        refused: dict[int, LineResult],
        now: int,
        record_changed: bool,
    ) -> bool:
        """Record a chunk of lines that passed intake; False if the batch has stopped."""
        keys = [
            self._keys.batch(stored.id),
            self._keys.batch_lines(stored.id),
            self._keys.batch_results(stored.id),
        ]
        args: list[str | int] = [now, self._ttl_s]
        args += [stored.model_dump_json() if record_changed else "", len(custom_ids)]
        args += custom_ids
        for index, result in refused.items():
            args += [index, result.model_dump_json()]
        return bool(self._record(keys=keys, args=args))

    def drop_queued(self, batch_id: str, models: Iterable[str]) -> int:
        """Take the batch's queued lines off its models' batch lanes and delete their jobs;
        how many were dropped."""
        dropped: list[Any] = []
        for model in models:
            keys, share_prefix = turns.script_keys(self._keys, model, "batch")
            dropped += self._drop(keys=keys, args=[line_job_prefix(batch_id), share_prefix])
        for start in range(0, len(dropped), _DELETE_CHUNK):
            chunk = dropped[start : start + _DELETE_CHUNK]
            self._redis.delete(*(Job.key_for(bytes(job_id).decode()) for job_id in chunk))
        return len(dropped)
