"""Queued tokens: what an API key's accepted but unfinished jobs hold of its `queued` limit.

OpenAI's "batch queue limit" (enqueued tokens), over every lane here: a key with `:queued=N`
(shared/queue/config.py) may hold at most N tokens in jobs that are queued or running,
interactive requests, background responses and batch lines alike. The API takes a job's share
at admission, in the same Lua script and round trip as the per-minute buckets
(api/limits/rates.py); a job that holds some carries the count (`queued_tokens`), so
whoever records its end gives them back here, in a pipeline it sends anyway:

- the worker that ends a job, however it ended (finished, failed, cancelled while queued, past
  its queue deadline: worker/runtime/job_function.py `report`);
- the reaper that fails the job of a dead worker (a retried bulk job keeps its hold until it
  ends elsewhere);
- the API that withdraws an interactive job nobody waits for, or cancels a background response.

A batch holds one entry, all its lines' tokens from its creation; each line's answer, recorded
once (worker/runtime/kinds/batch_lines.py), takes the line's share off (`LINE_RELEASE`), and the
batch's end (cancelled, finalized, failed) drops what is left.

Each entry also carries the time by which its job must have ended (its queue deadline, or the
response's or batch's lifetime, plus the longest run): admission drops entries past it, so a
release lost to a Redis hiccup or a killed process costs the key that much, never its access.
"""

from __future__ import annotations

from redis.client import Pipeline

from shared.queue.jobs import QueuedJob
from shared.queue.keys import Keys

# Appended to a batch line's record script (worker/runtime/kinds/batch_lines.py) after the answer
# was written (so once per line): KEYS[3], KEYS[4] the owner's entries and their deadlines,
# ARGV[6] the batch id, ARGV[7] the line's tokens. The entry goes once nothing is left of it.
LINE_RELEASE = """
if KEYS[3] and redis.call('HEXISTS', KEYS[3], ARGV[6]) == 1 then
  if redis.call('HINCRBY', KEYS[3], ARGV[6], -tonumber(ARGV[7])) <= 0 then
    redis.call('HDEL', KEYS[3], ARGV[6])
    redis.call('ZREM', KEYS[4], ARGV[6])
  end
end
"""


def hold_keys(keys: Keys, owner: str) -> list[str]:
    """The owner's entries (tokens) and their deadlines, in the order the scripts take them."""
    return [keys.queued_tokens(owner), keys.queued_until(owner)]


def release(pipe: Pipeline, keys: Keys, owner: str, entry: str) -> None:
    """Queue on `pipe` the release of a job's (or a whole batch's) hold; idempotent."""
    tokens, until = hold_keys(keys, owner)
    pipe.hdel(tokens, entry)
    pipe.zrem(until, entry)


def release_job(pipe: Pipeline, keys: Keys, job: QueuedJob) -> None:
    """Queue the release of an ended job's hold, if it holds one (a batch line's share is taken
    off its batch's entry when its answer is recorded, not here)."""
    if job.queued_tokens is None or job.owner is None:
        return
    if job.batch_line is not None:
        return
    release(pipe, keys, job.owner, job.job_id)
