"""What one engine step may prefill: the prefill budget's rule, from the worker's settings, the
batch's state and the sequences waiting.

A decoding sequence's next token waits for the step's prefill. So while any decodes, a step
prefills what takes about MLXQ_PREFILL_SECONDS_DECODING at the batch's measured prefill rate (at
least MIN_PREFILL_TOKENS, so prompts still move on a slow machine), and of that at most
MLXQ_PREFILL_TOKENS_DECODING in chunks of prompts that go on. Short prompts (no longer than that
cap) taken whole pass the cap while the time lasts, and a long prompt waits its turn a chunk at a
time. With nothing decoding, a step takes up to MLXQ_PREFILL_TOKENS, and no more than takes
about IDLE_SECONDS at the measured rate (before any rate is measured: prompts of up to one
chunk whole, longer ones a chunk a step): a long prompt alone then moves over several steps,
so no step holds the engine for a minute on a busy machine (the watchdog reads a step past
MLXQ_WATCHDOG_S as a wedged worker), and cancellations and arrivals are seen between them.

A burst (MLXQ_PREFILL_BURST): while more interactive sequences wait for their first token than
stream their next (bulk ones are nobody's wait), whole short prompts take up to
MLXQ_PREFILL_TOKENS. The step that starts them pauses fewer streams than it starts, where the
time limit starts two or three short prompts a step on a slow CPU and keeps the rest waiting for
many steps (docs/benchmarks.md, "Short bursts"). Chunks of long prompts keep the time's cap.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from worker.engine.batch.types import PrefillBudget

MIN_PREFILL_TOKENS = 16
# With nothing decoding: about the longest a step's prefill takes (4,096 prompt tokens took
# 18 s on 2 idle cores and 70 s on 2 loaded ones), and its first chunks' size before that.
IDLE_SECONDS = 10.0
FIRST_CHUNK = 512


@dataclass(frozen=True)
class PrefillPolicy:
    tokens: int  # MLXQ_PREFILL_TOKENS: a step's prefill with nothing decoding
    decoding_cap: int  # MLXQ_PREFILL_TOKENS_DECODING
    seconds: float | None  # MLXQ_PREFILL_SECONDS_DECODING; None: no limit in time
    burst: bool  # MLXQ_PREFILL_BURST

    def budget(
        self, decoding: bool, rate: float | None, bursting: Callable[[], bool]
    ) -> PrefillBudget:
        """The step's budget: `decoding`, whether any sequence decodes; `rate`, the batch's
        prefill tokens a second lately (None: not measured); `bursting`, whether more
        interactive sequences wait for a first token than stream (asked only when it counts)."""
        if not decoding:
            if rate is None:
                return PrefillBudget(self.tokens, FIRST_CHUNK, FIRST_CHUNK)
            idle = max(MIN_PREFILL_TOKENS, min(self.tokens, int(rate * IDLE_SECONDS)))
            return PrefillBudget.flat(idle)
        cap = self.decoding_cap
        if rate is None or self.seconds is None:
            return PrefillBudget.flat(cap)
        timed = max(MIN_PREFILL_TOKENS, min(self.tokens, int(rate * self.seconds)))
        if self.burst and bursting():
            return PrefillBudget(self.tokens, min(cap, timed), cap)
        return PrefillBudget(timed, min(cap, timed), cap)
