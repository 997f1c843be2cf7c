"""The prefill budget (worker/engine/batch/mlx_lm_prefill.py) on mlx-lm's own BatchGenerator and a
tiny
randomly initialised llama: which waiting prompts join a step's prefill."""

from __future__ import annotations

from typing import Any

from mlx_lm.generate import BatchGenerator

from worker.engine.batch.mlx_lm_prefill import size_prefill_group


def _generator(model: Any, prompts: list[int]) -> BatchGenerator:
    batch = BatchGenerator(model, completion_batch_size=32, prefill_batch_size=32)
    batch.insert([list(range(1, n + 1)) for n in prompts], max_tokens=[4] * len(prompts))
    return batch


def _step(batch: BatchGenerator, budget: int) -> int:
    """One step under `budget`; how many prompts were in prefill during it."""
    size_prefill_group(batch, budget)
    batch.next()
    return len(batch._prompt_batch)


def test_a_burst_is_prefilled_in_groups_that_fit_the_budget(model: Any) -> None:
    batch = _generator(model, [41] * 8)  # 40 tokens of prefill each, the last one decodes
    assert _step(batch, 100) == 2
    assert len(batch._unprocessed_sequences) == 6


def test_the_next_group_starts_while_the_last_one_moves_to_generation(model: Any) -> None:
    batch = _generator(model, [41] * 8)
    _step(batch, 100)
    _step(batch, 100)  # the first two generate from here; two more are prefilled
    assert len(batch._generation_batch) == 2
    assert len(batch._unprocessed_sequences) == 4


def test_a_prompt_longer_than_the_budget_is_still_taken_alone(model: Any) -> None:
    batch = _generator(model, [301, 11])
    assert _step(batch, 100) == 1
    assert len(batch._unprocessed_sequences) == 1


def test_a_budget_large_enough_takes_the_whole_burst_at_once(model: Any) -> None:
    batch = _generator(model, [41] * 8)
    assert _step(batch, 10_000) == 8
    assert not batch._unprocessed_sequences


def test_without_a_budget_the_whole_burst_joins_as_the_batch_allows(model: Any) -> None:
    batch = _generator(model, [301] * 8)
    size_prefill_group(batch, None)
    batch.next()
    assert len(batch._prompt_batch) == 8
