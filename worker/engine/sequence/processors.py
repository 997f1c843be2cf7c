"""Logits processors for the sampling parameters that change the distribution itself.

Each is mlx-lm's `LogitsProcessor` shape, `(tokens so far, logits row) -> logits row`, called
once per generated token for the sequence that asked (worker/engine/batch/mlx_lm_decode.py); a
sequence that
asked
for none of this has no processor and pays nothing. The first call of each sequence sees exactly
its prompt: what comes after it is what the sequence generated.

- `Penalties`: OpenAI's presence and frequency penalties over the generated tokens (as vLLM and
  OpenAI count them: the prompt is not penalised) and vLLM's repetition penalty over prompt and
  generated tokens (divide positive logits, multiply negative ones).
- `LogitBias`: OpenAI's logit_bias, added to the logits.
"""

from __future__ import annotations

from typing import cast

import mlx.core as mx
from mlx_lm.sample_utils import LogitsProcessor

from shared.wire.generation.sampling import SamplingParams


class Penalties:
    def __init__(self, presence: float, frequency: float, repetition: float):
        self._presence = presence
        self._frequency = frequency
        self._repetition = repetition
        self._seen = -1  # how many tokens of the context have been counted; -1 before any
        self._counts: dict[int, int] = {}  # generated token -> times
        self._prompt: set[int] = set()

    def __call__(self, context: mx.array, logits: mx.array) -> mx.array:
        self._count(context)
        if self._counts and (self._presence or self._frequency):
            ids = mx.array(list(self._counts))
            amount = [self._presence + self._frequency * n for n in self._counts.values()]
            logits = logits.at[:, ids].add(-mx.array(amount, dtype=logits.dtype))
        if self._repetition != 1.0:
            ids = mx.array(sorted(self._prompt.union(self._counts)))
            chosen = logits[:, ids]
            penalised = mx.where(chosen > 0, chosen / self._repetition, chosen * self._repetition)
            logits[:, ids] = penalised
        return logits

    def _count(self, context: mx.array) -> None:
        if self._seen < 0:
            if self._repetition != 1.0:
                self._prompt = set(cast(list[int], context.tolist()))
        else:
            for token in cast(list[int], context[self._seen :].tolist()):
                self._counts[token] = self._counts.get(token, 0) + 1
        self._seen = context.size


class LogitBias:
    def __init__(self, bias: dict[int, float]):
        self._ids = mx.array(list(bias))
        self._values = mx.array(list(bias.values()))

    def __call__(self, context: mx.array, logits: mx.array) -> mx.array:
        return logits.at[:, self._ids].add(self._values.astype(logits.dtype))


def processors_for(params: SamplingParams) -> list[LogitsProcessor]:
    """The processors a job's sampling parameters need (none for most jobs)."""
    found: list[LogitsProcessor] = []
    if params.presence_penalty or params.frequency_penalty or params.repetition_penalty != 1.0:
        found.append(
            Penalties(params.presence_penalty, params.frequency_penalty, params.repetition_penalty)
        )
    if params.logit_bias:
        found.append(LogitBias(params.logit_bias))
    return found
