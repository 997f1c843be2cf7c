"""The bulk lanes' order: each caller's background responses and batch lines wait in a list of
their own, and the callers take turns.

A bulk lane (background, batch: shared/queue/jobs.py `Lane`) held every caller's jobs in one RQ
list in arrival order, so one key's ten open 50,000-line batches put another key's 10-line batch
behind 500,000 lines. The interactive lane's fair order (shared/queue/fair_order.py) moves each
job to its place with `LINSERT`, which reads the whole list: fine for a few hundred interactive
requests, far too slow for every line of 500,000. So here the order is kept by construction:

- **one list per share** (the caller, as `fair_order.share` names it): RQ queue
  `{ns}.{model}.{lane}#{share}` (shared/queue/keys.py), appended to in arrival order;
- **the turns**: a zset `{ns}:turns:{lane}:{model}` of the shares with jobs, scored by when each
  was last served. A take (`TAKE_TURN`, inside the slots' take script,
  worker/runtime/intake/placed_take.py) pops the head of the lowest-scored share's list and
  gives that share the highest score plus one: the end of the round. A share whose list it
  finds empty leaves the turns there and then. A share that joins (`JOIN`) is scored the same
  way, after every caller already waiting, as a newcomer to the interactive lane waits about
  one job per other busy caller. A served share keeps its score while its list is empty until
  its next turn comes round, so a caller that sends one job each time its last is taken still
  gets one turn per round, not a newcomer's place ahead of the others every time.

Every step is O(log shares) per job, whatever the lane holds. The lane's own RQ list stays,
taken before the shares' lists: what RQ or mlxq puts back goes there (a bulk job retried by
RQ's `Retry`, the reaper's hand-back of a dead worker's jobs, a slot's put-back, `service_tier:
flex` chats, which the interactive lane's fair order places), since each of them was taken
once already or has a client waiting. Every job's RQ origin is the lane's queue, so RQ's
registries (started, failed, finished), the reaper and `rq info`'s registry counts are per lane
as before; the shares' queues are listed in RQ's set of queues while they have a turn, so
`rq info` shows each caller's waiting jobs too.

Lua here builds the shares' list keys from a prefix that shared/queue/keys.py gives
(`share_queue_prefix`): which lists exist is only known inside the script. mlxq runs on one
Redis (not a cluster), where a script may reach keys it was not passed. Nothing here talks to
Redis but `lane_lists`; callers register the scripts.
"""

from __future__ import annotations

from typing import Any

from redis import Redis
from redis.client import Pipeline
from redis.commands.core import Script
from rq import Queue

from shared.queue.jobs import Lane
from shared.queue.keys import Keys

BULK_LANES: tuple[Lane, ...] = ("background", "batch")
# RQ's set of every queue's key (rq's `Queue.redis_queues_keys`), where `rq info` finds them.
RQ_QUEUES = Queue.redis_queues_keys

# A Lua function: take the next job of a bulk lane onto `taking`, or false. KEYS it is given by
# its caller: the lane's RQ list, its turns zset, RQ's set of queues; `prefix` builds a share's
# list key (keys.py `share_queue_prefix`).
TAKE_TURN = """
local function take_turn(lane, turns, queues, prefix, taking)
  local id = redis.call('LMOVE', lane, taking, 'LEFT', 'RIGHT')
  if id then return id end
  while true do
    local first = redis.call('ZRANGE', turns, 0, 0)
    if #first == 0 then return false end
    local share = first[1]
    local list = prefix .. share
    id = redis.call('LMOVE', list, taking, 'LEFT', 'RIGHT')
    if id then
      local last = redis.call('ZRANGE', turns, -1, -1, 'WITHSCORES')
      redis.call('ZADD', turns, tonumber(last[2]) + 1, share)
      return id
    end
    redis.call('ZREM', turns, share)
    redis.call('SREM', queues, list)
  end
end
"""

# KEYS: the turns zset, the share's list, RQ's set of queues. ARGV: the share.
# Runs after the share's jobs were appended to its list. Returns 1 if the share joined the turns.
JOIN = """
if redis.call('LLEN', KEYS[2]) == 0 then return 0 end
redis.call('SADD', KEYS[3], KEYS[2])
local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
local score = 0
if #last > 0 then score = tonumber(last[2]) + 1 end
return redis.call('ZADD', KEYS[1], 'NX', score, ARGV[1])
"""

