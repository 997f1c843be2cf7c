"""Speculation in the slot batch: when a step verifies drafts, each row's draft, and the check of
a row's draft (sample and match, with the sequence's own processors and sampler).

A step verifies only with few decoding rows, one of them hoping for a draft (`speculates`), and
not after a long prefill (LONG_PREFILL). The slot batch (worker/engine/batch/slot_batch.py)
scores a row's next input and its draft in one forward (a logits row per position: position j
follows the sequence and the draft's first j tokens). Here each position is drawn as a plain
decode step would draw it: its logits through the sequence's logits processors (penalties, logit
bias, a grammar), given the sequence as it is at that position, then its sampler. A drafted
token is kept while it equals the draw; the first draw that differs is kept in its place and
ends the check. A position is drawn only once every token before it is kept, so each processor
and sampler (a seeded one's key, a logprob recorder's queue) is called exactly as often, and with
exactly the contexts, as without speculation: the output is the same at any temperature. Greedy
rows without processors take one argmax over their positions. The batch then keeps the KV of
the inputs that led to a kept token: the row's offset moves back over the rejected positions.
"""

from __future__ import annotations

from typing import cast

import mlx.core as mx

from worker.engine.batch.slot_rows import Row
from worker.engine.batch.types import Entry
from worker.engine.sequence.sampling import greedy

# A step that prefilled this many prompt tokens verifies no draft: it is compute-bound, and a
# draft's read of the last tokens before the forward (no overlap) would hold back the rows'
# next tokens behind the prefill. A prompt's own first step (a few tokens left of its chunks,
# or a short prompt) still speculates: that is where a prediction's first draft is checked.
LONG_PREFILL = 256


def speculates(rows: list[Row]) -> bool:
    """Whether this step may verify drafts: few rows, one of them hoping for a draft."""
    for r in rows:  # every step: no allocation, and nothing past a row without a drafter
        drafter = r.entry.drafter
        if drafter is not None and drafter.hopeful(len(r.tokens) + (r.source is not None)):
            return len(rows) <= drafter.settings.rows
    return False


def drafts(rows: list[Row], room: int) -> list[list[int]]:
    """Each row's draft, within its token limit and the positions a row may reach (`room`)."""
    left = room - max(r.offset for r in rows) - 1
    out: list[list[int]] = []
    for row in rows:
        drafter = row.entry.drafter
        if drafter is None:
            out.append([])
            continue
        k = min(drafter.length, row.entry.max_tokens - row.read - 1, left)
        out.append(drafter.draft(row.tokens, k))
    return out


def matched(
    entry: Entry, tokens: list[int], logits: mx.array, draft: list[int], stops: frozenset[int]
) -> list[int]:
    """The tokens the sequence draws after `tokens` (`logits`: a row per drafted position, the
    first for the token after `tokens`): the draft's tokens as long as they are drawn, then the
    first draw that differs (or the one after a full draft); a stop token ends them."""
    if entry.sampler is greedy and not entry.processors:
        picks = cast(list[int], greedy(logits[: len(draft) + 1]).tolist())
        return _kept(picks, draft, stops)
    drawn: list[int] = []
    for j in range(len(draft) + 1):
        line = logits[j : j + 1]
        if entry.processors:
            context = mx.array(tokens + drawn)
            for processor in entry.processors:
                line = processor(context, line)
        token = cast(int, entry.sampler(line).item())
        drawn.append(token)
        if token in stops or j == len(draft) or token != draft[j]:
            break
    return drawn


def _kept(picks: list[int], draft: list[int], stops: frozenset[int]) -> list[int]:
    for j, token in enumerate(picks):
        if token in stops or j == len(draft) or token != draft[j]:
            return picks[: j + 1]
    return picks


def agreed(drawn: list[int], draft: list[int]) -> int:
    """How many drafted tokens were drawn."""
    return sum(1 for a, b in zip(drawn, draft, strict=False) if a == b)
