"""Log probabilities, for the sequences that ask for them and only those.

A `LogprobRecorder` wraps a sequence's sampler. Each draw also keeps, as lazy MLX arrays, the
sampled token's log probability and the k most likely alternatives, computed from the logits the
sampler was given: after penalties, logit bias and a grammar's mask, before temperature (vLLM's
"processed logprobs"). The decode step runs one token ahead (worker/engine/batch/mlx_lm_decode.py),
so draws are
queued and `take` hands them out in order as the engine reads each token. Tokens are reported as
their decoded text and UTF-8 bytes, never as raw vocabulary symbols. `PromptScorer` scores
a prompt's own tokens (an echoed text completion with logprobs: what eval harnesses ask for).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar, cast

import mlx.core as mx

from shared.wire.generation.logprobs import TokenLogprob, TopLogprob
from worker.engine.sequence.sampling import Sampler

T = TypeVar("T", bound=TopLogprob)
# The log probability reported for a token that could not be drawn (OpenAI reports -9999.0).
FLOOR = -9999.0


@dataclass(frozen=True)
class Draw:
    token: mx.array
    logprob: mx.array
    top_ids: mx.array | None
    top_logprobs: mx.array | None


class LogprobRecorder:
    def __init__(self, sampler: Sampler, alternatives: int, piece: Callable[[int], bytes]):
        self._sampler = sampler
        self._alternatives = alternatives
        self._piece = piece
        self._draws: deque[Draw] = deque()

    def __call__(self, logits: mx.array) -> mx.array:
        token = self._sampler(logits)
        logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        chosen = mx.take_along_axis(logprobs, token.reshape(1, 1), axis=-1)
        top_ids = top_values = None
        if self._alternatives:
            top_ids = mx.argpartition(-logprobs, kth=self._alternatives - 1, axis=-1)
            top_ids = top_ids[:, : self._alternatives]
            top_values = mx.take_along_axis(logprobs, top_ids, axis=-1)
        self._draws.append(Draw(token, chosen, top_ids, top_values))
        # Computed with the step's tokens, in the background: `take` then only reads them.
        mx.async_eval(token, chosen, *(a for a in (top_ids, top_values) if a is not None))
        return token

    def take(self) -> TokenLogprob:
        """The oldest draw not yet taken: the token the engine is reading now."""
        draw = self._draws.popleft()
        top: list[TopLogprob] = []
        if draw.top_ids is not None and draw.top_logprobs is not None:
            ids = cast(list[int], draw.top_ids[0].tolist())
            top = _alternatives(self._piece, ids, cast(list[float], draw.top_logprobs[0].tolist()))
        token = cast(int, draw.token.item())
        entry = _describe(self._piece, token, cast(float, draw.logprob.item()), TokenLogprob)
        entry.top_logprobs = top
        return entry


class PromptScorer:
    """A prompt's own logprobs: each token's log probability given the tokens before it (the
    first has none), taken from the logits of the positions before it as the prompt's forwards
    compute them, a chunk at a time (worker/engine/staged_prompt.py), so that only a chunk's
    rows of vocabulary-wide logits exist at a time."""

    def __init__(self, prompt: list[int], alternatives: int, piece: Callable[[int], bytes]):
        self._prompt = prompt
        self._alternatives = alternatives
        self._piece = piece
        first = piece(prompt[0])
        self.entries = [
            TokenLogprob(token=first.decode("utf-8", "replace"), logprob=None, bytes=list(first))
        ]

    def add(self, logits: mx.array) -> None:
        """Score the tokens that the next `len(logits)` positions' logits predict."""
        start = len(self.entries) - 1
        targets = self._prompt[start + 1 : start + 1 + logits.shape[0]]
        # Read from the logits, less each row's normaliser: no normalised copy of a chunk's
        # vocabulary-wide rows is made, and one alternative is an argmax, not a partition.
        norm = mx.logsumexp(logits, axis=-1, keepdims=True)
        chosen = mx.take_along_axis(logits, mx.array(targets)[:, None], axis=-1) - norm
        top_ids = top_values = None
        alternatives = self._alternatives
        if alternatives == 1:
            top_ids = mx.argmax(logits, axis=-1, keepdims=True)
        elif alternatives:
            top_ids = mx.argpartition(-logits, kth=alternatives - 1, axis=-1)[:, :alternatives]
        if top_ids is not None:
            top_values = mx.take_along_axis(logits, top_ids, axis=-1) - norm
            mx.eval(chosen, top_ids, top_values)
        else:
            mx.eval(chosen)
        values = cast(list[float], chosen[:, 0].tolist())
        ids = [] if top_ids is None else cast(list[list[int]], top_ids.tolist())
        tops = [] if top_values is None else cast(list[list[float]], top_values.tolist())
        for row, (token, value) in enumerate(zip(targets, values, strict=True)):
            entry = _describe(self._piece, token, value, TokenLogprob)
            if ids:
                entry.top_logprobs = _alternatives(self._piece, ids[row], tops[row])
            self.entries.append(entry)


def _alternatives(
    piece: Callable[[int], bytes], ids: list[int], values: list[float]
) -> list[TopLogprob]:
    ranked = sorted(zip(ids, values, strict=True), key=lambda pair: -pair[1])
    return [_describe(piece, i, v, TopLogprob) for i, v in ranked]


def _describe(piece: Callable[[int], bytes], token: int, logprob: float, kind: type[T]) -> T:
    text = piece(token)
    shown = max(logprob, FLOOR)  # a masked-out alternative: -inf is not JSON
    return kind(token=text.decode("utf-8", "replace"), logprob=shown, bytes=list(text))