# A Lua function: the lane's lists, its own first, then each share's in turn order.
LISTS = """
local function lane_lists(lane, turns, prefix)
  local lists = {lane}
  for _, share in ipairs(redis.call('ZRANGE', turns, 0, -1)) do
    lists[#lists + 1] = prefix .. share
  end
  return lists
end
"""

# KEYS: the lane's RQ list, its turns zset. ARGV: the share list prefix.
# Returns {jobs waiting, then the id at the head of each list that has one}: the lane's depth,
# and the candidates for its oldest waiting job.
WAITING = (
    LISTS
    + """
local total, heads = 0, {}
for _, list in ipairs(lane_lists(KEYS[1], KEYS[2], ARGV[1])) do
  local n = redis.call('LLEN', list)
  if n > 0 then
    total = total + n
    heads[#heads + 1] = redis.call('LINDEX', list, 0)
  end
end
return {total, unpack(heads)}
"""
)

# KEYS: the lane's RQ list, its turns zset. ARGV: the share list prefix, a job id, its share
# ('' if unknown: every list is searched). Returns 1 if the job was taken off the lane.
REMOVE = (
    LISTS
    + """
if ARGV[3] ~= '' and redis.call('LREM', ARGV[1] .. ARGV[3], 1, ARGV[2]) > 0 then return 1 end
for _, list in ipairs(lane_lists(KEYS[1], KEYS[2], ARGV[1])) do
  if redis.call('LREM', list, 1, ARGV[2]) > 0 then return 1 end
end
return 0
"""
)

# KEYS: the lane's RQ list, its turns zset. ARGV: the share list prefix, a job id, its share.
# Returns how many jobs are taken before it if no other job comes (its own share's ahead of it,
# one per round of each other share's, the lane's own list first), or -1 if it is not queued.
POSITION = """
local index = redis.call('LPOS', ARGV[1] .. ARGV[3], ARGV[2])
if not index then
  local own = redis.call('LPOS', KEYS[1], ARGV[2])
  if own then return own end
  return -1
end
local ahead = redis.call('LLEN', KEYS[1]) + index
local mine = redis.call('ZSCORE', KEYS[2], ARGV[3])
local shares = redis.call('ZRANGE', KEYS[2], 0, -1, 'WITHSCORES')
for i = 1, #shares, 2 do
  local share, score = shares[i], tonumber(shares[i + 1])
  if share ~= ARGV[3] then
    local rounds = index
    if mine and score < tonumber(mine) then rounds = index + 1 end
    ahead = ahead + math.min(redis.call('LLEN', ARGV[1] .. share), rounds)
  end
end
return ahead
"""


def script_keys(keys: Keys, model: str, lane: Lane) -> tuple[list[str], str]:
    """The KEYS (lane list, turns) and the share list prefix of a lane's scripts."""
    lane_key = f"{Queue.redis_queue_namespace_prefix}{keys.lane(model, lane)}"
    return [lane_key, keys.turns(model, lane)], keys.share_queue_prefix(model, lane)


def add_waiting(pipe: Pipeline, waiting: Script, keys: Keys, model: str, lane: Lane) -> None:
    """Queue on `pipe` the read of a lane's waiting jobs and its lists' heads (`WAITING`,
    registered by the caller as `waiting`); the interactive lane has no turns, only its list."""
    lane_keys, prefix = script_keys(keys, model, lane)
    waiting(keys=lane_keys, args=[prefix], client=pipe)


def lane_lists(redis: Redis, keys: Keys, model: str, lane: Lane) -> list[str]:
    """The keys of every list a lane's jobs wait in: its own, then each share's in turn order."""
    (lane_key, turns), _ = script_keys(keys, model, lane)
    shares: Any = redis.zrange(turns, 0, -1)
    names = [keys.share_queue(model, lane, bytes(s).decode()) for s in shares]
    return [lane_key] + [f"{Queue.redis_queue_namespace_prefix}{name}" for name in names]
