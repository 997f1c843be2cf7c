"""`prompt_cache_key` as a placement hint (api/queue/placement.py): a job with a hint goes to the
worker its hint's last job was placed on, on made-up fleets written into the session's real Redis
and placed by the real script; the hint is scoped by the caller's cache scope."""

from __future__ import annotations

from redis import Redis

from api.queue.placement import HINT_TTL_S, Outcome, Placement
from shared.queue.jobs import GenerationJob, job_for
from shared.queue.keys import Keys
from shared.queue.prefix.cache_scope import hint
from shared.queue.prefix.prefix_blocks import BLOCK_TOKENS
from shared.wire.chat.completions import ChatCompletionRequest
from tests.api.test_placement_rule import MODEL, PROMPT, worker

SHORT = list(range(BLOCK_TOKENS - 1))  # a first turn shorter than one block: no hashes at all


def place(
    redis: Redis, keys: Keys, workers: set[str], key: str | None, i: int, tokens: list[int]
) -> tuple[Outcome | None, str]:
    """Place job `i` with the hint of `key` (scope "a1"); its outcome and its record's worker."""
    placement = Placement(redis, keys, wait_s=2.0, prefill_s_per_token=0.0044)
    job = GenerationJob(
        job_id=f"job{i}", model=MODEL, prompt="x", max_tokens=1, cache_hint=hint("a1", key)
    )
    outcome = placement.place(job, tokens, workers)
    record = redis.hget(keys.placement(MODEL), job.job_id)
    return outcome, bytes(record).decode().split("|")[0] if record else ""  # type: ignore[arg-type]


def named(redis: Redis, keys: Keys, key: str, scope: str = "a1") -> str | None:
    found = redis.get(keys.cache_hint(MODEL, hint(scope, key) or ""))
    return bytes(found).decode() if found else None  # type: ignore[arg-type]


def test_a_hinted_job_goes_where_its_hints_last_job_went_though_no_block_matches(
    redis: Redis, keys: Keys
) -> None:
    worker(redis, keys, "a", slots=4, running=0, holds=0)
    worker(redis, keys, "b", slots=8, running=0, holds=0)
    assert place(redis, keys, {"a", "b"}, "s1", 0, SHORT) == ("spread", "b")
    assert named(redis, keys, "s1") == "b"
    redis.rpush(keys.taking("b"), "job0")  # taken; "a" now has as many free slots as "b"
    redis.hdel(keys.placement(MODEL), "job0")
    worker(redis, keys, "a", slots=8, running=0, holds=0)
    assert place(redis, keys, {"a", "b"}, "s1", 1, SHORT) == ("placed", "b")
    assert 0 < redis.ttl(keys.cache_hint(MODEL, hint("a1", "s1") or "")) <= HINT_TTL_S


def test_a_longer_real_prefix_elsewhere_wins_over_the_hint(redis: Redis, keys: Keys) -> None:
    worker(redis, keys, "a", slots=4, running=0, holds=8)
    worker(redis, keys, "b", slots=4, running=0, holds=2)
    redis.set(keys.cache_hint(MODEL, hint("a1", "s1") or ""), "b")
    assert place(redis, keys, {"a", "b"}, "s1", 0, PROMPT) == ("placed", "a")
    assert named(redis, keys, "s1") == "a"  # the hint follows the job


def test_the_hint_breaks_a_tie_between_equal_prefixes(redis: Redis, keys: Keys) -> None:
    worker(redis, keys, "a", slots=8, running=0, holds=3)
    worker(redis, keys, "b", slots=4, running=0, holds=3)
    assert place(redis, keys, {"a", "b"}, None, 0, PROMPT) == ("placed", "a")  # most slots
    redis.set(keys.cache_hint(MODEL, hint("a1", "s1") or ""), "b")
    assert place(redis, keys, {"a", "b"}, "s1", 1, PROMPT) == ("placed", "b")


def test_a_hint_naming_a_dead_or_full_worker_falls_back_to_normal_placement(
    redis: Redis, keys: Keys
) -> None:
    worker(redis, keys, "a", slots=4, running=4, holds=0)
    worker(redis, keys, "b", slots=4, running=1, holds=0)
    redis.set(keys.cache_hint(MODEL, hint("a1", "s1") or ""), "a")
    assert place(redis, keys, {"a", "b"}, "s1", 0, SHORT) == ("spread", "b")  # "a" is full
    assert named(redis, keys, "s1") == "b"
    redis.set(keys.cache_hint(MODEL, hint("a1", "s1") or ""), "gone")  # no longer live
    assert place(redis, keys, {"a", "b"}, "s1", 1, SHORT) == ("spread", "b")


def test_another_scopes_identical_key_neither_follows_nor_moves_the_hint(
    redis: Redis, keys: Keys
) -> None:
    assert hint("a1", "s1") != hint("b2", "s1")
    worker(redis, keys, "a", slots=4, running=0, holds=0)
    worker(redis, keys, "b", slots=8, running=0, holds=0)
    redis.set(keys.cache_hint(MODEL, hint("b2", "s1") or ""), "a")  # the other caller's choice
    assert place(redis, keys, {"a", "b"}, "s1", 0, SHORT) == ("spread", "b")
    assert named(redis, keys, "s1", scope="b2") == "a"


def test_a_jobs_hint_comes_from_its_prompt_cache_key_under_its_scope() -> None:
    req = ChatCompletionRequest.model_validate(
        {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "prompt_cache_key": "k"}
    )
    assert job_for("j", req, scope="a1").cache_hint == hint("a1", "k")
    assert job_for("j", req, scope="b2").cache_hint != job_for("j", req, scope="a1").cache_hint
    plain = req.model_copy(update={"prompt_cache_key": None})
    assert job_for("j", plain, scope="a1").cache_hint is None
