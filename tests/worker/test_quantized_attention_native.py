"""A decode step's attention over 8-bit KV by the native kernel (worker/engine/cpu/native/
kernels.cpp, `decode_attention`): it equals the pure-MLX quantized attention
(worker/engine/cpu/quantized_attention.py) on the default model's heads (9 query heads over 3
KV heads of 64), whatever the rows, positions, group size and the masks a decode step gets; it
reads codes whose last axis is strided; `quantized_attention` hands it exactly the calls it
takes; and a slot batch hooked with it generates the tokens the pure-MLX path generates.

The two differ in float32 rounding only: the kernel sums in another order and takes `exp`
from the C library where the pure path takes the compiled polynomial (relative error under
4e-6): outputs of about 1 agree within TOLERANCE.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import numpy as np
import pytest

from shared.queue.config import Settings
from tests.worker.test_slot_batch import BASE, WIDE_HEADS
from tests.worker.tiny_models import tiny_model
from worker.engine.batch.quantized_kv import KVQuantization
from worker.engine.batch.slot_batch import SlotBatch
from worker.engine.batch.types import Entry
from worker.engine.cpu import exponentials as cpu_exp
from worker.engine.cpu import matvec
from worker.engine.cpu.quantized_attention import Triple, quantized_attention
from worker.engine.sequence.sampling import greedy

TOLERANCE = 2e-5
HEADS, KV_HEADS, DIM = 9, 3, 64  # the default model's (SmolLM2-135M)


def _native() -> Any:
    native = matvec.native(matvec.folder(Settings().models_dir))
    assert native is not None
    return native


def _inputs(
    rows: int, positions: int, group_size: int, bits: int = 8
) -> tuple[mx.array, Triple, Triple]:
    mx.random.seed(rows * 10_007 + positions)
    queries = mx.random.normal((rows, HEADS, 1, DIM))
    shape = (rows, KV_HEADS, positions, DIM)
    keys = mx.quantize(mx.random.normal(shape), group_size=group_size, bits=bits)
    values = mx.quantize(mx.random.normal(shape) * 3, group_size=group_size, bits=bits)
    return queries, keys, values


def _mask(form: str, rows: int, positions: int) -> Any:
    """The masks a decode step gets: none, "causal" (one query: every position), a boolean
    row per row (the slot batch: each row's own length), one boolean row for all. Each row
    attends to one position at least, as every decode step's does (a row with none: the kernel
    gives 0s where the pure path gives NaNs)."""
    if form in ("none", "causal"):
        return None if form == "none" else "causal"
    if form == "shared":
        return (mx.arange(positions) < max(1, positions - 3)).reshape(1, 1, 1, positions)
    lengths = mx.array([positions - (7 * i) % positions for i in range(rows)])
    return (mx.arange(positions)[None] < lengths[:, None]).reshape(rows, 1, 1, positions)


def _attention(queries: mx.array, keys: Triple, values: Triple, mask: Any, **kw: Any) -> mx.array:
    group_size = kw.pop("group_size", 64)
    bits = kw.pop("bits", 8)
    return quantized_attention(
        queries,
        keys,
        values,
        scale=DIM**-0.5,
        mask=mask,
        group_size=group_size,
        bits=bits,
        softmax=cpu_exp.softmax,
        **kw,
    )


def _close(ours: mx.array, theirs: mx.array) -> None:
    assert ours.shape == theirs.shape
    difference = np.abs(np.array(ours) - np.array(theirs)).max()
    assert difference <= TOLERANCE, difference


@pytest.mark.parametrize("mask", ["none", "causal", "rows", "shared"])
@pytest.mark.parametrize("group_size", [64, 32])
@pytest.mark.parametrize(("rows", "positions"), [(1, 1), (1, 37), (3, 1999), (16, 2003)])
def test_the_kernel_equals_the_pure_mlx_attention(
    rows: int, positions: int, group_size: int, mask: str
) -> None:
    queries, keys, values = _inputs(rows, positions, group_size)
    allowed = _mask(mask, rows, positions)
    theirs = _attention(queries, keys, values, allowed, group_size=group_size)
    ours = _native().decode_attention(
        queries, *keys, *values, DIM**-0.5, group_size, None if mask == "causal" else allowed
    )
    _close(ours, theirs)


def test_the_kernel_reads_the_slot_batch_s_window_and_codes_strided_on_their_last_axis() -> None:
    queries, keys, values = _inputs(4, 300, 64)
    # A window of a wider buffer (what a decode step gets: the rows' first positions)...
    wide = [mx.concatenate([a, mx.zeros_like(a)], axis=2) for a in (*keys, *values)]
    window = [a[:, :, :300] for a in wide]
    # ...and codes laid out position-major, so that their last axis is strided.
    window[0] = mx.contiguous(window[0].swapaxes(-1, -2)).swapaxes(-1, -2)
    mask = _mask("rows", 4, 300)
    ours = _native().decode_attention(queries, *window, DIM**-0.5, 64, mask)
    _close(ours, _attention(queries, keys, values, mask))


class Counting:
    """The native module, counting the attention calls it is handed."""

    def __init__(self, native: Any):
        self.native = native
        self.calls = 0

    def decode_attention(self, *args: Any) -> mx.array:
        self.calls += 1
        out: mx.array = self.native.decode_attention(*args)
        return out


@pytest.mark.parametrize(
    ("case", "taken"),
    [
        ("decode, no mask", True),
        ("decode, causal", True),
        ("decode, a boolean row per row", True),
        ("decode, an additive mask", False),
        ("a prompt chunk", False),
        ("4-bit codes", False),
        ("bfloat16 queries", False),
    ],
)
def test_quantized_attention_hands_the_kernel_the_calls_it_takes(case: str, taken: bool) -> None:
    bits = 4 if case == "4-bit codes" else 8
    queries, keys, values = _inputs(2, 50, 64, bits)
    mask: Any = {"decode, causal": "causal", "decode, a boolean row per row": _mask("rows", 2, 50)}
    allowed = mask.get(case)
    if case == "decode, an additive mask":
        allowed = mx.where(_mask("rows", 2, 50), 0.0, -mx.inf)
    if case == "a prompt chunk":
        queries = mx.random.normal((2, HEADS, 5, DIM))
    if case == "bfloat16 queries":
        queries = queries.astype(mx.bfloat16)
    counting = Counting(_native())
    ours = _attention(queries, keys, values, allowed, bits=bits, native=counting)
    assert counting.calls == int(taken)
    _close(ours.astype(mx.float32), _attention(queries, keys, values, allowed, bits=bits))


def _generated(native: Any) -> list[list[int]]:
    """Three sequences of different lengths decoding together in an 8-bit slot batch of a tiny
    model whose heads are one quantization group wide, hooked with `native` (or without)."""
    model = tiny_model({**BASE, **WIDE_HEADS["qwen3_wide"]})
    assert cpu_exp.attach(model, cpu_exp.BOTH, native) > 0
    batch = SlotBatch(model, 3, frozenset(), 512, False, 512, KVQuantization(8, 64))
    prompts = [[5, 9, 11, 2, 40] * k for k in (1, 4, 9)]
    uids = batch.insert([Entry(p, [], None, 12, greedy, []) for p in prompts])
    tokens: dict[int, list[int]] = {uid: [] for uid in uids}
    finished = 0
    while finished < len(uids):
        for token in batch.next(None):
            tokens[token.uid].append(token.token)
            finished += token.finish_reason is not None
    return [tokens[uid] for uid in uids]


def test_a_slot_batch_hooked_with_the_kernel_generates_the_pure_mlx_path_s_tokens() -> None:
    counting = Counting(_native())
    assert _generated(counting) == _generated(None)
    assert counting.calls > 0  # each layer of each decode step
