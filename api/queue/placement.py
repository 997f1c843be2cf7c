"""Prefix-aware placement: an interactive job goes to the worker whose cache holds its prefix.

Workers advertise the block hashes of what their prefix caches hold
(shared/queue/prefix/prefix_blocks.py, worker/runtime/prefix/prefix_report.py). At admission
(api/queue/admission.py), just before the enqueue, the API hashes the prompt's tokens, counted once
exactly as the worker renders them (api/queue/context_window.py), and finds among the live workers
it read the one holding most of the prompt's first tokens, its holder (`holder`). The job stays on
its model's one interactive queue, in its fair place; a placement record names the worker that may
take it first and until when (worker/runtime/intake/placed_take.py). Why this shape:
docs/architecture.md, "Placement".

The rule, applied by one script against the fleet as it is at that instant (`_PLACE`), so that
requests arriving together, read side by side by one API process or several, are placed one
after another and a burst spreads:
- The holder gets the job while it has a free slot and runs at most MAX_IMBALANCE more jobs than
  the least loaded other live worker (a worker's load: the jobs its slots hold, its
  `{ns}:taking:{worker}` list, exact where a heartbeat report is a beat old, plus the jobs placed
  on it and not yet taken). When no worker has a free slot it gets the job anyway, since waiting
  for it costs no more than waiting for any other.
- Otherwise (no holder, or the holder too busy) the job is placed on the live worker with the
  most free slots, for at most SPREAD_WAIT_S: any idle slot would take it without placement, and
  on a shared queue the idle slot that has waited longest is often one of the busiest worker's,
  so new conversations and the jobs a busy holder lets go would pile up on one worker.
No job waits for its holder longer than the prefill its cache would save (matched tokens x
`prefill_s_per_token`), capped at `placement_wait_s`; after that any worker takes it, so a dead
or wedged worker holds nothing up for long.

A request's `prompt_cache_key` is a hint (the job's `cache_hint`: a hash of it and the job's
server-derived cache scope, shared/queue/prefix/cache_scope.py), so one caller's key never
steers by, or reads, another's. Each placement of a hinted job writes the worker it chose to
`{ns}:hint:{model}:{hint}` (HINT_TTL_S, renewed by every placement); the next job with that hint
takes that worker as its holder while it is live, unless another worker holds more of the
prompt's first tokens: a longer real prefix wins, the hint breaks ties, and it names a holder
where no worker holds any block (a first turn shorter than a block, a changed system prompt).
A hinted holder is then held to the same rule as any other (full or far busier: spread), and
waits for at least HINT_WAIT_S; a dead one is not among the live workers, so it is ignored.
"""

from __future__ import annotations

from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import Any, Literal, cast

from redis import Redis

from shared.observe.fleet import WorkerStats
from shared.queue.jobs import GenerationJob
from shared.queue.keys import Keys
from shared.queue.prefix.prefix_blocks import block_hashes, matched_tokens

# Jobs the holder of a prefix may run beyond the least loaded worker and still be preferred
# (SGLang's router has the same kind of rule: its balance thresholds).
MAX_IMBALANCE = 4
# How long a job placed only to spread load waits for its worker: a free slot of that worker
# takes it at its next look (placed_take.py POLL_S), so this bounds a worker that just died.
SPREAD_WAIT_S = 0.5
Outcome = Literal["placed", "spread", ""]
# Placement hashes live this long after their last write; entries go when their job is taken.
_HASH_TTL_S = 86400
# A hint names its last worker this long after its last job (OpenAI keeps a prompt cache up to an
# hour in memory); by then that worker's prefix cache has likely moved on.
HINT_TTL_S = 3600
# How long a job waits for the worker its hint names when that worker holds none of its blocks:
# what the hint saves is unknown, so no longer than a spread job waits.
HINT_WAIT_S = SPREAD_WAIT_S

# KEYS: the model's job-blocks hash, its placement hash, its metrics hash, then each live
# worker's taking list, then the job's hint key if it has one. ARGV: job id, its block hashes,
# hash TTL (s), the holder ('' for none), the holder's "not after", the spread "not after",
# MAX_IMBALANCE, HINT_TTL_S, then per live worker (in the order of the taking lists) its id and
# its slots (0: no report yet, counted as full).
# Returns the module docstring's outcome: 'placed' (on the holder), 'spread' or ''; the hint key
# names the worker it placed the job on.
_PLACE = """
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('EXPIRE', KEYS[1], ARGV[3])
local holder, imbalance = ARGV[4], tonumber(ARGV[7])
local placed = {}
for _, record in ipairs(redis.call('HVALS', KEYS[2])) do
  local w = string.match(record, '^([^|]*)|')
  if w then placed[w] = (placed[w] or 0) + 1 end
end
local n, names, load, free, any_free = (#ARGV - 8) / 2, {}, {}, {}, false
for i = 1, n do
  names[i] = ARGV[7 + 2 * i]
  load[i] = redis.call('LLEN', KEYS[3 + i]) + (placed[names[i]] or 0)
  free[i] = tonumber(ARGV[8 + 2 * i]) - load[i]
  if free[i] > 0 then any_free = true end
end
local hint = KEYS[4 + n]
local function record(worker, not_after, kind)
  redis.call('HSET', KEYS[2], ARGV[1], worker .. '|' .. not_after .. kind)
  redis.call('EXPIRE', KEYS[2], ARGV[3])
  if hint then redis.call('SET', hint, worker, 'EX', ARGV[8]) end
end
for i = 1, n do
  if names[i] == holder then
    local least = nil
    for j = 1, n do
      if j ~= i and (least == nil or load[j] < least) then least = load[j] end
    end
    local room = free[i] > 0 and (least == nil or load[i] <= least + imbalance)
    if room or not any_free then
      record(holder, ARGV[5], '')
      return 'placed'
    end
    redis.call('HINCRBY', KEYS[3], 'placement_overridden_busy', 1)
  end
end
local best = 0
for i = 1, n do
  if free[i] > 0 and (best == 0 or free[i] > free[best]) then best = i end
end
if best == 0 then return '' end
record(names[best], ARGV[6], '|spread')
return 'spread'
"""


