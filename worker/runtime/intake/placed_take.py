"""How a slot takes an interactive job that the API placed on a worker (api/queue/placement.py).

The model's interactive queue stays one RQ list in fair order (shared/queue/fair_order.py). A job
the API placed has a record `{worker_id}|{not_after}` (with `|spread` when it was placed only to
spread load) in `{ns}:placement:{model}`: until that time only that worker may take it; after
it, any worker. So a slot takes the first job, within
the first SCAN_DEPTH of the queue, that it may take; when there are jobs but none it may take,
the slot waits (POLL_S) and looks again, and takes no bulk job meanwhile (bulk lanes wait for an
empty interactive queue, as before); a bulk lane's next job is its callers' next turn
(shared/queue/turns.py `TAKE_TURN`, in the same script). An idle slot still blocks on the
interactive queue (BLMOVE); a job placed on another worker that it catches that way goes back
to the head of the queue (`CLAIM`), where the blocked slots of the other workers, or its own
next look, find it.

Taking a job also adds its prompt's block hashes (`{ns}:job_blocks:{model}`) to the taker's
`{ns}:blocks:{worker_id}` set, and counts whether the placement was followed (or spread) or its
wait ran out, all in the same script: the next turn of a conversation finds this worker even
before its next heartbeat (worker/runtime/prefix/prefix_report.py). Jobs nobody placed take nothing
of this.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from shared.queue.keys import Keys
from shared.queue.turns import BULK_LANES, RQ_QUEUES, TAKE_TURN, script_keys

# Jobs a slot looks at from the head of the interactive queue; the rest wait for their turn.
SCAN_DEPTH = 32
POLL_S = 0.05

_CLAIM = """
local function claim(placed, job_blocks, blocks, metrics, id, me, ttl)
  local record = redis.call('HGET', placed, id)
  local hashes = redis.call('HGET', job_blocks, id)
  redis.call('HDEL', placed, id)
  redis.call('HDEL', job_blocks, id)
  if record then
    local worker, _, kind = string.match(record, '^([^|]*)|([^|]*)|?(.*)$')
    local outcome = 'placement_overridden_wait'
    if worker == me then
      outcome = kind == 'spread' and 'placement_spread' or 'placement_followed'
    end
    redis.call('HINCRBY', metrics, outcome, 1)
  end
  if hashes then
    local members = {}
    for h in string.gmatch(hashes, '[^,]+') do members[#members + 1] = h end
    if #members > 0 then
      redis.call('SADD', blocks, unpack(members))
      redis.call('PEXPIRE', blocks, ttl)
    end
  end
end

local function may_take(record, me, now)
  if not record then return true end
  local worker, not_after = string.match(record, '^([^|]*)|([^|]*)')
  return worker == me or now > tonumber(not_after)
end

local function now_s()
  local t = redis.call('TIME')
  return tonumber(t[1]) + tonumber(t[2]) / 1000000
end
"""

# KEYS: the interactive queue, then each bulk lane's list and turns zset in priority order
# (background, batch: shared/queue/turns.py), RQ's set of queues, the worker's taking list, then
# the placement hash, the job-blocks hash, the worker's blocks set, the model's metrics hash.
# ARGV: worker id, scan depth, blocks TTL (ms), then each bulk lane's share list prefix.
# Returns {queue key, id}; {'', ''} when interactive jobs wait for other workers; false if empty.
TAKE = (
    _CLAIM
    + TAKE_TURN
    + """
local n = #KEYS
local queues, taking, placed = KEYS[n-5], KEYS[n-4], KEYS[n-3]
local job_blocks, blocks, metrics = KEYS[n-2], KEYS[n-1], KEYS[n]
local me = ARGV[1]
local ids = redis.call('LRANGE', KEYS[1], 0, tonumber(ARGV[2]) - 1)
if #ids > 0 then
  local records = redis.call('HMGET', placed, unpack(ids))
  local now = now_s()
  for i, id in ipairs(ids) do
    if may_take(records[i], me, now) then
      redis.call('LREM', KEYS[1], 1, id)
      redis.call('RPUSH', taking, id)
      claim(placed, job_blocks, blocks, metrics, id, me, ARGV[3])
      return {KEYS[1], id}
    end
  end
  return {'', ''}
end
for i = 1, (n - 7) / 2 do
  local lane, turns = KEYS[2 * i], KEYS[2 * i + 1]
  local id = take_turn(lane, turns, queues, ARGV[3 + i], taking)
  if id then return {lane, id} end
end
return false
"""
)

# KEYS: the interactive queue, the taking list, placement, job blocks, blocks set, metrics.
# ARGV: job id (just moved from the queue to the taking list), worker id, blocks TTL (ms).
# Returns 1 when the slot may keep it; else 0, and the job is back at the head of the queue.
CLAIM = (
    _CLAIM
    + """
local id, me = ARGV[1], ARGV[2]
if not may_take(redis.call('HGET', KEYS[3], id), me, now_s()) then
  redis.call('LREM', KEYS[2], 1, id)
  redis.call('LPUSH', KEYS[1], id)
  return 0
end
claim(KEYS[3], KEYS[4], KEYS[5], KEYS[6], id, me, ARGV[3])
return 1
"""
)


@dataclass(frozen=True)
class PlacedTake:
    """What a slot of one worker needs to take placed jobs and callers' turns: the keys and its
    own id."""

    worker_id: str
    placement: str
    job_blocks: str
    blocks: str
    metrics: str
    blocks_ttl_ms: int
    # Each bulk lane's list key -> its turns zset and share list prefix (shared/queue/turns.py).
    turns: dict[str, tuple[str, str]] = field(default_factory=dict)

    @classmethod
    def of(cls, keys: Keys, model: str, worker_id: str, blocks_ttl_ms: int) -> PlacedTake:
        turns = {}
        for lane in BULK_LANES:
            (lane_key, zset), prefix = script_keys(keys, model, lane)
            turns[lane_key] = (zset, prefix)
        return cls(
            worker_id,
            keys.placement(model),
            keys.job_blocks(model),
            keys.prefix_blocks(worker_id),
            keys.model_metrics(model),
            blocks_ttl_ms,
            turns,
        )

    def keys(self) -> list[str]:
        return [self.placement, self.job_blocks, self.blocks, self.metrics]

    def take(self, queues: list[str], taking: str, scan_depth: int) -> tuple[list[str], list[Any]]:
        """TAKE's KEYS and ARGV for a slot taking from `queues` (their list keys, interactive
        first) onto `taking`."""
        keys, prefixes = [queues[0]], []
        for lane_key in queues[1:]:
            zset, prefix = self.turns[lane_key]
            keys += [lane_key, zset]
            prefixes.append(prefix)
        keys += [RQ_QUEUES, taking, *self.keys()]
        return keys, [self.worker_id, scan_depth, self.blocks_ttl_ms, *prefixes]
