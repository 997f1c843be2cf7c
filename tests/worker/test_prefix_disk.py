"""The prefix cache's disk tier, without a worker: a tiny llama's caches written, read back by a
new cache on the same folder (a restart), and every file that is not this model's refused."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import mlx.core as mx
import pytest
from mlx_lm.models.cache import QuantizedKVCache, make_prompt_cache

from shared.queue.prefix.cache_scope import UNSCOPED
from shared.queue.prefix.prefix_blocks import HeldPrompt
from tests.worker.tiny_models import TINY_LLAMA, tiny_model
from worker.engine.prefix_cache import PrefixCache
from worker.engine.prefix_disk import DiskTier
from worker.engine.prefix_file import file_name
from worker.engine.prefix_identity import model_identity, probe_layout

MIN_TOKENS = 4
IDENTITY = "tiny"
HISTORY = list(range(1, 41))  # a prompt of 40 tokens


def _tier(root: Path, model: Any, max_bytes: int = 1 << 30) -> DiskTier:
    return DiskTier(root, IDENTITY, probe_layout(model), max_bytes, MIN_TOKENS)


def _finished(model: Any, tokens: list[int]) -> list[Any]:
    cache = make_prompt_cache(model)
    model(mx.array([tokens]), cache=cache)
    mx.eval([c.state for c in cache])
    return cache


def _persisted(root: Path, model: Any, *sequences: list[int]) -> Path:
    """A worker's life: each sequence finished and kept, then everything written at shutdown.
    Returns the folder of the files."""
    tier = _tier(root, model)
    prefixes = PrefixCache(model, 8, 1 << 30, tier)
    for tokens in sequences:
        prefixes.store(tokens, _finished(model, tokens), UNSCOPED)
    prefixes.close()
    return tier.folder


def _restarted(root: Path, model: Any) -> PrefixCache:
    return PrefixCache(model, 8, 1 << 30, _tier(root, model))


def _next_logits(model: Any, cache: list[Any] | None, tokens: list[int]) -> mx.array:
    cache = cache if cache is not None else make_prompt_cache(model)
    return model(mx.array([tokens]), cache=cache)[0, -1]


def test_a_restart_restores_what_was_held_at_shutdown(model: Any, tmp_path: Path) -> None:
    _persisted(tmp_path, model, HISTORY)
    reuse = _restarted(tmp_path, model).reuse([*HISTORY, 50, 51], shared=0, scope=UNSCOPED)
    assert reuse.tokens == reuse.hits == len(HISTORY)


def test_a_restored_cache_continues_as_a_fresh_prefill_would(model: Any, tmp_path: Path) -> None:
    _persisted(tmp_path, model, HISTORY)
    reuse = _restarted(tmp_path, model).reuse([*HISTORY, 50, 51], shared=0, scope=UNSCOPED)
    restored = _next_logits(model, reuse.cache, [50, 51])
    fresh = _next_logits(model, None, [*HISTORY, 50, 51])
    assert mx.allclose(restored, fresh, atol=1e-4).item()


def test_a_cache_evicted_from_memory_is_served_from_its_file_while_the_worker_runs(
    model: Any, tmp_path: Path
) -> None:
    tier = _tier(tmp_path, model)
    prefixes = PrefixCache(model, 1, 1 << 30, tier)  # room for one: the first is evicted
    prefixes.store(HISTORY, _finished(model, HISTORY), UNSCOPED)
    prefixes.store([60, *HISTORY], _finished(model, [60, *HISTORY]), UNSCOPED)
    tier.flush()
    # written behind as memory took it in (tests/worker/test_prefix_disk_write_behind.py)
    assert file_name(HeldPrompt(UNSCOPED, HISTORY)) in [p.name for p in tier.folder.iterdir()]
    # the same cache, now that memory lacks it, serves from the file
    assert prefixes.reuse([*HISTORY, 50], shared=0, scope=UNSCOPED).hits == len(HISTORY)


def test_the_disk_tier_is_advertised_as_held(model: Any, tmp_path: Path) -> None:
    _persisted(tmp_path, model, HISTORY)
    assert _restarted(tmp_path, model).held == (HeldPrompt(UNSCOPED, HISTORY),)


def test_a_truncated_file_is_a_miss_and_is_removed(model: Any, tmp_path: Path) -> None:
    folder = _persisted(tmp_path, model, HISTORY)
    restarted = _restarted(tmp_path, model)  # indexed the file from its header
    path = folder / file_name(HeldPrompt(UNSCOPED, HISTORY))
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    reuse = restarted.reuse([*HISTORY, 50], shared=0, scope=UNSCOPED)
    assert (reuse.cache, reuse.tokens) == (None, 0)
    assert not path.exists()


@pytest.mark.parametrize("junk", [b"", b"not a cache at all", os.urandom(4096)])
def test_junk_in_the_folder_is_removed_at_start(model: Any, tmp_path: Path, junk: bytes) -> None:
    folder = _persisted(tmp_path, model, HISTORY)
    (folder / "junk.safetensors").write_bytes(junk)
    restarted = _restarted(tmp_path, model)
    assert sorted(p.name for p in folder.iterdir()) == [file_name(HeldPrompt(UNSCOPED, HISTORY))]
    assert restarted.reuse([*HISTORY, 50], shared=0, scope=UNSCOPED).hits == len(HISTORY)


def _rewritten(path: Path, change: dict[str, str], cast: mx.Dtype | None = None) -> None:
    """The file saved again with its metadata changed, its arrays cast to `cast`."""
    arrays, meta = mx.load(str(path), return_metadata=True)
    if cast is not None:
        arrays = {k: v.astype(cast) if v.ndim == 4 else v for k, v in arrays.items()}
    mx.save_safetensors(str(path), arrays, {**meta, **change})


def test_another_models_file_in_the_folder_is_removed_unread(model: Any, tmp_path: Path) -> None:
    folder = _persisted(tmp_path, model, HISTORY)
    _rewritten(folder / file_name(HeldPrompt(UNSCOPED, HISTORY)), {"0.identity": "another-model"})
    restarted = _restarted(tmp_path, model)
    assert not any(folder.iterdir())  # removed at start, from its header alone
    assert restarted.reuse([*HISTORY, 50], shared=0, scope=UNSCOPED).hits == 0


def test_a_file_replaced_by_another_models_after_the_start_is_refused(
    model: Any, tmp_path: Path
) -> None:
    folder = _persisted(tmp_path, model, HISTORY)
    restarted = _restarted(tmp_path, model)  # indexed the file from its header
    _rewritten(folder / file_name(HeldPrompt(UNSCOPED, HISTORY)), {"0.identity": "another-model"})
    assert restarted.reuse([*HISTORY, 50], shared=0, scope=UNSCOPED).hits == 0
    assert not any(folder.iterdir())


def test_a_file_of_another_dtype_is_removed_unread(model: Any, tmp_path: Path) -> None:
    folder = _persisted(tmp_path, model, HISTORY)
    _rewritten(folder / file_name(HeldPrompt(UNSCOPED, HISTORY)), {}, cast=mx.float16)
    reuse = _restarted(tmp_path, model).reuse([*HISTORY, 50], shared=0, scope=UNSCOPED)
    assert reuse.hits == 0 and not any(folder.iterdir())


def test_a_model_of_another_shape_never_reads_the_files(model: Any, tmp_path: Path) -> None:
    _persisted(tmp_path, model, HISTORY)
    wider = tiny_model({**TINY_LLAMA, "vocab_size": 100, "num_key_value_heads": 4}, seed=0)
    assert probe_layout(wider) != probe_layout(model)
    other = DiskTier(tmp_path, IDENTITY, probe_layout(wider), 1 << 30, MIN_TOKENS)
    reuse = PrefixCache(wider, 8, 1 << 30, other).reuse([*HISTORY, 50], shared=0, scope=UNSCOPED)
    assert reuse.hits == 0


def test_the_identity_changes_with_the_weights_and_the_kv_layout(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(b"1234")
    before = model_identity(tmp_path, "float32")
    assert model_identity(tmp_path, "float16") != before
    weights.write_bytes(b"12345")
    assert model_identity(tmp_path, "float32") != before


def test_the_folder_keeps_to_its_cap_removing_the_least_recently_used(
    model: Any, tmp_path: Path
) -> None:
    first, second, third = HISTORY, [61, *HISTORY], [62, *HISTORY]
    folder = _persisted(tmp_path, model, first, second)
    one_file = (folder / file_name(HeldPrompt(UNSCOPED, first))).stat().st_size
    os.utime(folder / file_name(HeldPrompt(UNSCOPED, first)), (1, 1))  # used long ago
    tier = _tier(tmp_path, model, max_bytes=int(2.5 * one_file))
    tier.put(HeldPrompt(UNSCOPED, third), _finished(model, third))
    tier.close()
    assert sorted(p.name for p in folder.iterdir()) == sorted(
        file_name(HeldPrompt(UNSCOPED, t)) for t in (second, third)
    )


def test_a_quantized_cache_comes_back_with_its_bits_and_groups(tmp_path: Path) -> None:
    heads_of_64 = {**TINY_LLAMA, "vocab_size": 100, "hidden_size": 128, "num_attention_heads": 2}
    model = tiny_model({**heads_of_64, "num_key_value_heads": 1}, seed=0)
    quantized = [c.to_quantized(group_size=32, bits=4) for c in _finished(model, HISTORY)]
    layout = probe_layout(model, [QuantizedKVCache(group_size=32, bits=4) for _ in model.layers])
    tier = DiskTier(tmp_path, IDENTITY, layout, 1 << 30, MIN_TOKENS)
    tier.put(HeldPrompt(UNSCOPED, HISTORY), quantized)
    tier.close()
    restored = DiskTier(tmp_path, IDENTITY, layout, 1 << 30, MIN_TOKENS).restore(
        HISTORY, 0, UNSCOPED
    )
    assert restored is not None and restored.tokens == HISTORY
    layer, original = restored.cache[0], quantized[0]
    assert (type(layer), layer.bits, layer.group_size) == (QuantizedKVCache, 4, 32)
    held = [x[..., : len(HISTORY), :] for x in original.keys]  # mlx-lm's steps of 256 cut off
    assert all(mx.array_equal(a, b).item() for a, b in zip(layer.keys, held, strict=True))
