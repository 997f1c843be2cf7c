"""The order of a model's queue: callers take turns, and `priority` orders a caller's own jobs.

A queue in arrival order lets one caller that sends 200 requests make everyone else wait behind
all of them. So each queued job gets a round: one more than the last round its caller (its
"share": the API key's owner, or the request's `user` when the API has no keys) was given, and
never less than one more than the round of the job taken last. Its place in the queue is then
before the first job of a later round, FIFO within a round: callers take turns, one job each,
whatever they have queued, and a newcomer waits about one job per other busy caller.

vLLM's `priority` (lower first, default 0) orders a caller's own jobs, never another's: the
rounds a caller holds stay its turns, and which of its jobs runs at each turn follows priority,
then arrival. A job that outranks some of its caller's queued jobs takes the earliest of their
turns, each of them moves to its caller's next turn, and the last one to the new job's round.
A priority that came before the rounds (as it did) would let one caller buy every turn with
`priority: -1048576`.

The queue stays RQ's list (`rq info` counts it as ever); `PLACE` moves a job RQ has just
appended to its place, and `shared/queue/backlog.py`'s `RELEASE` forgets it when it is taken or
withdrawn, moving the round on when it is taken. A job queued by another producer (with no
place) keeps its position. Nothing here talks to Redis; callers register the script.

This order is for the interactive lane (and `service_tier: flex` chats in the background lane):
`PLACE` reads the whole queue. The bulk lanes, which hold hundreds of thousands of batch lines,
keep their callers' turns in O(log callers) a job instead (shared/queue/turns.py).
"""

from __future__ import annotations

import hashlib

# The order hash holds each queued job's place as "{round} {priority} {share}": its turn, and
# what decides which of its share's jobs takes that turn. `ROUND_OF` reads the round back (a
# bare number is a place written by an earlier version: its round, in the low 32 bits).
ROUND_OF = """
local function round_of(place)
  local round = string.match(place, '^(%d+) ')
  if round then return tonumber(round) end
  return tonumber(place) % 4294967296
end
"""

# KEYS: RQ queue list, order hash, rounds hash, round string.
# ARGV: job id, share, priority. Returns the job's index in the queue, or -1 if it was gone.
PLACE = (
    ROUND_OF
    + """
local function insert_at_round(id, round)
  local ids = redis.call('LRANGE', KEYS[1], 0, -1)
  if #ids == 0 then
    redis.call('RPUSH', KEYS[1], id)
    return 0
  end
  local places = redis.call('HMGET', KEYS[2], unpack(ids))
  for i, other in ipairs(places) do
    if other and round_of(other) > round then
      redis.call('LINSERT', KEYS[1], 'BEFORE', ids[i], id)
      return i - 1
    end
  end
  redis.call('RPUSH', KEYS[1], id)
  return #ids
end

local taken = tonumber(redis.call('GET', KEYS[4]) or '0')
local last = tonumber(redis.call('HGET', KEYS[3], ARGV[2]) or '0')
local round = math.max(taken, last) + 1
local priority = tonumber(ARGV[3])
redis.call('HSET', KEYS[3], ARGV[2], round)
redis.call('EXPIRE', KEYS[3], 86400)
if redis.call('LREM', KEYS[1], -1, ARGV[1]) == 0 then return -1 end

-- The share's queued jobs that this one outranks, in queue order (their rounds ascending).
local ids = redis.call('LRANGE', KEYS[1], 0, -1)
local outranked = {}
if #ids > 0 then
  local places = redis.call('HMGET', KEYS[2], unpack(ids))
  for i, place in ipairs(places) do
    if place then
      local r, p, s = string.match(place, '^(%d+) (%-?%d+) (.*)$')
      if s == ARGV[2] and tonumber(p) > priority then
        table.insert(outranked, {index = i - 1, id = ids[i], round = tonumber(r), priority = p})
      end
    end
  end
end
local function place_of(r, p) return r .. ' ' .. p .. ' ' .. ARGV[2] end
if #outranked == 0 then
  redis.call('HSET', KEYS[2], ARGV[1], place_of(round, priority))
  return insert_at_round(ARGV[1], round)
end
-- Each outranked job steps into the next one's turn (same list index, so nothing else moves),
-- the new job into the first, and the last outranked job into the new round.
local first = outranked[1]
redis.call('LSET', KEYS[1], first.index, ARGV[1])
redis.call('HSET', KEYS[2], ARGV[1], place_of(first.round, priority))
for n = 1, #outranked - 1 do
  local job, next_turn = outranked[n], outranked[n + 1]
  redis.call('LSET', KEYS[1], next_turn.index, job.id)
  redis.call('HSET', KEYS[2], job.id, place_of(next_turn.round, job.priority))
end
local moved = outranked[#outranked]  -- its index now holds the job before it
redis.call('HSET', KEYS[2], moved.id, place_of(round, moved.priority))
insert_at_round(moved.id, round)
return first.index
"""
)


def share(owner: str | None, user: str | None, keyed: bool) -> str:
    """Whose turn a job takes: its API key's owner; without keys, its `user` (hashed), or
    everyone alike."""
    if keyed and owner:
        return owner
    if user:
        return "user-" + hashlib.sha256(user.encode()).hexdigest()[:16]
    return "anonymous"
