"""A prefix cache lent by one worker and adopted by another, without worker processes: two caches
of a tiny llama on two folders (two machines) and the file between them, as bytes, and the rule
that decides whether a fetch pays. The file over the session's Redis, between the lending thread
and the taker: tests/worker/test_prefix_lend_wire.py; across real worker processes:
tests/e2e/test_prefix_fetch.py."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import mlx.core as mx
import pytest
from mlx_lm.models.cache import make_prompt_cache

from shared.queue.prefix.cache_scope import UNSCOPED
from shared.queue.prefix.prefix_blocks import HeldPrompt
from worker.engine.prefix_cache import PrefixCache
from worker.engine.prefix_disk import DiskTier
from worker.engine.prefix_file import file_name
from worker.engine.prefix_identity import model_identity, probe, probe_layout, token_bytes
from worker.runtime.prefix.prefix_fetch import (
    MIN_GAIN_TOKENS,
    RECOVER_S,
    FetchRule,
    held_tokens,
)

HISTORY = list(range(1, 41))
PROMPT = [*HISTORY, 50, 51]


def _cache(root: Path, model: Any, identity: str = "tiny") -> PrefixCache:
    tier = DiskTier(root, identity, probe_layout(model), 1 << 30, 4)
    return PrefixCache(model, 8, 1 << 30, tier)


def _finished(model: Any, tokens: list[int]) -> list[Any]:
    cache = make_prompt_cache(model)
    model(mx.array([tokens]), cache=cache)
    mx.eval([c.state for c in cache])
    return cache


def _lent(model: Any, root: Path) -> bytes:
    """The file a holder lends for PROMPT, HISTORY's cache held only in its memory."""
    holder = _cache(root, model)
    holder.store(HISTORY, _finished(model, HISTORY), UNSCOPED)
    path = holder.lend(PROMPT, UNSCOPED)
    assert path is not None
    return path.read_bytes()


def test_a_cache_held_only_in_memory_is_written_and_lent(model: Any, tmp_path: Path) -> None:
    holder = _cache(tmp_path / "holder", model)
    holder.store(HISTORY, _finished(model, HISTORY), UNSCOPED)
    path = holder.lend(PROMPT, UNSCOPED)
    assert path is not None and path.name == file_name(HeldPrompt(UNSCOPED, HISTORY))


def test_nothing_is_lent_for_a_prompt_the_cache_does_not_hold(model: Any, tmp_path: Path) -> None:
    holder = _cache(tmp_path, model)
    holder.store(HISTORY, _finished(model, HISTORY), UNSCOPED)
    assert holder.lend([99, 98, *HISTORY], UNSCOPED) is None


def test_a_lent_file_is_adopted_and_serves_the_prompt_as_its_own_prefill_would(
    model: Any, tmp_path: Path
) -> None:
    taker = _cache(tmp_path / "taker", model)
    assert taker.disk is not None
    assert taker.disk.adopt(_lent(model, tmp_path / "holder"), UNSCOPED) == HISTORY
    reuse = taker.reuse(PROMPT, shared=0, scope=UNSCOPED)
    assert reuse.hits == len(HISTORY)
    assert reuse.cache is not None
    fetched = model(mx.array([PROMPT[len(HISTORY) :]]), cache=reuse.cache)[0, -1]
    fresh = model(mx.array([PROMPT]), cache=make_prompt_cache(model))[0, -1]
    assert mx.allclose(fetched, fresh, atol=1e-4).item()


@pytest.mark.parametrize("junk", [b"", b"not a cache", os.urandom(4096)])
def test_junk_sent_as_a_cache_is_refused_and_leaves_nothing(
    model: Any, tmp_path: Path, junk: bytes
) -> None:
    taker = _cache(tmp_path, model)
    assert taker.disk is not None
    assert taker.disk.adopt(junk, UNSCOPED) is None
    assert not any(taker.disk.folder.iterdir())
    assert taker.reuse(PROMPT, shared=0, scope=UNSCOPED).hits == 0


def test_another_models_cache_is_refused(model: Any, tmp_path: Path) -> None:
    taker = _cache(tmp_path / "taker", model, identity="another-model")
    assert taker.disk is not None
    assert taker.disk.adopt(_lent(model, tmp_path / "holder"), UNSCOPED) is None
    assert not any(taker.disk.folder.iterdir())


def test_the_identity_is_the_same_for_the_same_weights_written_elsewhere_at_another_time(
    tmp_path: Path,
) -> None:
    here = tmp_path / "here" / "model"
    here.mkdir(parents=True)
    (here / "config.json").write_text("{}")
    (here / "model.safetensors").write_bytes(os.urandom(1 << 20))
    there = tmp_path / "there" / "model"
    shutil.copytree(here, there)
    os.utime(there / "model.safetensors", (1, 1))
    assert model_identity(here, "float32") == model_identity(there, "float32")


