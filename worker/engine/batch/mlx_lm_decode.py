"""The decode step, without the log-probabilities nobody asked for.

mlx-lm's generation batch turns every step's logits into log-probabilities for every sequence
(a logsumexp over the whole vocabulary, then one array per sequence) before sampling. mlxq
returns no logprobs, and its samplers (worker/engine/sequence/sampling.py) take raw logits: argmax
and
categorical sampling give the same tokens from logits, and top-p normalises for itself. On the
Linux CPU backend that normalisation is ~10% of a decode step (measured with the default
model: 95 -> 85.5 ms at 16 sequences, 151 -> 137 ms at 32), because MLX's CPU `exp` is scalar.

Logits processors (penalties, logit bias, a grammar's mask: worker/engine/sequence/processors.py,
worker/engine/sequence/grammar.py) run here on raw logits too, row by row for the sequences that
have any;
the
forward pass is started first, so a grammar's mask is computed while it runs. The other rows
are untouched. A sequence's first token is drawn by mlx-lm's own step when it joins the batch,
which calls the same processors and samplers.

`DecodeBatch` is mlx-lm's `GenerationBatch` with that one step replaced; `use_decode_batch`
makes a BatchGenerator grow its running batch from one. Everything else (KV caches, stop
sequences, joining and leaving the batch) stays mlx-lm's.
"""

from __future__ import annotations

from typing import Any, cast

import mlx.core as mx
from mlx_lm.generate import BatchGenerator, GenerationBatch


class DecodeBatch(GenerationBatch):  # type: ignore[misc]
    _next_tokens: mx.array
    _current_tokens: mx.array
    _next_logprobs: list[Any]
    _current_logprobs: list[Any]

    _token_context: list[Any]  # mlx-lm's per-sequence TokenBuffer: prompt and generated tokens

    def _step(self) -> tuple[list[int], list[Any]]:
        self._current_tokens = self._next_tokens
        inputs = self._current_tokens
        logits = self.model(inputs[:, None], cache=self.prompt_cache)[:, -1, :]
        if any(self.logits_processors):
            logits = self._process(inputs, logits)
        self._next_tokens = self._sample(logits)
        # The batch's bookkeeping indexes these lists by sequence: keep them, empty.
        self._current_logprobs = self._next_logprobs
        self._next_logprobs = [None] * len(self.uids)
        mx.async_eval(self._next_tokens)  # the next step computes while this one is read
        tokens = cast(list[int], inputs.tolist())  # a 1-d int array
        for seen, token in zip(self.tokens, tokens, strict=True):
            seen.append(token)
        return tokens, self._current_logprobs

    def _process(self, inputs: mx.array, logits: mx.array) -> mx.array:
        mx.async_eval(logits)  # the forward runs while the processors do their host-side work
        rows = []
        for e, processors in enumerate(self.logits_processors):
            row = logits[e : e + 1]
            if processors:
                context = self._token_context[e].update_and_fetch(inputs[e : e + 1])
                for processor in processors:
                    row = processor(context, row)
            rows.append(row)
        return mx.concatenate(rows, axis=0)

    def _sample(self, logits: mx.array) -> mx.array:
        samplers = [s or self.fallback_sampler for s in self.samplers or [None] * len(self.uids)]
        if all(s is samplers[0] for s in samplers):  # e.g. all greedy: one call
            sampled: mx.array = samplers[0](logits)
            return sampled
        rows = [s(logits[i : i + 1]) for i, s in enumerate(samplers)]
        return mx.concatenate(rows, axis=0)


def use_decode_batch(generator: BatchGenerator) -> None:
    """Make `generator` run its sequences in a DecodeBatch (call before inserting any)."""
    generator._generation_batch = DecodeBatch.empty(generator.model, generator.sampler)
