"""The prefix cache: KV caches of prompts seen before, so a shared prefix is prefilled once.

On this CPU a prompt token costs about half a generated token, and chat prompts share a lot:
the template's system prompt, a fixed instruction, the earlier turns of a conversation. The
cache keeps the KV state of (1) each finished sequence, prompt and answer, so the next turn of
a conversation or a repeated prompt starts where it ended, and (2) each chat request's history
(everything before its last message's text), prefilled on its own the first time it is seen,
so that a burst of requests sharing a system prompt computes it once, not once per request.

Storage and lookup are mlx-lm's `LRUPromptCache` (a token trie with least-recently-used
eviction by entries and bytes); this module decides what goes in and hands out a copy.
The engine thread uses it; `held` is a snapshot it leaves for other threads (the worker's
heartbeat advertises what the cache holds: worker/runtime/prefix/prefix_report.py). One other thread
reads it: the lending thread (`lend`: worker/runtime/prefix/prefix_fetch.py), under a lock that the
engine takes only around the LRU's own calls, never around a forward.

Every entry belongs to a cache scope (shared/queue/prefix/cache_scope.py): a request reuses only
what requests of its own scope left, so what it is told it reused (`cached_tokens`), and how soon
its first token comes, say nothing about another key's prompts. The scope is the LRU's model key:
mlx-lm keeps one trie per key.

With a disk tier (worker/engine/prefix_disk.py), each cache the LRU takes in, a finished
sequence's or a shared history's, is handed to the tier's writer at once (write-behind: written
soon after, off the engine thread, so that a crash keeps it), what the LRU evicts is handed over
again (a write dropped while the disk was behind gets another chance), and so is all it holds on
`persist_all` (shutdown, or the model unloaded); a prompt that memory holds less of than a file
does is restored from the file into memory first. What a request that said `store: false` adds
stays in memory: it is never written, evicted or at shutdown, nor lent.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import mlx.core as mx
from mlx_lm.models.cache import LRUPromptCache, can_trim_prompt_cache, trim_prompt_cache

from shared.queue.prefix.prefix_blocks import HeldPrompt
from worker.engine.batch.quantized_kv import KVQuantization, prompt_cache
from worker.engine.prefix_file import MAX_SHARED_TOKENS, MIN_SHARED_TOKENS

if TYPE_CHECKING:
    from worker.engine.prefix_disk import DiskTier

# See `level`: recomputing this many tokens per prompt costs less than the roll it avoids.
MAX_LEVELLING_TOKENS = 16
# mlx-lm's LRU orders its entries per kind ("assistant", "user", "system"); this cache files a
# finished sequence under the first, a shared history under the last, and whatever a `store:
# false` request adds under "user": so eviction and `persist_all` can tell it is memory's only.
FINISHED, HISTORY, MEMORY_ONLY = "assistant", "system", "user"


@dataclass(frozen=True)
class Reuse:
    """A KV cache for the first `tokens` prompt tokens (None: start from nothing), of which
    `hits` were in the cache before this request (the rest it has just prefilled itself)."""

    cache: list[Any] | None
    tokens: int
    hits: int


class _EvictionTap:
    """Stands in for the trie inside mlx-lm's LRUPromptCache, passing every call on, and hands
    each entry the LRU evicts to `evicted`: eviction is the LRU's only use of the trie's `pop`
    (mlx-lm 0.32; its prefixes made redundant by a longer entry go through `pop_prefixes`)."""

    def __init__(self, trie: Any, evicted: Callable[[HeldPrompt, Any], None]):
        self._trie = trie
        self._evicted = evicted

    def pop(self, model: Any, tokens: list[int]) -> Any:
        entry = self._trie.pop(model, tokens)
        self._evicted(HeldPrompt(model, list(tokens)), entry)
        return entry

    def __getattr__(self, name: str) -> Any:
        return getattr(self._trie, name)


class PrefixCache:
    def __init__(
        self,
        model: Any,
        entries: int,
        max_bytes: int,
        disk: DiskTier | None = None,
        kv: KVQuantization | None = None,
    ):
        """`kv`: the batch's KV form (MLXQ_KV_BITS), which the caches it prefills itself take:
        the cache holds every entry quantized, as the batch hands them back."""
        self._model = model
        self._kv = kv
        self._lru = LRUPromptCache(max_size=entries, max_bytes=max_bytes)
        self._lock = threading.Lock()  # the LRU, between the engine and the lending thread
        self._disk = disk
        if disk is not None:
            self._lru._trie = _EvictionTap(self._lru._trie, self._evicted)
        self._held: tuple[HeldPrompt, ...] = ()

    @property
    def held(self) -> tuple[HeldPrompt, ...]:
        """The token sequences the cache holds (newest first per kind) as of its last insertion,
        then those its disk tier holds; replaced whole (never changed in place), so any thread
        may read it."""
        return self._held if self._disk is None else self._held + self._disk.held

    @property
    def disk(self) -> DiskTier | None:
        """Its disk tier, if it has one."""
        return self._disk

    def persist_all(self) -> None:
        """Write every cache memory holds to the disk tier (what is there already is only
        touched), and wait for the writes: at shutdown, or before the model is unloaded."""
        if self._disk is None:
            return
        with self._lock:
            held = [
                (HeldPrompt(scope, list(tokens)), self._lru._trie.get(scope, tokens).prompt_cache)
                for kind, lru in self._lru._lru._lrus.items()
                if kind != MEMORY_ONLY
                for scope, tokens in lru
            ]
        for entry, cache in held:
            self._disk.put(entry, cache, True)
        self._disk.flush()

    def lend(self, prompt: list[int], scope: str) -> Path | None:
        """The file of a cache of `prompt`'s first tokens in `scope`, from memory or disk,
        holding no more than those it shares with `prompt` (a longer one is cut and written
        first), or None: nothing of it is held (or only in memory's own). Called by the lending
        thread, for another worker (worker/runtime/prefix/prefix_fetch.py)."""
        if self._disk is None:
            return None
        on_disk, stored = self._disk.best(prompt, scope)
        with self._lock:
            tokens, common = _longest(self._lru._trie.search(scope, prompt), len(prompt))
            entry = self._lru._trie.get(scope, tokens) if common > 0 else None
            in_memory = entry is not None and common >= on_disk
            held = None
            if entry is not None and in_memory and entry.cache_type != MEMORY_ONLY:
                held = entry.prompt_cache
        if held is None and not in_memory and stored is not None:
            if len(stored.tokens) == on_disk:
                return stored.path
            tokens, common, held = stored.tokens.tolist(), on_disk, self._disk.read(stored)
        if held is None or common < MIN_SHARED_TOKENS:
            return None
        if common < len(tokens):
            if not can_trim_prompt_cache(held):
                return None
            held = copy.deepcopy(held)  # the entry stays as it is: the copy is cut
            trim_prompt_cache(held, len(tokens) - common)
        return self._disk.write_now(HeldPrompt(scope, tokens[:common]), held)

    def close(self) -> None:
        """`persist_all`, then stop the disk tier's thread: the cache is not used again."""
        if self._disk is not None:
            self.persist_all()
            self._disk.close()

    def _insert(self, entry: HeldPrompt, cache: list[Any] | None, kind: str) -> None:
        with self._lock:
            self._lru.insert_cache(entry.scope, entry.tokens, cache, cache_type=kind)
            # mlx-lm keeps the entries' order in one deque per kind (oldest first) and lists
            # them nowhere else; read after the insertion, which is when it evicts.
            lrus = self._lru._lru._lrus.values()
            self._held = tuple(HeldPrompt(m, t) for lru in lrus for m, t in reversed(lru))

    def _evicted(self, entry: HeldPrompt, value: Any) -> None:
        """An entry the LRU evicts goes to disk, unless it is memory's only."""
        if self._disk is not None and value.cache_type != MEMORY_ONLY:
            self._disk.put(entry, value.prompt_cache)

    def reuse(self, prompt: list[int], shared: int, scope: str, disk: bool = True) -> Reuse:
        """The longest prefix of `prompt` cached in `scope`, leaving at least its last token to
        compute.

        When less than the first `shared` tokens (the request's history) is cached and there
        are enough of them, they are prefilled and stored first (`disk`: and may be written).
        """
        reuse = self._nearest(prompt, scope)
        if self._disk is not None and reuse.tokens < len(prompt) - 1:
            reuse = self._restore(prompt, reuse, scope)
        if reuse.tokens < shared < len(prompt) and MIN_SHARED_TOKENS <= shared <= MAX_SHARED_TOKENS:
            self._prefill(HeldPrompt(scope, prompt[:shared]), reuse, disk)
            return replace(self._nearest(prompt, scope), hits=reuse.hits)
        return reuse

    def store(self, tokens: list[int], cache: list[Any], scope: str, disk: bool = True) -> None:
        """Keep a finished sequence's cache (its prompt and answer) for `scope` (`disk`: and
        may write it)."""
        if tokens:
            # mlx-lm hands the cache over as lazy slices of the running batch's arrays: made
            # real now, they cost a copy; left lazy, they cost far more when first read
            # (measured: a prefill of 16 prompts on them, 1.1 s instead of 0.45 s).
            mx.eval([c.state for c in cache])
            self._keep(HeldPrompt(scope, list(tokens)), cache, FINISHED, disk)

    def _restore(self, prompt: list[int], reuse: Reuse, scope: str) -> Reuse:
        """`reuse`, or a longer start read back from the disk tier into memory."""
        assert self._disk is not None
        restored = self._disk.restore(prompt, reuse.tokens, scope)
        if restored is None:
            return reuse
        self._insert(HeldPrompt(scope, restored.tokens), restored.cache, FINISHED)
        return self._nearest(prompt, scope)

    def _nearest(self, prompt: list[int], scope: str) -> Reuse:
        with self._lock:
            cache, rest = self._lru.fetch_nearest_cache(scope, prompt)
        if cache is None:
            return Reuse(None, 0, 0)
        if not rest:  # the whole prompt is cached: recompute its last token for the logits
            trim_prompt_cache(cache, 1)
            rest = prompt[-1:]
        tokens = len(prompt) - len(rest)
        return Reuse(cache, tokens, tokens)

    def _prefill(self, history: HeldPrompt, start: Reuse, disk: bool) -> None:
        done = prefill(self._model, history.tokens, start, self._kv)
        assert done.cache is not None  # a prefill always makes one
        self._keep(history, done.cache, HISTORY, disk)

    def _keep(self, entry: HeldPrompt, cache: list[Any], kind: str, disk: bool) -> None:
        """A cache this worker made, into memory, and behind it to disk (`disk`: unless it is
        memory's only)."""
        self._insert(entry, cache, kind if disk else MEMORY_ONLY)
        if self._disk is not None and disk:
            self._disk.put(entry, cache)


def _longest(found: Any, length: int) -> tuple[list[int], int]:
    """From mlx-lm's trie search for a prompt of `length` tokens: the held sequence sharing
    most of its first tokens, and how many it shares ([], 0: none)."""
    if found.exact is not None:
        return list(found.exact), length
    shorter = len(found.shorter) if found.shorter is not None else 0
    if found.longer is not None and found.common_prefix > shorter:
        return list(found.longer), found.common_prefix
    return (list(found.shorter), shorter) if shorter else ([], 0)


def prefill(model: Any, tokens: list[int], start: Reuse, kv: KVQuantization | None) -> Reuse:
    """`start` (a cache of the first `start.tokens` tokens, or none: a new one in `kv`'s form)
    extended to all `tokens`."""
    cache = start.cache if start.cache is not None else prompt_cache(model, kv)
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
