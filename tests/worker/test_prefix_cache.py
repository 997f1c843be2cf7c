"""The prefix cache's rules, on a tiny randomly initialised llama (no weights to load)."""

from __future__ import annotations

from typing import Any

import mlx.core as mx
from mlx_lm.models.cache import make_prompt_cache

from shared.queue.prefix.cache_scope import UNSCOPED
from worker.engine.prefix_cache import (
    MAX_LEVELLING_TOKENS,
    MIN_SHARED_TOKENS,
    PrefixCache,
    Reuse,
    level,
)


def _finished(model: Any, tokens: list[int]) -> list[Any]:
    cache = make_prompt_cache(model)
    model(mx.array([tokens]), cache=cache)
    return cache


def test_an_unseen_prompt_starts_from_nothing(model: Any) -> None:
    reuse = PrefixCache(model, 8, 1 << 30).reuse(list(range(10)), shared=0, scope=UNSCOPED)
    assert (reuse.cache, reuse.tokens, reuse.hits) == (None, 0, 0)


def test_a_finished_sequence_serves_the_prompts_that_extend_it(model: Any) -> None:
    prefixes = PrefixCache(model, 8, 1 << 30)
    prefixes.store(list(range(12)), _finished(model, list(range(12))), UNSCOPED)
    reuse = prefixes.reuse([*range(12), 50, 51], shared=0, scope=UNSCOPED)
    assert reuse.tokens == reuse.hits == 12
    assert reuse.cache is not None and reuse.cache[0].offset == 12


def test_a_fully_cached_prompt_still_leaves_its_last_token_to_compute(model: Any) -> None:
    prefixes = PrefixCache(model, 8, 1 << 30)
    prefixes.store(list(range(20)), _finished(model, list(range(20))), UNSCOPED)
    reuse = prefixes.reuse(list(range(20)), shared=0, scope=UNSCOPED)
    assert reuse.tokens == reuse.hits == 19


def test_a_long_enough_history_is_prefilled_once_and_then_shared(model: Any) -> None:
    prefixes = PrefixCache(model, 8, 1 << 30)
    history = list(range(MIN_SHARED_TOKENS + 4))
    first = prefixes.reuse([*history, 70, 71], shared=len(history), scope=UNSCOPED)
    second = prefixes.reuse([*history, 80], shared=len(history), scope=UNSCOPED)
    assert (first.tokens, first.hits) == (len(history), 0)  # computed now, not a cache hit
    assert (second.tokens, second.hits) == (len(history), len(history))


def test_a_short_history_is_left_to_the_batch(model: Any) -> None:
    prefixes = PrefixCache(model, 8, 1 << 30)
    history = list(range(MIN_SHARED_TOKENS - 1))
    assert prefixes.reuse([*history, 70], shared=len(history), scope=UNSCOPED).tokens == 0


def _reuse_of(model: Any, tokens: int) -> Reuse:
    return Reuse(_finished(model, list(range(tokens))), tokens, tokens)


def test_prompts_admitted_together_are_levelled_to_equal_lengths_left(model: Any) -> None:
    prompts = [list(range(40)), list(range(42)), list(range(43))]
    reuses = [_reuse_of(model, 30), _reuse_of(model, 30), _reuse_of(model, 30)]
    levelled = level(prompts, reuses)
    assert [len(p) - r.tokens for p, r in zip(prompts, levelled, strict=True)] == [13, 13, 13]
    assert [r.cache[0].offset for r in levelled if r.cache] == [27, 29, 30]
    assert [r.hits for r in levelled] == [27, 29, 30]


def test_levelling_never_recomputes_more_than_its_limit(model: Any) -> None:
    prompts = [list(range(20)), list(range(20 + MAX_LEVELLING_TOKENS + 1))]
    reuses = [_reuse_of(model, 19), Reuse(None, 0, 0)]
    assert level(prompts, reuses) == reuses
