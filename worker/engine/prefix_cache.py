"""The prefix cache: KV caches of prompts seen before, so a shared prefix is prefilled once.

On this CPU a prompt token costs about half a generated token, and chat prompts share a lot:
the template's system prompt, a fixed instruction, the earlier turns of a conversation. The
cache keeps the KV state of (1) each finished sequence, prompt and answer, so the next turn of
a conversation or a repeated prompt starts where it ended, and (2) each chat request's history
(everything before its last message's text), prefilled on its own the first time it is seen,
so that a burst of requests sharing a system prompt computes it once, not once per request.

Storage and lookup are mlx-lm's `LRUPromptCache` (a token trie with least-recently-used
eviction by entries and bytes); this module decides what goes in and hands out a copy.
Only the engine thread touches it; `held` is a snapshot it leaves for other threads (the
worker's heartbeat advertises what the cache holds: worker/runtime/prefix_report.py).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import mlx.core as mx
from mlx_lm.models.cache import LRUPromptCache, make_prompt_cache, trim_prompt_cache

# A history shorter than this is cheaper to prefill with the rest than on its own; a longer one
# than this is left to the batch's chunked prefill, which lets the other sequences go on.
MIN_SHARED_TOKENS = 16
MAX_SHARED_TOKENS = 512
# See `level`: recomputing this many tokens per prompt costs less than the roll it avoids.
MAX_LEVELLING_TOKENS = 16
_KEY = "model"  # one engine, one model: the trie's model key is a constant


@dataclass(frozen=True)
class Reuse:
    """A KV cache for the first `tokens` prompt tokens (None: start from nothing), of which
    `hits` were in the cache before this request (the rest it has just prefilled itself)."""

    cache: list[Any] | None
    tokens: int
    hits: int


class PrefixCache:
    def __init__(self, model: Any, entries: int, max_bytes: int):
        self._model = model
        self._lru = LRUPromptCache(max_size=entries, max_bytes=max_bytes)
        self._held: tuple[list[int], ...] = ()

    @property
    def held(self) -> tuple[list[int], ...]:
        """The token sequences the cache holds (newest first per kind) as of its last insertion;
        replaced whole (never changed in place), so any thread may read it."""
        return self._held

    def _insert(self, tokens: list[int], cache: list[Any] | None, kind: str) -> None:
        self._lru.insert_cache(_KEY, tokens, cache, cache_type=kind)
        # mlx-lm keeps the entries' order in one deque per kind (oldest first) and lists them
        # nowhere else; read after the insertion, which is when it evicts.
        lrus = self._lru._lru._lrus.values()
        self._held = tuple(t for lru in lrus for _, t in reversed(lru))

    def reuse(self, prompt: list[int], shared: int) -> Reuse:
        """The longest cached prefix of `prompt`, leaving at least its last token to compute.

        When less than the first `shared` tokens (the request's history) is cached and there
        are enough of them, they are prefilled and stored first.
        """
        reuse = self._nearest(prompt)
        if reuse.tokens < shared < len(prompt) and MIN_SHARED_TOKENS <= shared <= MAX_SHARED_TOKENS:
            self._prefill(prompt[:shared], reuse)
            return replace(self._nearest(prompt), hits=reuse.hits)
        return reuse

    def store(self, tokens: list[int], cache: list[Any]) -> None:
        """Keep a finished sequence's cache (its prompt and answer)."""
        if tokens:
            # mlx-lm hands the cache over as lazy slices of the running batch's arrays: made
            # real now, they cost a copy; left lazy, they cost far more when first read
            # (measured: a prefill of 16 prompts on them, 1.1 s instead of 0.45 s).
            mx.eval([c.state for c in cache])
            self._insert(list(tokens), cache, "assistant")

    def _nearest(self, prompt: list[int]) -> Reuse:
        cache, rest = self._lru.fetch_nearest_cache(_KEY, prompt)
        if cache is None:
            return Reuse(None, 0, 0)
        if not rest:  # the whole prompt is cached: recompute its last token for the logits
            trim_prompt_cache(cache, 1)
            rest = prompt[-1:]
        tokens = len(prompt) - len(rest)
        return Reuse(cache, tokens, tokens)

    def _prefill(self, history: list[int], start: Reuse) -> None:
        done = prefill(self._model, history, start)
        self._insert(list(history), done.cache, "system")


def prefill(model: Any, tokens: list[int], start: Reuse) -> Reuse:
    """`start` (a cache of the first `start.tokens` tokens, or none) extended to all `tokens`."""
    cache = start.cache if start.cache is not None else make_prompt_cache(model)
    model(mx.array([tokens[start.tokens :]]), cache=cache)
    mx.eval([c.state for c in cache])
    return Reuse(cache, len(tokens), start.hits)


def level(prompts: list[list[int]], reuses: list[Reuse]) -> list[Reuse]:
    """Trim the caches of prompts admitted together so all have as many tokens left to
    prefill, when that means recomputing at most MAX_LEVELLING_TOKENS tokens of each.

    mlx-lm prefills prompts of unequal lengths right-padded, then rolls every layer's whole
    KV cache into place with a gather, which MLX's CPU backend does slowly: measured with the
    default model, 16 prompts of 10-13 tokens on 30 cached ones took 0.85-1.2 s to prefill,
    of equal length 0.5 s.
    """
    rests = [len(p) - r.tokens for p, r in zip(prompts, reuses, strict=True)]
    longest = max(rests, default=0)
    give = [longest - rest for rest in rests]
    if not any(give):
        return reuses
    if any(g > min(r.tokens, MAX_LEVELLING_TOKENS) for g, r in zip(give, reuses, strict=True)):
        return reuses
    return [_trimmed(r, g) for r, g in zip(reuses, give, strict=True)]


def _trimmed(reuse: Reuse, tokens: int) -> Reuse:
    if tokens == 0 or reuse.cache is None:
        return reuse
    if tokens == reuse.tokens:
        return Reuse(None, 0, 0)
    trim_prompt_cache(reuse.cache, tokens)
    kept = reuse.tokens - tokens
    return Reuse(reuse.cache, kept, min(reuse.hits, kept))
