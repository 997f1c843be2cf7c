"""Prompt work done before a job's choices enter the batch, a step's budget at a time.

Two kinds of prompt are computed here rather than in the batch's own prefill:
- a scored prompt (an echo that asks for logprobs): each token's logprob needs the logits of
  the position before it, which the batch's prefill never computes;
- the prompt that several choices of a job share (n > 1): its KV is computed once, then each
  choice enters with a copy of it.
Either is computed up to its last token, in forwards of at most CHUNK positions (SCORE_CHUNK
when scored: that many rows of vocabulary-wide logits at a time), taking from the step's
prefill budget what the batch's prefill would otherwise take
(worker/engine/generation/engine.py), so no prompt holds a step longer than the step's budget
allows, however long or many its prompts.
The cache is in the batch's KV form: the choices then enter the batch with it and only the
prompt's last token left, as after a prefix-cache hit, so a scored prompt is computed once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import mlx.core as mx

from shared.wire.generation.logprobs import TokenLogprob
from worker.engine.batch.quantized_kv import KVQuantization, prompt_cache
from worker.engine.batch.token_batch import PREFILL_CHUNK
from worker.engine.prefix_cache import Reuse
from worker.engine.prepare import PreparedJob
from worker.engine.sequence.logprobs import PromptScorer

CHUNK = PREFILL_CHUNK
SCORE_CHUNK = 256


@dataclass
class StagedPrompt:
    """Prompt `k` of `job` on its way to the batch: `done` holds the KV of its first
    `done.tokens` tokens (from the prefix cache, or computed here); `scorer` its logprobs so
    far, when it is scored (then computed from its first token)."""

    job: PreparedJob
    k: int
    done: Reuse
    scorer: PromptScorer | None = None

    @property
    def prompt(self) -> list[int]:
        return self.job.prompts[self.k]

    @property
    def left(self) -> int:
        """Positions still to compute: all but the last token, which the batch feeds."""
        return max(0, len(self.prompt) - 1 - self.done.tokens)

    @property
    def logprobs(self) -> list[TokenLogprob] | None:
        return None if self.scorer is None else self.scorer.entries

    def advance(self, model: Any, kv: KVQuantization | None, tokens: int) -> int:
        """Compute up to `tokens` more of its positions; how many it computed."""
        n = min(tokens, self.left)
        if n <= 0:
            return 0
        cache = self.done.cache if self.done.cache is not None else prompt_cache(model, kv)
        begin = self.done.tokens
        width = SCORE_CHUNK if self.scorer is not None else CHUNK
        for start in range(begin, begin + n, width):
            end = min(start + width, begin + n)
            logits = model(mx.array([self.prompt[start:end]]), cache=cache)
            if self.scorer is not None:
                self.scorer.add(logits[0])
            # Unscored, the logits are never evaluated: MLX computes only what is asked for.
            mx.eval([c.state for c in cache])
        self.done = Reuse(cache, begin + n, self.done.hits)
        return n
