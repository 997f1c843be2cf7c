"""The order of a model's interactive queue: fair between callers, then by priority.

A queue in arrival order lets one caller that sends 200 requests make everyone else wait behind
all of them. So each queued job gets a round: one more than the last round its caller (its
"share": the API key's owner, or the request's `user` when the API has no keys) was given, and
never less than one more than the round of the job taken last. Its place in the queue is then
before the first job of a later round, FIFO within a round: callers take turns, one job each,
whatever they have queued, and a newcomer waits about one job per other busy caller. vLLM's
`priority` (lower first, default 0) comes before the round: a job of priority -1 goes ahead of
every job of priority 0.

The queue stays RQ's list (`rq info` counts it as ever); `PLACE` moves a job RQ has just
appended to its place, and `shared/queue/backlog.py`'s `RELEASE` forgets it when it is taken or
withdrawn, moving the round on when it is taken. A job queued by another producer (with no
place) keeps its position. Nothing here talks to Redis; callers register the script.
"""

from __future__ import annotations

import hashlib

_ROUND_SPAN = 2**32

# KEYS: RQ queue list, order hash, rounds hash, round string.
# ARGV: job id, share, priority. Returns the job's index in the queue, or -1 if it was gone.
PLACE = f"""
local taken = tonumber(redis.call('GET', KEYS[4]) or '0')
local last = tonumber(redis.call('HGET', KEYS[3], ARGV[2]) or '0')
local round = math.max(taken, last) + 1
redis.call('HSET', KEYS[3], ARGV[2], round)
redis.call('EXPIRE', KEYS[3], 86400)
local place = tonumber(ARGV[3]) * {_ROUND_SPAN} + round
if redis.call('LREM', KEYS[1], -1, ARGV[1]) == 0 then return -1 end
redis.call('HSET', KEYS[2], ARGV[1], place)
local ids = redis.call('LRANGE', KEYS[1], 0, -1)
if #ids == 0 then
  redis.call('RPUSH', KEYS[1], ARGV[1])
  return 0
end
local places = redis.call('HMGET', KEYS[2], unpack(ids))
for i, other in ipairs(places) do
  if other and tonumber(other) > place then
    redis.call('LINSERT', KEYS[1], 'BEFORE', ids[i], ARGV[1])
    return i - 1
  end
end
redis.call('RPUSH', KEYS[1], ARGV[1])
return #ids
"""


def share(owner: str | None, user: str | None, keyed: bool) -> str:
    """Whose turn a job takes: its API key's owner; without keys, its `user` (hashed), or
    everyone alike."""
    if keyed and owner:
        return owner
    if user:
        return "user-" + hashlib.sha256(user.encode()).hexdigest()[:16]
    return "anonymous"
