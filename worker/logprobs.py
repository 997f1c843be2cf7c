"""Log probabilities, for the sequences that ask for them and only those.

A `LogprobRecorder` wraps a sequence's sampler. Each draw also keeps, as lazy MLX arrays, the
sampled token's log probability and the k most likely alternatives, computed from the logits the
sampler was given: after penalties, logit bias and a grammar's mask, before temperature (vLLM's
"processed logprobs"). The decode step runs one token ahead (worker/decode.py), so draws are
queued and `take` hands them out in order as the engine reads each token. Tokens are reported as
their decoded text and UTF-8 bytes, never as raw vocabulary symbols.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar, cast

import mlx.core as mx

from shared.completions import TokenLogprob, TopLogprob
from worker.sampling import Sampler

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
        return token

    def take(self) -> TokenLogprob:
        """The oldest draw not yet taken: the token the engine is reading now."""
        draw = self._draws.popleft()
        token = cast(int, draw.token.item())
        top: list[TopLogprob] = []
        if draw.top_ids is not None and draw.top_logprobs is not None:
            ids = cast(list[int], draw.top_ids[0].tolist())
            values = cast(list[float], draw.top_logprobs[0].tolist())
            ranked = sorted(zip(ids, values, strict=True), key=lambda pair: -pair[1])
            top = [self._describe(i, v, TopLogprob) for i, v in ranked]
        entry = self._describe(token, cast(float, draw.logprob.item()), TokenLogprob)
        entry.top_logprobs = top
        return entry

    def _describe(self, token: int, logprob: float, kind: type[T]) -> T:
        piece = self._piece(token)
        shown = max(logprob, FLOOR)  # a masked-out alternative: -inf is not JSON
        return kind(token=piece.decode("utf-8", "replace"), logprob=shown, bytes=list(piece))
