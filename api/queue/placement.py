"""Prefix-aware placement: an interactive job goes to the worker whose cache holds its prefix.

Workers advertise the block hashes of what their prefix caches hold (shared/queue/prefix_blocks.py,
worker/runtime/prefix_report.py). At enqueue the API hashes the prompt's tokens, counted exactly as
the worker renders them (api/queue/context_window.py), and scores each live worker by the prompt
tokens it holds from the first (`choose`). The job stays on its model's one interactive queue, in
its fair place; a placement record names the worker that may take it first and until when
(worker/runtime/placed_take.py). Why this shape: README, Architecture, "Placement".

The hot-spot rule: affinity is followed only while the worker holding the prefix has a free slot
and runs at most MAX_IMBALANCE more jobs than the least loaded live worker (the jobs its slots
hold now, its `{ns}:taking:{worker}` list, which is exact where a report is a heartbeat old, plus
the jobs already placed on it and not yet taken). Otherwise, when another worker
has a free slot, the job is not placed: any free slot takes it, as without placement. When no
worker has one, the job is placed on the holder, since waiting for it costs no more than waiting
for any other. The record is written by a script that counts the holder's jobs again
(`_PLACE`): requests that arrive together are read side by side (one API process serves them
concurrently, and several processes may), so each would see the holder as it was before any of
them was placed; the script places each only while the holder still has room by the rule, and
leaves the rest to any worker. Either way no job waits for its worker longer than the prefill
its cache would save (matched tokens x `prefill_s_per_token`), capped at `placement_wait_s`; after
that any worker takes it, so a dead or wedged worker holds nothing up for long.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any, Literal

from redis import Redis

from shared.observe.fleet import WorkerStats
from shared.queue.jobs import GenerationJob
from shared.queue.keys import Keys
from shared.queue.prefix_blocks import BLOCK_TOKENS, block_hashes, matched_blocks

# Jobs the holder of a prefix may run beyond the least loaded worker and still be preferred
# (SGLang's router has the same kind of rule: its balance thresholds).
MAX_IMBALANCE = 4
Outcome = Literal["placed", "busy", "cold"]
# Placement hashes live this long after their last write; entries go when their job is taken.
_HASH_TTL_S = 86400

# KEYS: the model's job-blocks hash, its placement hash, its metrics hash, the chosen worker's
# taking list. ARGV: job id, its block hashes, hash TTL (s), the chosen worker ('' for none), its
# record, the most jobs that worker may hold for the choice to stand (-1: no bound), 1 when the
# holder was already found busy. Returns 1 when the job was placed.
_PLACE = """
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('EXPIRE', KEYS[1], ARGV[3])
local worker, limit, busy = ARGV[4], tonumber(ARGV[6]), ARGV[7] == '1'
if worker ~= '' and limit >= 0 then
  local held = redis.call('LLEN', KEYS[4])
  local prefix = worker .. '|'
  for _, record in ipairs(redis.call('HVALS', KEYS[2])) do
    if string.sub(record, 1, #prefix) == prefix then held = held + 1 end
  end
  if held > limit then worker, busy = '', true end
end
if worker ~= '' then
  redis.call('HSET', KEYS[2], ARGV[1], ARGV[5])
  redis.call('EXPIRE', KEYS[2], ARGV[3])
  return 1
end
if busy then redis.call('HINCRBY', KEYS[3], 'placement_overridden_busy', 1) end
return 0
"""


@dataclass(frozen=True)
class Candidate:
    """A live worker as placement sees it."""

    worker_id: str
    matched_tokens: int  # of the prompt's first tokens, held in its cache
    free_slots: int
    used_slots: int  # running, or placed on it and not yet taken


@dataclass(frozen=True)
class Choice:
    worker_id: str | None  # None: any worker
    matched_tokens: int
    outcome: Outcome  # placed on the holder; holder busy (left to any); no holder (cold)


def choose(candidates: list[Candidate]) -> Choice:
    """The module docstring's rule, on the fleet as read at enqueue."""
    if not candidates:
        return Choice(None, 0, "cold")
    best = max(candidates, key=lambda c: (c.matched_tokens, c.free_slots))
    if best.matched_tokens == 0:
        return Choice(None, 0, "cold")
    if hold_limit(best, candidates) < best.used_slots and any(c.free_slots > 0 for c in candidates):
        return Choice(None, best.matched_tokens, "busy")
    return Choice(best.worker_id, best.matched_tokens, "placed")


def hold_limit(holder: Candidate, candidates: list[Candidate]) -> int:
    """The most jobs the holder may run (or have placed on it) and still get one more: less
    than its slots, and at most MAX_IMBALANCE more than the least loaded other live worker
    (the holder itself being the least loaded is no imbalance, however many it runs)."""
    slots = holder.free_slots + holder.used_slots
    others = [c.used_slots for c in candidates if c.worker_id != holder.worker_id]
    return min(slots - 1, min(others) + MAX_IMBALANCE) if others else slots - 1


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

    def place(self, job: GenerationJob, tokens: list[int], workers: set[str]) -> Choice | None:
        """Score `workers` for the job's prompt and write its placement record (before the job
        is queued, so that no worker can take it unplaced). None: nothing to place on."""
        hashes = block_hashes(tokens)
        if not hashes or not workers or job.lane != "interactive":
            return None
        ordered = sorted(workers)
        now, candidates = self._read(job.model, ordered, hashes)
        choice = choose(candidates)
        holder = next((c for c in candidates if c.worker_id == choice.worker_id), None)
        # The bound stands where the holder had room; placed on a full fleet, it has none.
        limit = -1 if holder is None or holder.free_slots <= 0 else hold_limit(holder, candidates)
        if self._write(job, hashes, choice, now, limit):
            return choice
        return Choice(None, choice.matched_tokens, "busy" if choice.matched_tokens else "cold")

    def _read(
        self, model: str, workers: list[str], hashes: list[str]
    ) -> tuple[float, list[Candidate]]:
        pipe = self._redis.pipeline(transaction=False)
        pipe.time()
        pipe.hvals(self._keys.placement(model))
        for worker in workers:
            pipe.smismember(self._keys.prefix_blocks(worker), hashes)
            pipe.get(self._keys.worker_stats(worker))
            pipe.llen(self._keys.taking(worker))
        (seconds, micros), records, *rows = pipe.execute()
        placed = Counter(bytes(r).decode().split("|", 1)[0] for r in records)
        candidates = [
            _candidate(worker, held, report, taking + placed[worker])
            for worker, held, report, taking in zip(
                workers, rows[::3], rows[1::3], rows[2::3], strict=True
            )
        ]
        return seconds + micros / 1e6, candidates

    def _write(
        self, job: GenerationJob, hashes: list[str], choice: Choice, now: float, limit: int
    ) -> bool:
        """Write the job's hashes and, if the holder still has room (`_PLACE`), its record;
        whether it was placed."""
        model, worker = job.model, choice.worker_id or ""
        saves_s = choice.matched_tokens * self._prefill_s_per_token
        record = f"{worker}|{now + min(self._wait_s, saves_s):.3f}"
        keys = [self._keys.job_blocks(model), self._keys.placement(model)]
        keys += [self._keys.model_metrics(model), self._keys.taking(worker)]
        busy = "1" if choice.outcome == "busy" else "0"
        args: list[str | int] = [job.job_id, ",".join(hashes), _HASH_TTL_S, worker, record]
        args += [limit, busy]
        return bool(self._place(keys=keys, args=args))

    def forget(self, pipe: Any, job_id: str, model: str) -> None:
        """Queue on `pipe` the removal of a withdrawn job's records."""
        pipe.hdel(self._keys.placement(model), job_id)
        pipe.hdel(self._keys.job_blocks(model), job_id)


def _candidate(worker: str, held: list[Any], report: bytes | None, used: int) -> Candidate:
    """`used`: the jobs the worker's slots hold, plus those placed on it and not yet taken."""
    matched = matched_blocks([bool(m) for m in held]) * BLOCK_TOKENS
    if report is None:  # no report yet: count it as full, so it gets only what it holds
        return Candidate(worker, matched, 0, used)
    slots = WorkerStats.model_validate_json(report).batch_size
    return Candidate(worker, matched, slots - used, used)
