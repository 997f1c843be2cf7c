"""The lean decode step gives the tokens mlx-lm's own step gives."""

from __future__ import annotations

from typing import Any

import mlx.core as mx
from mlx_lm.generate import BatchGenerator

from shared.wire.generation.sampling import SamplingParams
from worker.engine.batch.mlx_lm_decode import use_decode_batch
from worker.engine.sequence.sampling import greedy, make_sampler

PROMPTS = [[1, 2, 3, 4, 5], [7, 8], [9, 10, 11, 12, 13, 14, 15], [3, 3, 3]]


def _generate(model: Any, lean: bool, samplers: list[Any]) -> dict[int, list[int]]:
    generator = BatchGenerator(model, completion_batch_size=8, prefill_batch_size=8)
    if lean:
        use_decode_batch(generator)
    # Staggered lengths: sequences leave the batch at different steps.
    uids = generator.insert(PROMPTS, max_tokens=[12, 5, 9, 16], samplers=samplers)
    tokens: dict[int, list[int]] = {uid: [] for uid in uids}
    while responses := generator.next_generated():
        for r in responses:
            tokens[r.uid].append(r.token)
    return tokens


def test_greedy_tokens_match_mlx_lm_for_sequences_that_leave_at_different_steps(
    model: Any,
) -> None:
    samplers = [greedy] * len(PROMPTS)
    assert _generate(model, True, samplers) == _generate(model, False, samplers)


def test_seeded_sampling_from_logits_draws_what_sampling_from_logprobs_draws(
    model: Any,
) -> None:
    def seeded() -> list[Any]:
        params = [SamplingParams(temperature=0.8, top_p=0.9, seed=i) for i in range(4)]
        return [make_sampler(p) for p in params]

    assert _generate(model, True, seeded()) == _generate(model, False, seeded())


def test_top_p_sampling_accepts_unnormalised_logits() -> None:
    logits = mx.array([[30.0, 29.0, -5.0, -6.0]]) + 60.0  # exp would overflow unnormalised
    sampler = make_sampler(SamplingParams(temperature=1.0, top_p=0.5, seed=3))
    assert sampler(logits).item() == 0
