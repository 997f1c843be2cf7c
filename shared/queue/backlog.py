"""A model's backlog: may a new interactive job join its queue? One atomic check, two scripts.

The API first asks whether a live worker serves the model (shared/queue/liveness.py, the rule
`/v1/models` lists by). Then `ACCEPT` runs in Redis as one round trip and decides, in order:
1. the queue holds `queue_cap` jobs or more -> `TOO_MANY_JOBS`;
2. the jobs already queued hold prompt tokens and this one would push them past
   `queue_token_cap` -> `TOO_MANY_TOKENS` (a lone job is accepted whatever its size);
3. else the job's tokens are recorded (`{ns}:backlog:{model}` hash, summed in
   `{ns}:backlog_tokens:{model}`) -> `ACCEPTED`.
`RELEASE` takes a job's tokens back out (and its place in the fair order,
shared/queue/fair_order.py);
it is idempotent, and whoever removes the job from the queue calls it: the worker that takes
it, or the API that withdraws it. An empty queue resets
the sum, so a backlog that drifted (a queue emptied by hand) heals itself.

Prompt tokens are estimated here (UTF-8 bytes / 4, plus a few per message; token-id prompts
count exactly): the cap must hold for every model, including one whose tokenizer the API could
not rebuild (shared/queue/prompt/prompt_tokens.py), and an estimate costs nothing on the request
path. Nothing here talks to Redis; callers register the scripts (`redis.register_script`).
"""

from __future__ import annotations

from enum import IntEnum

from shared.queue.fair_order import ROUND_OF
from shared.queue.jobs import QueuedJob


class Verdict(IntEnum):
    ACCEPTED = 0
    TOO_MANY_JOBS = 1
    TOO_MANY_TOKENS = 2


# KEYS: RQ queue list, backlog hash, backlog sum.
# ARGV: queue cap, token cap, job id, job tokens.
ACCEPT = """
local queued = redis.call('LLEN', KEYS[1])
local tokens = tonumber(redis.call('GET', KEYS[3]) or '0')
if queued == 0 and tokens ~= 0 then
  redis.call('DEL', KEYS[2], KEYS[3])
  tokens = 0
end
if queued >= tonumber(ARGV[1]) then return 1 end
if tokens > 0 and tokens + tonumber(ARGV[4]) > tonumber(ARGV[2]) then return 2 end
redis.call('HSET', KEYS[2], ARGV[3], ARGV[4])
redis.call('INCRBY', KEYS[3], ARGV[4])
return 0
"""

# KEYS: backlog hash, backlog sum, order hash, round string (shared/queue/fair_order.py).
# ARGV: job id, "taken" when a worker took it (its round becomes the current one).
# Returns 1 if the job's tokens were released.
RELEASE = (
    ROUND_OF
    + """
local place = redis.call('HGET', KEYS[3], ARGV[1])
if place then
  redis.call('HDEL', KEYS[3], ARGV[1])
  local round = round_of(place)
  if ARGV[2] == 'taken' and round > tonumber(redis.call('GET', KEYS[4]) or '0') then
    redis.call('SET', KEYS[4], round)
  end
end
local tokens = redis.call('HGET', KEYS[1], ARGV[1])
if not tokens then return 0 end
redis.call('HDEL', KEYS[1], ARGV[1])
redis.call('DECRBY', KEYS[2], tokens)
return 1
"""
)


def estimate_tokens(job: QueuedJob) -> int:
    """A prompt-token estimate for the token cap (each kind's own: shared/queue/jobs.py)."""
    return job.prompt_estimate()
