"""What a worker tells the fleet about its prefix cache: the blocks it holds, and how often it hit.

With each heartbeat the worker adds the block hashes (shared/queue/prefix/prefix_blocks.py) of the
sequences its prefix cache holds, each under its cache scope, to its `{ns}:blocks:{worker_id}`
set and removes those it published before and no longer holds (evicted), so the API can send a
request to the worker that holds its prefix (api/queue/placement.py). A slot taking a job adds
that job's prompt blocks at once (worker/runtime/intake/slots.py), so a conversation's next turn
finds its worker even when it comes before the next beat. The hashing runs on the heartbeat thread,
never on the engine's.

`PrefixFigures` counts the prompt tokens this worker looked up in its cache and found there,
from each ended job's usage, for the fleet view and /metrics (per worker).
"""

from __future__ import annotations

import threading
from typing import Any, Protocol

from shared.queue.keys import Keys
from shared.queue.prefix.prefix_blocks import MAX_PUBLISHED, HeldPrompt, block_hashes


class HeldPrefixes(Protocol):
    """What a prefix cache shows other threads: worker/engine/prefix_cache.py's `PrefixCache`,
    or the synthetic engine's (worker/engine/doubles/synthetic_prefill.py)."""

    @property
    def held(self) -> tuple[HeldPrompt, ...]: ...


class PrefixReport:
    def __init__(self, cache: HeldPrefixes | None, keys: Keys, worker_id: str):
        self._cache = cache
        self._key = keys.prefix_blocks(worker_id)
        self._published: set[str] = set()

    def held_blocks(self) -> set[str]:
        """The hashes of what the cache holds, newest sequences first, at most MAX_PUBLISHED."""
        found: set[str] = set()
        for held in self._cache.held if self._cache is not None else ():
            left = MAX_PUBLISHED - len(found)
            if left <= 0:
                break
            found.update(block_hashes(held.tokens, limit=left, scope=held.scope))
        return found

    def publish(self, pipe: Any, ttl_ms: int) -> None:
        """Queue on `pipe` the commands that bring the worker's set up to date."""
        held = self.held_blocks()
        gone = self._published - held
        if gone:
            pipe.srem(self._key, *gone)
        if held:
            pipe.sadd(self._key, *held)
        pipe.pexpire(self._key, ttl_ms)
        self._published = held


class PrefixFigures:
    """Prompt tokens looked up in this worker's cache, and found; counted by slot threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.queries = 0
        self.hits = 0

    def count(self, prompt_tokens: int, cached_tokens: int) -> None:
        with self._lock:
            self.queries += prompt_tokens
            self.hits += cached_tokens
