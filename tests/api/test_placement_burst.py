"""Placement of requests that arrive together (api/queue/placement.py, `_PLACE`), on the
session's real Redis: their reads all come before any of their writes, as when one API process
serves a burst concurrently, and the hot-spot rule still holds."""

from __future__ import annotations

import secrets
from collections.abc import Iterator

import pytest
from redis import Redis

from api.queue.placement import MAX_IMBALANCE, Placement, choose, hold_limit
from shared.observe.fleet import WorkerStats
from shared.queue.jobs import GenerationJob
from shared.queue.keys import Keys
from shared.queue.prefix_blocks import BLOCK_TOKENS, block_hashes
from tests.support import flush_namespace

MODEL = "m"
SLOTS = 16
PROMPT = list(range(4 * BLOCK_TOKENS))


@pytest.fixture
def keys(redis: Redis) -> Iterator[Keys]:
    keys = Keys(f"burst{secrets.token_hex(4)}")
    yield keys
    flush_namespace(redis, keys.ns)


def worker(redis: Redis, keys: Keys, worker_id: str, holds: list[int]) -> None:
    stats = WorkerStats(
        worker_id=worker_id,
        host="h",
        model=MODEL,
        batch_size=SLOTS,
        running={},
        tokens_per_s=0.0,
        generated_tokens=0,
        started_at=0.0,
    )
    redis.set(keys.worker_stats(worker_id), stats.model_dump_json())
    if holds:
        redis.sadd(keys.prefix_blocks(worker_id), *block_hashes(holds))


def job(i: int) -> GenerationJob:
    return GenerationJob(job_id=f"job{i}", model=MODEL, prompt="x", max_tokens=1)


def test_a_burst_read_side_by_side_places_no_more_on_the_holder_than_the_rule_allows(
    redis: Redis, keys: Keys
) -> None:
    worker(redis, keys, "holder", PROMPT)
    worker(redis, keys, "idle", [])
    placement = Placement(redis, keys, wait_s=2.0, prefill_s_per_token=0.0044)
    burst = [job(i) for i in range(12)]
    hashes = block_hashes(PROMPT)
    # Every request reads the fleet before any is written: each sees an empty holder.
    reads = [placement._read(MODEL, ["holder", "idle"], hashes) for _ in burst]
    assert all(choose(candidates).worker_id == "holder" for _, candidates in reads)
    placed = [
        placement._write(j, hashes, choose(cs), now, limit=hold_limit(cs[0], cs))
        for j, (now, cs) in zip(burst, reads, strict=True)
    ]
    assert placed.count(True) == MAX_IMBALANCE + 1
    records = redis.hvals(keys.placement(MODEL))
    assert len(records) == MAX_IMBALANCE + 1  # type: ignore[arg-type]
    busy = redis.hget(keys.model_metrics(MODEL), "placement_overridden_busy")
    assert int(busy or 0) == len(burst) - MAX_IMBALANCE - 1  # type: ignore[arg-type]
    # Every job's hashes are kept for its taker, placed or not.
    assert redis.hlen(keys.job_blocks(MODEL)) == len(burst)


def test_a_burst_on_a_one_worker_fleet_is_placed_up_to_its_slots(redis: Redis, keys: Keys) -> None:
    worker(redis, keys, "only", PROMPT)
    placement = Placement(redis, keys, wait_s=2.0, prefill_s_per_token=0.0044)
    hashes = block_hashes(PROMPT)
    reads = [placement._read(MODEL, ["only"], hashes) for _ in range(SLOTS + 2)]
    placed = [
        placement._write(job(i), hashes, choose(cs), now, limit=hold_limit(cs[0], cs))
        for i, (now, cs) in enumerate(reads)
    ]
    assert placed.count(True) == SLOTS
