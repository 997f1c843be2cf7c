"""Placement of requests that arrive together (api/queue/placement.py, `_PLACE`), on the
session's real Redis: their reads all come before any of their writes, as when one API process
serves a burst concurrently, and the hot-spot rule still holds: the burst spreads."""

from __future__ import annotations

from collections import Counter

from redis import Redis

from api.queue.placement import MAX_IMBALANCE, Placement, holder
from shared.queue.jobs import GenerationJob
from shared.queue.keys import Keys
from shared.queue.prefix.prefix_blocks import block_hashes
from tests.api.test_placement_rule import MODEL, PROMPT, worker

SLOTS = 16


def job(i: int) -> GenerationJob:
    return GenerationJob(job_id=f"job{i}", model=MODEL, prompt="x", max_tokens=1)


def burst(redis: Redis, keys: Keys, workers: list[str], size: int) -> Counter[str]:
    """Place `size` requests for PROMPT, every read before any write; jobs per worker."""
    placement = Placement(redis, keys, wait_s=2.0, prefill_s_per_token=0.0044)
    hashes = block_hashes(PROMPT)
    reads = [placement._read(workers, hashes, None) for _ in range(size)]
    for i, (now, _, candidates) in enumerate(reads):
        placement._write(job(i), hashes, holder(candidates), candidates, None, now, now)
    records = redis.hvals(keys.placement(MODEL))
    return Counter(bytes(r).decode().split("|")[0] for r in records)  # type: ignore[union-attr]


def test_a_burst_on_one_shared_prompt_fills_the_holder_only_to_the_rule_and_spreads_the_rest(
    redis: Redis, keys: Keys
) -> None:
    worker(redis, keys, "holder", SLOTS, running=0, holds=8)
    worker(redis, keys, "idle", SLOTS, running=0, holds=0)
    placed = burst(redis, keys, ["holder", "idle"], 12)
    # Each job goes to the holder while it runs at most MAX_IMBALANCE more than the other.
    assert abs(placed["holder"] - placed["idle"]) <= MAX_IMBALANCE + 1
    assert placed["holder"] + placed["idle"] == 12
    assert placed["idle"] >= 12 // 2 - MAX_IMBALANCE
    # Every job's hashes are kept for its taker.
    assert redis.hlen(keys.job_blocks(MODEL)) == 12


def test_a_burst_of_new_conversations_spreads_over_the_workers(redis: Redis, keys: Keys) -> None:
    for name in ("a", "b", "c", "d"):
        worker(redis, keys, name, SLOTS, running=0, holds=0)
    placed = burst(redis, keys, ["a", "b", "c", "d"], 8)
    assert sorted(placed.values()) == [2, 2, 2, 2]


def test_a_burst_beyond_a_full_fleet_waits_for_the_holder(redis: Redis, keys: Keys) -> None:
    worker(redis, keys, "holder", SLOTS, running=0, holds=8)
    worker(redis, keys, "other", 2, running=0, holds=0)
    placed = burst(redis, keys, ["holder", "other"], SLOTS + 4)
    # "other" fills its two slots; once no slot is free anywhere, the holder gets the rest.
    assert placed == {"holder": SLOTS + 2, "other": 2}
