"""What every token batch takes and gives: a sequence to run (`Entry`), what one step may prefill
(`PrefillBudget`) and one step's token of one sequence (`Token`). The slot batch and mlx-lm's
batch (worker/engine/batch/token_batch.py) both speak these."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mlx_lm.sample_utils import LogitsProcessor

from worker.engine.sequence.drafts import PromptLookup
from worker.engine.sequence.sampling import Sampler


@dataclass(frozen=True)
class Entry:
    """A sequence for the batch: `prompt` still to compute after `cached` (whose KV is in
    `cache`, or None), then up to `max_tokens` tokens."""

    prompt: list[int]
    cached: list[int]
    cache: list[Any] | None
    max_tokens: int
    sampler: Sampler
    processors: list[LogitsProcessor]
    # Set when it speculates (the slot batch only): its drafts' source.
    drafter: PromptLookup | None = None


@dataclass(frozen=True)
class PrefillBudget:
    """The prompt tokens one step may prefill: `tokens` in all, and of them at most `partial` in
    chunks of prompts that the step does not finish. A short prompt (at most `short` tokens)
    taken whole passes the partial cap while `tokens` lasts, so a burst of short prompts starts
    within a step or two while a long prompt still moves a chunk at a time
    (worker/engine/generation/engine.py sets them)."""

    tokens: int
    partial: int
    short: int

    @classmethod
    def flat(cls, tokens: int) -> PrefillBudget:
        return cls(tokens, tokens, tokens)

    @property
    def strict(self) -> int:
        """One number for a batch that does not tell whole prompts apart (mlx-lm's)."""
        return min(self.tokens, self.partial)


@dataclass(frozen=True)
class Token:
    uid: int
    token: int
    finish_reason: str | None
    # A sequence that ended on its own: the tokens whose KV `prompt_cache` holds.
    prompt_cache: list[Any] | None = None
    all_tokens: list[int] | None = None