def test_the_identity_changes_with_the_weights_at_the_same_size(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(bytes(1 << 20))
    before = model_identity(tmp_path, "float32")
    with weights.open("r+b") as file:  # one byte
        file.seek((1 << 20) // 2 + 1)
        file.write(b"\x01")
    assert model_identity(tmp_path, "float32") != before


def test_a_hub_blob_is_named_by_its_content_hash(tmp_path: Path) -> None:
    blobs = tmp_path / "blobs"
    blobs.mkdir()
    snapshot = tmp_path / "snapshots" / "model"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    for name in ("a" * 64, "b" * 64):
        (blobs / name).write_bytes(b"same bytes")
        (snapshot / "model.safetensors").unlink(missing_ok=True)
        (snapshot / "model.safetensors").symlink_to(blobs / name)
        if name == "a" * 64:
            before = model_identity(snapshot, "float32")
    assert model_identity(snapshot, "float32") != before


def test_a_token_costs_what_the_files_grow_by(model: Any, tmp_path: Path) -> None:
    per_token = token_bytes(probe(model))
    small, large = _cache(tmp_path, model), [99, *range(1, 81)]  # no prefix of the other
    for tokens in (HISTORY, large):
        small.store(tokens, _finished(model, tokens), UNSCOPED)
    small.persist_all()
    assert small.disk is not None
    sizes = [
        (small.disk.folder / file_name(HeldPrompt(UNSCOPED, t))).stat().st_size
        for t in (HISTORY, large)
    ]
    grown = per_token * (len(large) - len(HISTORY))
    assert grown <= sizes[1] - sizes[0] <= grown * 1.05  # and the tokens' text in the header


@pytest.mark.parametrize("where", ["memory", "disk"])
def test_a_longer_held_sequence_is_lent_cut_to_what_the_prompt_shares(
    model: Any, tmp_path: Path, where: str
) -> None:
    holder = _cache(tmp_path, model)
    longer = [*HISTORY, *range(60, 90)]
    holder.store(longer, _finished(model, longer), UNSCOPED)
    if where == "disk":
        holder.close()
        holder = _cache(tmp_path, model)  # a restart: its files only
    path = holder.lend([*HISTORY, 95], UNSCOPED)
    assert path is not None and path.name == file_name(HeldPrompt(UNSCOPED, HISTORY))
    taker = _cache(tmp_path / "taker", model)
    assert taker.disk is not None and taker.disk.adopt(path.read_bytes(), UNSCOPED) == HISTORY


def test_held_tokens_is_the_longest_common_start_in_the_prompts_scope() -> None:
    held = tuple(HeldPrompt(UNSCOPED, t) for t in ([1, 2, 3, 4], [1, 2, 9], [7, 8]))
    held += (HeldPrompt("other", [1, 2, 3, 5, 6]),)
    assert held_tokens(held, HeldPrompt(UNSCOPED, [1, 2, 3, 5, 6])) == 3
    assert held_tokens(held, HeldPrompt(UNSCOPED, [5])) == 0
    assert held_tokens(held, HeldPrompt("third", [1, 2])) == 0
    assert held_tokens((), HeldPrompt(UNSCOPED, [1, 2])) == 0


# The default model on this CPU: 4.4 ms a prompt token, 46 KB a float32 token.
RULE = FetchRule(prefill_s_per_token=0.0044, token_bytes=46_080, link_bytes_per_s=100e6)


def test_a_fetch_pays_when_the_link_moves_the_cache_faster_than_its_prefill() -> None:
    wait = RULE.wait_s(gain=2000, tokens=2000)  # 8.8 s of prefill against about 1 s
    assert wait is not None and wait == pytest.approx(4.4)


def test_a_fetch_does_not_pay_over_a_slow_link_or_for_a_few_tokens() -> None:
    slow = FetchRule(0.0044, 46_080, link_bytes_per_s=5e6)  # 18 s for 2,000 tokens
    assert slow.wait_s(gain=2000, tokens=2000) is None
    assert RULE.wait_s(gain=MIN_GAIN_TOKENS - 1, tokens=4000) is None
    # most of the holder's tokens held here already: moving them all saves too little
    assert RULE.wait_s(gain=300, tokens=20_000) is None
    assert FetchRule(0.0044, 0, 100e6).wait_s(gain=2000, tokens=2000) is None


def test_the_link_rate_follows_what_fetches_measure_until_it_is_old() -> None:
    rule = FetchRule(0.0044, 46_080, link_bytes_per_s=100e6)
    for _ in range(8):
        rule.measured(nbytes=10_000_000, seconds=1.0)  # 10 MB/s
    assert rule.rate() == pytest.approx(10e6, rel=0.05)
    assert rule.wait_s(gain=2000, tokens=2000) is None
    rule.measured_at -= RECOVER_S  # a slow link is tried again, at the configured rate
    assert rule.rate() == 100e6
    assert rule.wait_s(gain=2000, tokens=2000) is not None


def test_a_file_being_lent_is_not_removed_by_a_longer_write_of_its_chain_meanwhile(
    model: Any, tmp_path: Path
) -> None:
    holder = _cache(tmp_path, model)
    tier = holder.disk
    assert tier is not None
    longer = HeldPrompt(UNSCOPED, [*HISTORY, *range(60, 90)])
    write = tier._write

    def then_the_writer_writes_the_longer(held: HeldPrompt, cache: Any, chained: bool) -> int:
        written = write(held, cache, chained)
        if held.tokens == HISTORY:  # the lend's file is indexed: the writer's thread goes now
            write(longer, _finished(model, longer.tokens), chained=True)
        return written

    tier._write = then_the_writer_writes_the_longer  # type: ignore[method-assign]
    path = tier.write_now(HeldPrompt(UNSCOPED, HISTORY), _finished(model, HISTORY))
    assert path is not None and path.exists()
