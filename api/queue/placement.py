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
for any other. Either way no job waits for its worker longer than the prefill
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
    least = min(c.used_slots for c in candidates)
    crowded = best.free_slots <= 0 or best.used_slots - least > MAX_IMBALANCE
    if crowded and any(c.free_slots > 0 for c in candidates):
        return Choice(None, best.matched_tokens, "busy")
    return Choice(best.worker_id, best.matched_tokens, "placed")


class Placement:
    def __init__(self, redis: Redis, keys: Keys, wait_s: float, prefill_s_per_token: float) -> None:
        self._redis = redis
        self._keys = keys
        self._wait_s = wait_s
        self._prefill_s_per_token = prefill_s_per_token

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
        self._write(job, hashes, choice, now)
        return choice

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

    def _write(self, job: GenerationJob, hashes: list[str], choice: Choice, now: float) -> None:
        model, job_id = job.model, job.job_id
        pipe = self._redis.pipeline(transaction=False)
        pipe.hset(self._keys.job_blocks(model), job_id, ",".join(hashes))
        pipe.expire(self._keys.job_blocks(model), _HASH_TTL_S)
        if choice.worker_id is not None:
            saves_s = choice.matched_tokens * self._prefill_s_per_token
            not_after = now + min(self._wait_s, saves_s)
            record = f"{choice.worker_id}|{not_after:.3f}"
            pipe.hset(self._keys.placement(model), job_id, record)
            pipe.expire(self._keys.placement(model), _HASH_TTL_S)
        if choice.outcome == "busy":
            pipe.hincrby(self._keys.model_metrics(model), "placement_overridden_busy", 1)
        pipe.execute()

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
