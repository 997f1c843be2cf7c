"""Prefix blocks: the compact names under which workers advertise the prompts their caches hold.

A token sequence is cut into blocks of `BLOCK_TOKENS` tokens (a last, partial block is left out)
and each block is named by a hash chained on the previous block's hash, as LMCache and vLLM do:
two sequences of one cache scope share their first k block hashes exactly when they share their
first k x BLOCK_TOKENS tokens, so "how much of this prompt does a worker hold" is "how many of the
prompt's hashes, from the first, are in the worker's set". Workers publish the hashes of what
their prefix cache holds (worker/runtime/prefix/prefix_report.py); the API hashes a prompt's tokens,
counted exactly as the worker renders them (shared/queue/prompt/prompt_tokens.py), and scores the
live workers with them (api/queue/placement.py). Nothing here talks to Redis.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Iterable
from typing import NamedTuple

BLOCK_TOKENS = 64
# The most hashes a worker publishes (its cache's newest sequences first): 8,192 x 64 tokens.
MAX_PUBLISHED = 8192
_SEED = b"mlxq-prefix-v1"


class HeldPrompt(NamedTuple):
    """A token sequence a worker's prefix cache holds, and the cache scope it holds it for
    (shared/queue/prefix/cache_scope.py): what the worker advertises, and what its cache files are
    named by."""

    scope: str
    tokens: list[int]


def block_hashes(tokens: list[int], limit: int | None = None, scope: str = "") -> list[str]:
    """The chained hashes of the full blocks of `tokens` (at most `limit`), in order, under a
    cache scope (shared/queue/prefix/cache_scope.py): the same tokens in another scope share
    none."""
    blocks = len(tokens) // BLOCK_TOKENS
    if limit is not None:
        blocks = min(blocks, limit)
    hashes: list[str] = []
    # A scope's chain starts from a digest: a fixed length, so no scope's bytes can run on into
    # another's first block.
    previous = hashlib.blake2b(_SEED + scope.encode(), digest_size=8).digest()
    for i in range(blocks):
        block = array("I", tokens[i * BLOCK_TOKENS : (i + 1) * BLOCK_TOKENS]).tobytes()
        digest = hashlib.blake2b(previous + block, digest_size=8).digest()
        hashes.append(digest.hex())
        previous = digest
    return hashes


def matched_blocks(held: list[bool]) -> int:
    """How many of a prompt's blocks a worker holds from the first: its leading run of
    members (a block without its predecessors is of no use to a prefix cache)."""
    count = 0
    for member in held:
        if not member:
            break
        count += 1
    return count


def matched_tokens(members: Iterable[object]) -> int:
    """The prompt tokens a worker holds from the first, by SMISMEMBER's replies for the
    prompt's hashes (`matched_blocks`, in tokens)."""
    return matched_blocks([bool(m) for m in members]) * BLOCK_TOKENS
