"""The placement rule and the block hashes it matches on (api/queue/placement.py,
shared/queue/prefix/prefix_blocks.py): which worker a request is placed on, on made-up fleets
written into the session's real Redis and placed by the real script."""

from __future__ import annotations

import pytest
from redis import Redis

from api.queue.placement import MAX_IMBALANCE, Outcome, Placement
from shared.observe.fleet import WorkerStats
from shared.queue.jobs import GenerationJob
from shared.queue.keys import Keys
from shared.queue.prefix.prefix_blocks import BLOCK_TOKENS, block_hashes, matched_blocks

MODEL = "m"
PROMPT = list(range(8 * BLOCK_TOKENS))


def worker(redis: Redis, keys: Keys, name: str, slots: int, running: int, holds: int) -> None:
    """A live worker of `slots` slots running `running` jobs, holding the prompt's first
    `holds` blocks."""
    stats = WorkerStats(
        worker_id=name,
        host="h",
        model=MODEL,
        batch_size=slots,
        running={},
        tokens_per_s=0.0,
        generated_tokens=0,
        started_at=0.0,
    )
    redis.set(keys.worker_stats(name), stats.model_dump_json())
    if running:
        redis.rpush(keys.taking(name), *[f"{name}-job{i}" for i in range(running)])
    if holds:
        redis.sadd(keys.prefix_blocks(name), *block_hashes(PROMPT[: holds * BLOCK_TOKENS]))


def place(redis: Redis, keys: Keys, workers: set[str], i: int = 0) -> tuple[Outcome | None, str]:
    """Place one request for PROMPT; its outcome and the worker its record names ('' none)."""
    placement = Placement(redis, keys, wait_s=2.0, prefill_s_per_token=0.0044)
    job = GenerationJob(job_id=f"job{i}", model=MODEL, prompt="x", max_tokens=1)
    outcome = placement.place(job, PROMPT, workers)
    record = redis.hget(keys.placement(MODEL), job.job_id)
    return outcome, bytes(record).decode().split("|")[0] if record else ""  # type: ignore[arg-type]


def test_prompts_share_exactly_the_hashes_of_the_blocks_they_share() -> None:
    history = list(range(3 * BLOCK_TOKENS))
    later_turn = [*history, 7, 8, 9] * 2  # the same three blocks, then others
    other = [1, *history[1:]]  # differs in its first token
    assert block_hashes(later_turn)[:3] == block_hashes(history)
    assert len(block_hashes(history[:-1])) == 2  # a partial block is not named
    assert not set(block_hashes(other)) & set(block_hashes(history))


def test_the_leading_run_of_held_blocks_is_what_counts() -> None:
    assert matched_blocks([True, True, False, True]) == 2
    assert matched_blocks([False, True]) == 0


# Fleets, each worker as (name, slots, running, holds), and where the rule places the request.
FLEETS = [
    pytest.param(
        [("a", 4, 1, 2), ("b", 4, 3, 8), ("c", 4, 0, 0)],
        ("placed", "b"),
        id="a_request_goes_to_the_worker_holding_most_of_its_prefix_while_it_has_room",
    ),
    pytest.param(
        [("a", 4, 4, 8), ("b", 4, 4, 0)],
        ("placed", "a"),
        id="when_every_worker_is_full_the_request_waits_for_the_holder",
    ),
    pytest.param(
        [("a", 4, 1, 0), ("b", 8, 2, 0)],
        ("spread", "b"),
        id="a_prompt_no_worker_holds_goes_to_the_worker_with_most_free_slots",
    ),
    pytest.param(
        [("a", 2, 2, 0)],
        ("", ""),
        id="nothing_is_placed_when_no_worker_has_a_free_slot_and_none_holds_the_prompt",
    ),
]


@pytest.mark.parametrize(("fleet", "placed"), FLEETS)
def test_the_rule_places_a_request_on_a_fleet(
    redis: Redis, keys: Keys, fleet: list[tuple[str, int, int, int]], placed: tuple[str, str]
) -> None:
    for name, slots, running, holds in fleet:
        worker(redis, keys, name, slots, running, holds)
    assert place(redis, keys, {name for name, *_ in fleet}) == placed


def test_a_full_holder_leaves_the_request_to_the_least_loaded_worker(
    redis: Redis, keys: Keys
) -> None:
    worker(redis, keys, "a", slots=4, running=4, holds=8)
    worker(redis, keys, "b", slots=4, running=2, holds=0)
    worker(redis, keys, "c", slots=4, running=0, holds=0)
    assert place(redis, keys, {"a", "b", "c"}) == ("spread", "c")
    busy = redis.hget(keys.model_metrics(MODEL), "placement_overridden_busy")
    assert int(busy or 0) == 1  # type: ignore[arg-type]


def test_a_holder_far_busier_than_the_least_loaded_worker_is_not_followed(
    redis: Redis, keys: Keys
) -> None:
    worker(redis, keys, "a", slots=16, running=MAX_IMBALANCE + 1, holds=8)
    worker(redis, keys, "b", slots=16, running=0, holds=0)
    assert place(redis, keys, {"a", "b"}) == ("spread", "b")
    redis.lpop(keys.taking("a"))  # now MAX_IMBALANCE more than b: still followed
    redis.delete(keys.placement(MODEL))
    assert place(redis, keys, {"a", "b"}, i=1) == ("placed", "a")
