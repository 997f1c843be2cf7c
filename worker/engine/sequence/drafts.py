"""Drafts for speculative decoding: a guess of a sequence's next tokens, checked by the batch.

A `PromptLookup` guesses from n-gram prompt lookup: the last few tokens of the sequence (its
prompt and output) are looked up in what came before them, and the tokens that followed their
latest earlier occurrence are the draft. Text the request predicted (OpenAI's `prediction`) is
looked up first, as a corpus of its own. A draft is only a guess: the slot batch scores it in one
forward and keeps a drafted token only while it equals what the sequence's own sampler draws
there (worker/engine/batch/speculation.py), so the output is the one without speculation.

The index grows by the tokens added since the last lookup (a dict per n-gram length), so a
lookup costs the new tokens, not the sequence. After a miss the sequence waits a few tokens
before it looks again (doubling up to MAX_WAIT), so a sequence that copies nothing costs its
batch few synchronous steps. A draft's length follows what the batch kept of the sequence's
recent drafts (`length`: one more than their running mean, at most `Speculation.tokens`): a
sequence copying whole sentences drafts the most, one whose drafts break early drafts little,
which keeps the positions each step scores in vain few.
"""

from __future__ import annotations

from dataclasses import dataclass

LONGEST = 4  # n-gram lengths looked up, longest first
SHORTEST = 2
MAX_WAIT = 16  # tokens a sequence waits after misses before it looks again, at most


@dataclass(frozen=True)
class Speculation:
    """`tokens`: a draft's length at most; `rows`: the most decoding rows a step speculates
    with (past it, a step is compute-bound and plain decode is faster)."""

    tokens: int
    rows: int


@dataclass
class DraftFigures:
    """Drafted tokens the batch checked, and of those the ones it kept, since the engine
    started: one per engine, read by the worker's report for /metrics (two ints: a reader on
    another thread sees a count at most a step old)."""

    checked: int = 0
    kept: int = 0


class NgramIndex:
    """Where each n-gram of a token list last ended, grown as the list grows."""

    def __init__(self) -> None:
        self._ends: dict[int, dict[tuple[int, ...], int]] = {
            n: {} for n in range(SHORTEST, LONGEST + 1)
        }
        self._indexed = 0  # n-grams ending before this position are indexed

    def grow(self, tokens: list[int], upto: int) -> None:
        """Index the n-grams ending at positions before `upto` (each with a token after it)."""
        for end in range(max(self._indexed, SHORTEST), upto):
            for n, ends in self._ends.items():
                if end >= n:
                    ends[tuple(tokens[end - n : end])] = end
        self._indexed = max(self._indexed, upto)

    def follow(self, tokens: list[int], suffix: list[int], k: int) -> list[int]:
        """The up to `k` tokens of `tokens` after the latest occurrence of the longest indexed
        tail of `suffix`; [] if none occurs."""
        for n in range(LONGEST, SHORTEST - 1, -1):
            if len(suffix) < n:
                continue
            end = self._ends[n].get(tuple(suffix[-n:]))
            if end is not None:
                return tokens[end : end + k]
        return []


class PromptLookup:
    """One sequence's drafter."""

    def __init__(
        self,
        settings: Speculation,
        predicted: list[int] | None = None,
        figures: DraftFigures | None = None,
    ):
        self.settings = settings
        self._figures = figures
        self.length = settings.tokens  # the next draft's length at most
        self._kept_mean = float(settings.tokens)  # tokens kept of recent drafts, on average
        self._own = NgramIndex()
        self._predicted = predicted or []
        self._prediction = NgramIndex()
        self._prediction.grow(self._predicted, len(self._predicted))
        self._wait = 1
        self._next_look = 0  # the sequence length before which it does not look
        self._started: int | None = None  # the sequence's length at its first lookup
        self.accepted = 0  # drafted tokens the sampler drew too
        self.drafted = 0
        self._predicting = False  # the last draft came from the prediction
        # Of the prediction's drafted tokens, those kept and those not, not yet reported.
        self.predicted_kept = 0
        self.predicted_rejected = 0

    def hopeful(self, length: int) -> bool:
        """Whether it would look up a sequence of `length` tokens."""
        return length >= self._next_look

    def draft(self, tokens: list[int], k: int) -> list[int]:
        """Up to `k` tokens expected after `tokens` (the whole sequence so far)."""
        if k <= 0 or not self.hopeful(len(tokens)):
            return []
        if self._started is None:
            self._started = len(tokens)
        guess = self._prediction.follow(self._predicted, tokens, k)
        if not guess and len(tokens) == self._started:  # nothing written yet: its opening
            guess = self._predicted[:k]
        self._predicting = bool(guess)
        if not guess:
            self._own.grow(tokens, len(tokens))
            guess = self._own.follow(tokens, tokens, k)
        if guess:
            self._wait = 1
            self.drafted += len(guess)
        else:
            self._next_look = len(tokens) + self._wait
            self._wait = min(2 * self._wait, MAX_WAIT)
        return guess

    def checked(self, drafted: int, kept: int) -> None:
        """The batch kept `kept` tokens of the last draft, of `drafted`."""
        self.accepted += kept
        # Half of the weight on the last draft: a sequence that stops copying drafts short
        # within two drafts, and one that copies again grows back as fast.
        self._kept_mean = (self._kept_mean + kept) / 2
        self.length = max(1, min(self.settings.tokens, round(self._kept_mean) + 1))
        if self._figures is not None:
            self._figures.checked += drafted
            self._figures.kept += kept
        if self._predicting:
            self.predicted_kept += kept
            self.predicted_rejected += drafted - kept
