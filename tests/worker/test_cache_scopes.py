"""Cache scopes inside the worker (shared/queue/prefix/cache_scope.py): a tiny llama's prefix cache,
disk tier and lending, each reusing for a scope only what that scope cached, and a `store:
false` request's caches kept off disk."""

from __future__ import annotations

import stat
from pathlib import Path
from typing import Any

import mlx.core as mx
from mlx_lm.models.cache import make_prompt_cache

from shared.queue.prefix.prefix_blocks import HeldPrompt, block_hashes
from worker.engine.prefix_cache import PrefixCache
from worker.engine.prefix_disk import DiskTier
from worker.engine.prefix_file import held_lengths
from worker.engine.prefix_identity import probe_layout

HISTORY = list(range(1, 41))
PROMPT = [*HISTORY, 50, 51]
A, B = "a" * 32, "b" * 32


def _finished(model: Any, tokens: list[int]) -> list[Any]:
    cache = make_prompt_cache(model)
    model(mx.array([tokens]), cache=cache)
    mx.eval([c.state for c in cache])
    return cache


def _cache(root: Path, model: Any, entries: int = 8) -> PrefixCache:
    tier = DiskTier(root, "tiny", probe_layout(model), 1 << 30, 4)
    return PrefixCache(model, entries, 1 << 30, tier)


def test_a_prompt_reuses_only_what_its_own_scope_cached(model: Any) -> None:
    prefixes = PrefixCache(model, 8, 1 << 30)
    prefixes.store(HISTORY, _finished(model, HISTORY), A)
    assert prefixes.reuse(PROMPT, shared=0, scope=B).hits == 0
    assert prefixes.reuse(PROMPT, shared=0, scope=A).hits == len(HISTORY)


def test_a_history_prefilled_for_one_scope_is_prefilled_again_for_another(model: Any) -> None:
    prefixes = PrefixCache(model, 8, 1 << 30)
    prefixes.reuse(PROMPT, shared=len(HISTORY), scope=A)
    assert prefixes.reuse([*HISTORY, 60], shared=len(HISTORY), scope=B).hits == 0
    assert prefixes.reuse([*HISTORY, 60], shared=len(HISTORY), scope=A).hits == len(HISTORY)


def test_what_a_scope_cached_is_held_and_advertised_under_its_scope(model: Any) -> None:
    prefixes = PrefixCache(model, 8, 1 << 30)
    prefixes.store(HISTORY * 2, _finished(model, HISTORY * 2), A)
    assert prefixes.held == (HeldPrompt(A, HISTORY * 2),)
    assert not set(block_hashes(HISTORY * 2, scope=A)) & set(block_hashes(HISTORY * 2, scope=B))


def test_a_restart_restores_a_prompt_only_from_its_own_scopes_files(
    model: Any, tmp_path: Path
) -> None:
    before = _cache(tmp_path, model)
    before.store(HISTORY, _finished(model, HISTORY), A)
    before.close()
    assert _cache(tmp_path, model).reuse(PROMPT, shared=0, scope=B).hits == 0
    assert _cache(tmp_path, model).reuse(PROMPT, shared=0, scope=A).hits == len(HISTORY)


def test_the_disk_tiers_folders_and_files_are_its_owners_only(model: Any, tmp_path: Path) -> None:
    root = tmp_path / "prefix-cache"
    prefixes = _cache(root, model)
    prefixes.store(HISTORY, _finished(model, HISTORY), A)
    prefixes.close()
    folders = [root, *(p for p in root.iterdir() if p.is_dir())]
    files = [p for p in root.glob("*/*") if p.is_file() and p.suffix == ".safetensors"]
    assert files
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o700 for p in folders)
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in files)


def test_what_a_store_false_request_adds_is_reused_but_never_written(
    model: Any, tmp_path: Path
) -> None:
    prefixes = _cache(tmp_path, model, entries=1)
    prefixes.store(HISTORY, _finished(model, HISTORY), A, disk=False)
    prefixes.reuse([70, *HISTORY, 80], shared=len(HISTORY) + 1, scope=A, disk=False)
    assert prefixes.reuse(PROMPT, shared=0, scope=A).hits == 0  # evicted by the history
    prefixes.store(HISTORY, _finished(model, HISTORY), A, disk=False)
    assert prefixes.reuse(PROMPT, shared=0, scope=A).hits == len(HISTORY)
    assert prefixes.lend(PROMPT, A) is None
    prefixes.close()  # persists what memory holds: none of it
    assert held_lengths(tmp_path) == {}


def test_a_lent_file_is_adopted_only_for_the_scope_it_was_asked_for(
    model: Any, tmp_path: Path
) -> None:
    holder = _cache(tmp_path / "holder", model)
    holder.store(HISTORY, _finished(model, HISTORY), A)
    assert holder.lend(PROMPT, B) is None
    path = holder.lend(PROMPT, A)
    assert path is not None
    taker = _cache(tmp_path / "taker", model)
    assert taker.disk is not None
    assert taker.disk.adopt(path.read_bytes(), B) is None
    assert taker.disk.adopt(path.read_bytes(), A) == HISTORY
