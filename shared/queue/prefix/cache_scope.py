"""Cache scopes: whose prompts a prefix cache entry may serve.

A worker's prefix cache (worker/engine/prefix_cache.py), its disk tier, the prefix fetch between
workers and placement's block hashes (shared/queue/prefix/prefix_blocks.py) all key what they hold
by a scope as well as by tokens: a request reuses only what requests of its own scope left there. So
`cached_tokens`, time to first token and the hit counters tell a caller about its own prompts
only, never another key's (vLLM's `cache_salt`, CVE-2025-46570; OpenAI shares no prompt cache
across organizations).

The API derives a job's scope from who sent it, never from a client field alone: each key is
its own scope, or keys an operator names together share one (api/http/auth.py). A request's
`cache_salt` (vLLM's field) narrows its key's scope, never widens it: the salted scope is a
hash of both. Jobs queued without the API (benchmarks, tests) share `UNSCOPED`.

A request's `prompt_cache_key` (OpenAI's field) becomes a placement hint the same way: `hint` is a
hash of the job's scope and the key, so two callers giving the same key get different hints, and
no hint names, or lets a caller learn, another scope's worker (api/queue/placement.py).
"""

from __future__ import annotations

import hashlib

UNSCOPED = ""
# Scopes are hex digests (or UNSCOPED): safe in file metadata, Redis values and hash seeds.
SCOPE_PATTERN = r"^[0-9a-z]{0,64}$"


def narrowed(scope: str, salt: str | None) -> str:
    """`scope` with a request's `cache_salt` (None: `scope` itself): only requests that give
    the same salt under the same scope share it."""
    if salt is None:
        return scope
    return _digest(scope, salt)


def hint(scope: str, key: str | None) -> str | None:
    """The placement hint of a request's `prompt_cache_key` under its job's (server-derived)
    scope; None without a key. A hex digest, like a scope."""
    return None if key is None else _digest(f"hint\0{scope}", key)


def _digest(scope: str, value: str) -> str:
    digest = hashlib.blake2b(digest_size=16)
    digest.update(scope.encode())
    digest.update(b"\0")
    digest.update(value.encode("utf-8", "surrogatepass"))
    return digest.hexdigest()