@dataclass(frozen=True)
class Candidate:
    """A live worker as placement sees it."""

    worker_id: str
    matched_tokens: int  # of the prompt's first tokens, held in its cache
    slots: int  # 0 until its first report


def holder(candidates: list[Candidate], hinted: str | None = None) -> Candidate | None:
    """The worker holding most of the prompt's first tokens; among equals the one the job's
    hint names (`hinted`, even where none holds any), then the one with most slots."""
    best = max(
        candidates, key=lambda c: (c.matched_tokens, c.worker_id == hinted, c.slots), default=None
    )
    if best is None or (best.matched_tokens == 0 and best.worker_id != hinted):
        return None
    return best


class Placement:
    def __init__(self, redis: Redis, keys: Keys, wait_s: float, prefill_s_per_token: float) -> None:
        self._redis = redis
        self._keys = keys
        self._wait_s = wait_s
        self._prefill_s_per_token = prefill_s_per_token
        self._place = redis.register_script(_PLACE)

    @property
    def enabled(self) -> bool:
        return self._wait_s > 0

    def place(
        self, job: GenerationJob, tokens: list[int], workers: AbstractSet[str]
    ) -> Outcome | None:
        """Read `workers` for the job's prompt and write its placement record (before the job
        is queued, so that no worker can take it unplaced). None: nothing to place on."""
        hashes = block_hashes(tokens, scope=job.cache_scope)
        if not (hashes or job.cache_hint) or not workers or job.lane != "interactive":
            return None
        hint = self._keys.cache_hint(job.model, job.cache_hint) if job.cache_hint else None
        now, hinted, candidates = self._read(sorted(workers), hashes, hint)
        found = holder(candidates, hinted)
        # What a hinted holder's cache saves is unknown where it holds no block: wait a little.
        floor_s = HINT_WAIT_S if found is not None and found.worker_id == hinted else 0.0
        return self._write(job, hashes, found, candidates, hint, now + floor_s, now)

    def _read(
        self, workers: list[str], hashes: list[str], hint: str | None
    ) -> tuple[float, str | None, list[Candidate]]:
        """The time, the worker `hint` names (None: no hint, or it expired) and the candidates."""
        pipe = self._redis.pipeline(transaction=False)
        pipe.time()
        # Placeholders (echo) keep the rows in step where there is no hint or no full block.
        if hint:
            pipe.get(hint)
        else:
            pipe.echo("")
        for worker in workers:
            if hashes:
                pipe.smismember(self._keys.prefix_blocks(worker), hashes)
            else:
                pipe.echo("")
            pipe.get(self._keys.worker_stats(worker))
        (seconds, micros), hinted, *rows = pipe.execute()
        candidates = [
            _candidate(worker, held or [], report)
            for worker, held, report in zip(workers, rows[::2], rows[1::2], strict=True)
        ]
        named = bytes(hinted).decode() if hinted else None
        return seconds + micros / 1e6, named, candidates

    def _write(
        self,
        job: GenerationJob,
        hashes: list[str],
        found: Candidate | None,
        candidates: list[Candidate],
        hint: str | None,
        floor: float,
        now: float,
    ) -> Outcome:
        """Write the job's hashes and its record by the module docstring's rule (`_PLACE`); the
        holder may take it alone until at least `floor` (unix s)."""
        saves_s = found.matched_tokens * self._prefill_s_per_token if found else 0.0
        model = job.model
        keys = [self._keys.job_blocks(model), self._keys.placement(model)]
        keys += [self._keys.model_metrics(model)]
        keys += [self._keys.taking(c.worker_id) for c in candidates]
        keys += [hint] if hint else []
        args: list[str | int] = [job.job_id, ",".join(hashes), _HASH_TTL_S]
        not_after = max(floor, now + saves_s) if found else now
        args += [found.worker_id if found else "", f"{min(now + self._wait_s, not_after):.3f}"]
        args += [f"{now + min(self._wait_s, SPREAD_WAIT_S):.3f}", MAX_IMBALANCE, HINT_TTL_S]
        for c in candidates:
            args += [c.worker_id, c.slots]
        outcome = bytes(self._place(keys=keys, args=args)).decode()
        return cast(Outcome, outcome)

    def forget(self, pipe: Any, job_id: str, model: str) -> None:
        """Queue on `pipe` the removal of a withdrawn job's records."""
        pipe.hdel(self._keys.placement(model), job_id)
        pipe.hdel(self._keys.job_blocks(model), job_id)


def _candidate(worker: str, held: list[Any], report: bytes | None) -> Candidate:
    matched = matched_tokens(held)
    slots = 0 if report is None else WorkerStats.model_validate_json(report).batch_size
    return Candidate(worker, matched, slots)
