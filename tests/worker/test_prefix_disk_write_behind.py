"""The disk tier's write-behind, without a worker: a cache the memory tier takes in is on disk
soon after, with no eviction and no shutdown (a crash keeps it); the writer keeps to its bounds
(bytes waiting: dropped past it, never waited for; bytes a second); one file per chain."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import mlx.core as mx
from mlx_lm.models.cache import make_prompt_cache

from shared.queue.prefix.cache_scope import UNSCOPED
from shared.queue.prefix.prefix_blocks import HeldPrompt
from worker.engine.prefix_cache import PrefixCache
from worker.engine.prefix_disk import DiskTier
from worker.engine.prefix_disk_writer import UNBOUNDED, WriteBounds
from worker.engine.prefix_file import file_name
from worker.engine.prefix_identity import probe_layout
from worker.ops.cluster import wait_until

MIN_TOKENS = 4
IDENTITY = "tiny"
HISTORY = list(range(1, 41))  # a prompt of 40 tokens
LONGER = [*HISTORY, 50, 51, 52]  # the next turn of the same conversation
# Soon after: what a write of a tiny cache may take on a loaded machine.
WRITTEN_WITHIN_S = 10.0
NEVER = 1e-3  # bytes a second: after one write, the writer waits past any test


def _tier(root: Path, model: Any, bounds: WriteBounds = UNBOUNDED) -> DiskTier:
    return DiskTier(root, IDENTITY, probe_layout(model), 1 << 30, MIN_TOKENS, bounds=bounds)


def _finished(model: Any, tokens: list[int]) -> list[Any]:
    cache = make_prompt_cache(model)
    model(mx.array([tokens]), cache=cache)
    mx.eval([c.state for c in cache])
    return cache


def _files(tier: DiskTier) -> list[str]:
    return sorted(p.name for p in tier.folder.iterdir())


def _written(tier: DiskTier, tokens: list[int]) -> None:
    path = tier.folder / file_name(HeldPrompt(UNSCOPED, tokens))
    wait_until(path.exists, WRITTEN_WITHIN_S, f"the file of {len(tokens)} tokens")
    wait_until(lambda: tier.waiting_bytes == 0, WRITTEN_WITHIN_S, "the writer done")


def test_a_finished_sequence_is_on_disk_soon_without_eviction_or_shutdown(
    model: Any, tmp_path: Path
) -> None:
    tier = _tier(tmp_path, model)
    PrefixCache(model, 8, 1 << 30, tier).store(HISTORY, _finished(model, HISTORY), UNSCOPED)
    _written(tier, HISTORY)
    # As after kill -9: a new process on the folder, the first never shut down.
    restarted = PrefixCache(model, 8, 1 << 30, _tier(tmp_path, model))
    assert restarted.reuse([*HISTORY, 60], shared=0, scope=UNSCOPED).hits == len(HISTORY)


def test_a_shared_history_prefilled_on_its_own_is_on_disk_soon(model: Any, tmp_path: Path) -> None:
    tier = _tier(tmp_path, model)
    PrefixCache(model, 8, 1 << 30, tier).reuse(
        [*HISTORY, 60, 61], shared=len(HISTORY), scope=UNSCOPED
    )
    _written(tier, HISTORY)


def test_a_write_past_the_bytes_waiting_bound_is_dropped_not_waited_for(
    model: Any, tmp_path: Path
) -> None:
    one = sum(c.nbytes for c in _finished(model, HISTORY))
    tier = _tier(tmp_path, model, WriteBounds(int(1.5 * one), NEVER))
    tier.put(HeldPrompt(UNSCOPED, HISTORY), _finished(model, HISTORY))
    _written(tier, HISTORY)  # the writer now waits out its rate
    second, third = [61, *HISTORY], [62, *HISTORY]
    tier.put(HeldPrompt(UNSCOPED, second), _finished(model, second))  # waits: one cache's bytes
    # That one would make two: dropped, and put returned.
    tier.put(HeldPrompt(UNSCOPED, third), _finished(model, third))
    assert tier.waiting_bytes == one
    tier.close()  # stops waiting between writes and writes what waits
    assert _files(tier) == sorted(file_name(HeldPrompt(UNSCOPED, t)) for t in (HISTORY, second))


def test_the_writer_keeps_to_its_bytes_a_second(model: Any, tmp_path: Path) -> None:
    sequences = [[61 + i, *HISTORY] for i in range(3)]
    probe = _tier(tmp_path / "probe", model)
    probe.put(HeldPrompt(UNSCOPED, HISTORY), _finished(model, HISTORY))
    probe.close()
    size = (probe.folder / file_name(HeldPrompt(UNSCOPED, HISTORY))).stat().st_size
    interval_s = 0.3
    tier = _tier(tmp_path, model, WriteBounds(1 << 30, size / interval_s))
    started = time.perf_counter()
    for tokens in sequences:
        tier.put(HeldPrompt(UNSCOPED, tokens), _finished(model, tokens))
    for tokens in sequences:
        _written(tier, tokens)
    # The first written at once; each of the next two after a write's interval.
    assert time.perf_counter() - started >= 2 * interval_s


def test_a_cache_that_extends_a_file_replaces_it(model: Any, tmp_path: Path) -> None:
    tier = _tier(tmp_path, model)
    tier.put(HeldPrompt(UNSCOPED, HISTORY), _finished(model, HISTORY))
    tier.put(HeldPrompt(UNSCOPED, LONGER), _finished(model, LONGER))
    tier.close()
    assert _files(tier) == [file_name(HeldPrompt(UNSCOPED, LONGER))]


def test_a_cache_whose_start_a_file_holds_is_not_written_and_is_served_from_that_file(
    model: Any, tmp_path: Path
) -> None:
    tier = _tier(tmp_path, model)
    tier.put(HeldPrompt(UNSCOPED, LONGER), _finished(model, LONGER))
    tier.put(HeldPrompt(UNSCOPED, HISTORY), _finished(model, HISTORY))
    tier.close()
    assert _files(tier) == [file_name(HeldPrompt(UNSCOPED, LONGER))]
    restarted = PrefixCache(model, 8, 1 << 30, _tier(tmp_path, model))
    assert restarted.reuse([*HISTORY, 70], shared=0, scope=UNSCOPED).hits == len(HISTORY)
