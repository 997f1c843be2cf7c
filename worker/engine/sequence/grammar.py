"""Constrained decoding: a job's grammar (shared/wire/generation/grammar.py) enforced token by
token.

One llguidance matcher per constrained sequence, as a logits processor
(worker/engine/sequence/processors.py's
shape): each step it takes the token the sequence just produced, asks the matcher which tokens
may come next, and sets every other logit to -inf. llguidance's own MLX helper applies the mask
with a Metal kernel, which exists only on a Mac; here the bitmask is unpacked with numpy and
applied with `mx.where`, which runs on every MLX backend (CPU, CUDA, Metal).

When the grammar is complete, the matcher allows only the end-of-sequence tokens, so a
constrained answer ends with finish_reason "stop". Grammars are compiled once per tokenizer and
grammar text, and each sequence gets a cheap copy of the compiled matcher.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any, cast

import llguidance.hf
import mlx.core as mx
import numpy as np
from llguidance import LLMatcher, LLTokenizer

from shared.wire.errors import InvalidRequestError

# Compiled grammars kept per worker (each holds the parser tables of one schema).
CACHED_GRAMMARS = 64


class Grammars:
    """The compiled grammars of one model's tokenizer, by grammar text; thread-safe."""

    def __init__(self, hf_tokenizer: Any, stop_ids: frozenset[int], vocab_size: int):
        self._hf_tokenizer = hf_tokenizer
        self._stop_ids = sorted(stop_ids)
        self._vocab_size = vocab_size
        self._tokenizer: LLTokenizer | None = None  # built on first use (about a second)
        self._compiled: OrderedDict[str, LLMatcher] = OrderedDict()
        self._lock = threading.Lock()

    def constraint(self, grammar: str) -> GrammarConstraint:
        return GrammarConstraint(self._matcher(grammar), self._stop_ids, self._vocab_size)

    def _matcher(self, grammar: str) -> LLMatcher:
        with self._lock:
            compiled = self._compiled.get(grammar)
            if compiled is None:
                compiled = self._compile(grammar)
                self._compiled[grammar] = compiled
                if len(self._compiled) > CACHED_GRAMMARS:
                    self._compiled.popitem(last=False)
            else:
                self._compiled.move_to_end(grammar)
            return compiled.deep_copy()

    def _compile(self, grammar: str) -> LLMatcher:
        if self._tokenizer is None:
            self._tokenizer = llguidance.hf.from_tokenizer(
                self._hf_tokenizer, n_vocab=self._vocab_size, eos_token=self._stop_ids
            )
        matcher = LLMatcher(self._tokenizer, grammar, log_level=0)
        if matcher.is_error():
            raise InvalidRequestError(
                f"The output format cannot be used with this model: {matcher.get_error()}",
                param="response_format",
                code="invalid_json_schema",
            )
        return matcher


class GrammarConstraint:
    """One sequence's matcher as a logits processor."""

    def __init__(self, matcher: LLMatcher, stop_ids: list[int], vocab_size: int):
        self._matcher = matcher
        self._vocab_size = vocab_size
        self._stop_only = np.zeros(vocab_size, dtype=bool)
        self._stop_only[[i for i in stop_ids if i < vocab_size]] = True
        self._seen = -1  # context tokens already fed to the matcher; -1 before the first call

    def __call__(self, context: mx.array, logits: mx.array) -> mx.array:
        if self._seen >= 0:
            self._matcher.consume_tokens(cast(list[int], context[self._seen :].tolist()))
        self._seen = context.size
        allowed = self._allowed()
        return mx.where(mx.array(allowed[: logits.shape[-1]]), logits, -mx.inf)

    def restart(self, at: int) -> None:
        """Read the context from position `at` on: the answer that follows a model's reasoning
        (worker/engine/sequence/reasoning.py). Only before the matcher has taken any token."""
        self._seen = at

    def _allowed(self) -> np.ndarray[Any, np.dtype[np.bool_]]:
        # A matcher in error (it never should be: it chose the tokens) ends the sequence.
        if self._matcher.is_error():
            return self._stop_only
        bits = np.frombuffer(self._matcher.compute_bitmask(), dtype=np.uint8)
        allowed = np.unpackbits(bits, bitorder="little", count=self._vocab_size).astype(bool)
        return allowed if allowed.any() else self._stop_only
