"""Long prompts in a slot batch of their own, both batches drawing on one KV budget.

A slot batch keeps one rectangle of KV per layer: rows x the longest row's positions
(worker/engine/batch/kv_rows.py). One 30,000-token conversation beside fourteen short chats
would make every short row as long as it, in memory (a KV budget then admits four rows, and the
short chats wait minutes for the long one to end) and in time (each decode step attends over
the whole rectangle). So a sequence whose prompt is longer than its share of the budget (the
budget over the rows) runs in a second slot batch, and the short
ones never share its rectangle. Each step runs both batches: two decode forwards while both
hold sequences (each reads the weights; the short batch's step is no longer than it was), and
the long batch prefills what the short one left of the step's prefill budget, so short prompts
start first and a long prompt still moves every step.

The budget is one (`KVShare`): before each call, each batch is told what the other leaves of it
(what the other holds or has promised its rows, whichever is more), so together they never pass
it, and either may use all of it while the other is empty.
"""

from __future__ import annotations

from dataclasses import replace

from worker.engine.batch.slot_batch import SlotBatch
from worker.engine.batch.types import Entry, PrefillBudget, Token

# The long batch's sequence ids start here, so a token's id says which batch it came from and
# passes through unchanged.
LONG_UIDS = 1 << 48
FLOOR = 16  # prompt tokens the long batch prefills a step at least (the policy's floor)


class SplitBatch:
    """A short and a long slot batch behind one batch's surface (TokenBatch)."""

    def __init__(self, short: SlotBatch, long: SlotBatch, kv_tokens: int, threshold: int):
        """`long` numbers its sequences from LONG_UIDS; `kv_tokens`: the budget both share;
        `threshold`: the prompt length (cached tokens included) past which a sequence runs in
        `long`."""
        self._short, self._long = short, long
        self._kv_tokens = kv_tokens
        self._threshold = threshold

    @property
    def decoding(self) -> bool:
        return self._short.decoding or self._long.decoding

    @property
    def prefill_rate(self) -> float | None:
        """The short batch's (most prompts are short), else the long one's."""
        return self._short.prefill_rate or self._long.prefill_rate

    @property
    def prefilled(self) -> int:
        return self._short.prefilled + self._long.prefilled

    def insert(self, entries: list[Entry]) -> list[int]:
        uids = []
        for entry in entries:
            long = len(entry.cached) + len(entry.prompt) > self._threshold
            batch = self._long if long else self._short
            self._share(batch)
            uids += batch.insert([entry])
        return uids

    def next(self, prefill_budget: PrefillBudget | None) -> list[Token]:
        self._share(self._short)
        out = self._short.next(prefill_budget)
        self._share(self._long)
        return out + self._long.next(self._left(prefill_budget))

    def remove(self, uids: list[int]) -> None:
        short = [u for u in uids if u < LONG_UIDS]
        long = [u for u in uids if u >= LONG_UIDS]
        for batch, gone in ((self._short, short), (self._long, long)):
            if gone:
                self._share(batch)
                batch.remove(gone)

    def _left(self, budget: PrefillBudget | None) -> PrefillBudget | None:
        """What the short batch's step left of the prefill budget (at least the floor, so a
        long prompt moves every step)."""
        if budget is None:
            return None
        tokens = max(budget.tokens - self._short.prefilled, min(budget.tokens, FLOOR))
        return replace(budget, tokens=tokens, partial=min(budget.partial, tokens))

    def _share(self, batch: SlotBatch) -> None:
        other = self._long if batch is self._short else self._short
        batch.limit_kv(self._kv_tokens - other.kv_held)
