"""Quantized KV in the slot batch (MLXQ_KV_BITS, worker/engine/batch/quantized_kv.py): a
sequence gets what it gets alone with the same quantized cache, whoever shares the batch.

The reference is mlx-lm's single-sequence `generate_step` on a `QuantizedKVCache` of the same
bits and group size from the first position, greedy: each position is quantized once, as the
slot batch does, so the two agree token for token. It runs with MLX's own attention (mlx-lm's
quantized attention on both sides) and with the worker's CPU exponentials hooked (its quantized
attention, worker/engine/cpu/quantized_attention.py, on both sides); the tiny families' heads are
one quantization group wide and two.
"""

from __future__ import annotations

import mlx.core as mx
import pytest
from hypothesis import HealthCheck, settings
from mlx_lm.models.base import quantized_scaled_dot_product_attention
from mlx_lm.models.cache import QuantizedKVCache

from shared.queue.prefix.cache_scope import UNSCOPED
from tests.worker.test_slot_batch import (
    CPU,
    MLX,
    STOP,
    WIDE_HEADS,
    Arrival,
    check,
    plans,
    run,
    tiny,
)
from worker.engine.batch.quantized_kv import KVQuantization
from worker.engine.batch.slot_batch import SlotBatch
from worker.engine.batch.token_batch import kv_bytes_per_token, open_batch
from worker.engine.batch.types import Entry, PrefillBudget
from worker.engine.cpu import exponentials as cpu_exp
from worker.engine.cpu import quantized_attention as quantized_attention_module
from worker.engine.cpu.quantized_attention import quantized_attention
from worker.engine.prefix_cache import PrefixCache
from worker.engine.sequence.sampling import greedy

KINDS = [KVQuantization(8, 32), KVQuantization(4, 32)]


@pytest.mark.parametrize("family", list(WIDE_HEADS))
@pytest.mark.parametrize("kv", KINDS, ids=lambda q: f"{q.bits}bit")
@pytest.mark.parametrize("exps", [MLX, CPU])
@settings(
    max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@plans
def test_a_quantized_batch_gives_each_sequence_what_it_gets_alone(
    family: str,
    kv: KVQuantization,
    exps: str,
    plan: list[Arrival],
    slots: int,
    budget: PrefillBudget | None,
) -> None:
    model = tiny(family, exps)
    batch = open_batch(
        model, slots, STOP, "slots", keep_caches=True, positions=512, quantization=kv
    )
    check(family, plan, run(family, batch, plan, budget, exps, kv), exps, kv)


def test_a_finished_quantized_sequence_hands_back_a_quantized_cache_of_its_tokens() -> None:
    model = tiny("llama_wide")
    kv = KINDS[0]
    batch = SlotBatch(model, 2, frozenset(), 512, True, 512, kv)
    batch.insert([Entry([5, 9, 11, 2, 40], [], None, 4, greedy, [])])
    last = []
    while not last:
        last = [t for t in batch.next(None) if t.finish_reason is not None]
    (done,) = last
    assert done.prompt_cache is not None and done.all_tokens is not None
    reference = [kv.new_cache() for _ in model.layers]
    model(mx.array([done.all_tokens]), cache=reference)
    for ours, theirs in zip(done.prompt_cache, reference, strict=True):
        assert isinstance(ours, QuantizedKVCache)
        assert (ours.bits, ours.group_size) == (8, 32)
        assert ours.offset == theirs.offset == len(done.all_tokens)
        for a, b in zip(ours.keys_and_values()[0], theirs.keys_and_values()[0], strict=True):
            assert mx.allclose(a, b, atol=1e-5).item()


@pytest.mark.parametrize("cast", [1 << 20, 1], ids=["one pass", "a row a pass"])
@pytest.mark.parametrize("group_size", [32, 64])
@pytest.mark.parametrize("bits", [8, 4])
def test_cpu_quantized_attention_equals_mlx_lm_s(
    bits: int, group_size: int, cast: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(quantized_attention_module, "CAST_ELEMENTS", cast)
    mx.random.seed(3)
    queries = mx.random.normal((2, 6, 3, 64))
    keys = mx.quantize(mx.random.normal((2, 2, 40, 64)), group_size=group_size, bits=bits)
    values = mx.quantize(mx.random.normal((2, 2, 40, 64)), group_size=group_size, bits=bits)
    mask = mx.random.uniform(shape=(2, 1, 3, 40)) > 0.3
    ours = quantized_attention(
        queries,
        keys,
        values,
        scale=0.125,
        mask=mask,
        group_size=group_size,
        bits=bits,
        softmax=cpu_exp.softmax,
    )
    theirs = quantized_scaled_dot_product_attention(
        queries, keys, values, scale=0.125, mask=mask, group_size=group_size, bits=bits
    )
    assert mx.allclose(ours, theirs, atol=1e-4).item()


def test_8_bit_kv_takes_under_a_third_of_float32_s_bytes_per_token() -> None:
    model = tiny("llama_wide")
    full = kv_bytes_per_token(model)
    assert kv_bytes_per_token(model, KVQuantization(8, 32)) == full * (32 + 8) // 128
    assert kv_bytes_per_token(model, KVQuantization(4, 32)) == full * (16 + 8) // 128


def test_a_model_whose_heads_do_not_split_into_groups_is_refused_naming_the_setting() -> None:
    with pytest.raises(ValueError, match="MLXQ_KV_GROUP_SIZE=64"):
        open_batch(
            tiny("llama"), 2, STOP, "slots", True, positions=64, quantization=KVQuantization(8)
        )


def test_the_prefix_cache_prefills_a_shared_history_in_the_batch_s_kv_form() -> None:
    model = tiny("llama_wide")
    prefixes = PrefixCache(model, 8, 1 << 30, kv=KINDS[0])
    # The history: its first 20 tokens.
    reuse = prefixes.reuse(list(range(1, 41)), shared=20, scope=UNSCOPED)
    assert reuse.tokens == 20 and reuse.cache is not None
    assert all(isinstance(c, QuantizedKVCache) and c.bits == 8 for c in reuse.cache)
