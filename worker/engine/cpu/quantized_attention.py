"""Attention over quantized keys and values on MLX's CPU backend (MLXQ_KV_BITS).

A quantized position of one head is, group by group, `scale * codes + bias`. So a query's score
against it is `scale * (query . codes) + bias * sum(query)` summed over the groups, and a
weighted sum of values is `(weights * scale) @ codes + weights @ bias`. The keys and values are
never dequantized.

A decode step (one query position per row) over 8-bit codes, float32, goes to the native
module's `decode_attention` (worker/engine/cpu/native/kernels.cpp, built and loaded by
worker/engine/cpu/matvec.py), when the model was loaded with it: it turns the codes into floats
eight at a time in registers and does the masked softmax itself, so it reads a quarter of the
bytes float KV takes and writes no float copy. Everything else takes the pure-MLX path below:
prompt chunks (many query positions), 4-bit codes, an additive mask, other dtypes, and a worker
without the native module.

The pure-MLX path runs float matmuls over the codes cast to float, and a few products with the
scales and biases: casting the codes is a plain conversion, where MLX's CPU `dequantize` and
`quantized_matmul` run slower (measured on this CPU with the default model's heads, 16 rows
of 2,000 positions, 8 bits, per layer: float attention 20.7 ms, this 36.8 ms, mlx-lm's
quantized attention 54.7 ms; 1 row of 8,000 positions: 4.1, 4.1 and 8.6 ms;
docs/benchmarks.md, "Quantized KV"). But the cast writes a float copy, 4x the codes' bytes: the
native kernel took 6.9 ms where this took 17.2 ms on the same inputs (16 rows of 2,000
positions, load about 2.5), and a decode step of 16 such rows 275 ms where this path's took
362 ms and float KV's 369 ms. It takes a few rows at a time (CAST_ELEMENTS). The worker routes
8-bit KV here (worker/engine/cpu/exponentials.py); 4-bit codes, two to a byte, unpack slower
than mlx-lm's `quantized_matmul` runs, so those go to mlx-lm's attention.

The pure path's softmax is the caller's (worker/engine/cpu/exponentials.py: NumPy's for a
prompt chunk, the compiled polynomial in decode), so quantized and float attention share it.
The native kernel's takes `exp` from the C library; the two agree within float32 rounding
(tests/worker/test_quantized_attention_native.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import mlx.core as mx

Triple = tuple[mx.array, mx.array, mx.array]  # codes, scales, biases (mx.quantize's)
Softmax = Callable[[mx.array, Any], mx.array]  # scores [b, heads, queries, positions], mask
# Codes one pass casts to float at most: the casts of 16 rows of 2,000 positions at once (25 MB
# per layer for the default model) ran 1.8x float attention at a load of 2.5 and 8x at 14,
# passes of this size about 1.15x (fresh large buffers cost page faults, worse under load).
CAST_ELEMENTS = 1 << 20
# The native kernel's bounds (kMaxRepeat, kMaxDim in native/kernels.cpp).
MAX_REPEAT, MAX_DIM = 16, 256


def codes(words: mx.array, bits: int, dtype: mx.Dtype) -> mx.array:
    """The quantized values packed in uint32 `words` (`mx.quantize`'s order: the lowest bits
    first), one per element, as `dtype`."""
    octets = mx.view(words, mx.uint8)
    if bits == 8:
        return octets.astype(dtype)
    low, high = octets & 15, octets >> 4  # bits == 4: two values per byte
    return mx.stack([low, high], axis=-1).reshape(*words.shape[:-1], -1).astype(dtype)


def quantized_attention(
    queries: mx.array,
    keys: Triple,
    values: Triple,
    *,
    scale: float,
    mask: Any,
    group_size: int,
    bits: int,
    softmax: Softmax,
    native: Any = None,
) -> mx.array:
    """Scaled dot-product attention of `queries` [b, heads, length, dim] over quantized `keys`
    and `values` ([b, kv heads, positions, ...] each), grouped-query heads included: by the
    `native` module's kernel where it takes them (`native_takes`), else a few rows at a time,
    so that the codes cast to float stay small (see CAST_ELEMENTS)."""
    if native is not None and native_takes(queries, keys, values, mask, group_size, bits):
        # "causal" over one query position, like no mask, leaves every position to attend
        allowed = None if isinstance(mask, str) else mask
        out: mx.array = native.decode_attention(queries, *keys, *values, scale, group_size, allowed)
        return out
    attend = _Pass(scale, group_size, bits, softmax)
    b = queries.shape[0]
    rows = max(1, CAST_ELEMENTS // keys[0][0].size // (32 // bits))  # rows a pass casts
    if b <= rows:
        return attend(queries, keys, values, mask)
    parts = []
    for i in range(0, b, rows):
        part = slice(i, i + rows)
        row_mask = mask[part] if isinstance(mask, mx.array) and mask.shape[0] == b else mask
        parts.append(attend(queries[part], _rows(keys, part), _rows(values, part), row_mask))
    return mx.concatenate(parts, axis=0)


def native_takes(
    queries: mx.array,
    keys: Triple,
    values: Triple,
    mask: Any,
    group_size: int,
    bits: int,
) -> bool:
    """Whether the native kernel (worker/engine/cpu/native/kernels.cpp, `decode_attention`)
    takes this call: a decode step's (one query position per row) over 8-bit codes, float32
    throughout, heads and groups within its bounds, and no mask (or "causal", the same for one
    position) or a boolean one [b or 1, 1, 1, positions]; an additive mask is not taken."""
    b, heads, length, dim = queries.shape
    kv_heads, positions = keys[0].shape[1], keys[0].shape[2]
    floats = (queries, keys[1], keys[2], values[1], values[2])
    return (
        bits == 8
        and length == 1
        and all(a.dtype == mx.float32 for a in floats)
        and heads % kv_heads == 0
        and heads // kv_heads <= MAX_REPEAT
        and dim <= MAX_DIM
        and group_size % 8 == 0
        and dim % group_size == 0
        and (mask is None or isinstance(mask, str) or _row_mask(mask, b, positions))
    )


def _row_mask(mask: Any, rows: int, positions: int) -> bool:
    return (
        isinstance(mask, mx.array)
        and mask.dtype == mx.bool_
        and mask.ndim == 4
        and mask.shape[0] in (1, rows)
        and mask.shape[1:] == (1, 1, positions)
    )


def _rows(triple: Triple, part: slice) -> Triple:
    codes, scales, biases = triple
    return codes[part], scales[part], biases[part]


@dataclass(frozen=True)
class _Pass:
    """One call's settings, for each pass over a few of its rows."""

    scale: float
    group_size: int
    bits: int
    softmax: Softmax

    def __call__(self, queries: mx.array, keys: Triple, values: Triple, mask: Any) -> mx.array:
        scale, group_size, bits, softmax = self.scale, self.group_size, self.bits, self.softmax
        b, heads, length, dim = queries.shape
        kv_heads, positions = keys[0].shape[1], keys[0].shape[2]
        rows = heads // kv_heads * length  # the queries each KV head answers
        grouped = (queries * scale).reshape(b, kv_heads, rows, dim)
        key_codes = codes(keys[0], bits, queries.dtype)
        value_codes = codes(values[0], bits, queries.dtype)
        groups = dim // group_size
        if groups == 1:  # one scale and bias per position and head: no group axis
            scores = (grouped @ key_codes.swapaxes(-1, -2)) * keys[1].swapaxes(-1, -2)
            scores = scores + grouped.sum(-1, keepdims=True) * keys[2].swapaxes(-1, -2)
            weights = _softmaxed(softmax, scores, mask, (b, heads, length, positions))
            out = (weights * values[1].swapaxes(-1, -2)) @ value_codes + weights @ values[2]
            return out.reshape(b, heads, length, dim)
        # The group axis leads the matmuls: [b, kv heads, groups, rows or positions, group_size].
        split = grouped.reshape(b, kv_heads, rows, groups, group_size).transpose(0, 1, 3, 2, 4)
        key_groups = key_codes.reshape(b, kv_heads, positions, groups, group_size)
        key_scales, key_biases = (a.transpose(0, 1, 3, 2)[..., None, :] for a in keys[1:])
        parts = (split @ key_groups.transpose(0, 1, 3, 4, 2)) * key_scales
        scores = (parts + split.sum(-1, keepdims=True) * key_biases).sum(axis=2)
        weights = _softmaxed(softmax, scores, mask, (b, heads, length, positions))
        value_groups = value_codes.reshape(b, kv_heads, positions, groups, group_size)
        scaled = weights[:, :, None] * values[1].transpose(0, 1, 3, 2)[..., None, :]
        out = scaled @ value_groups.transpose(0, 1, 3, 2, 4)
        out = out + (weights @ values[2]).transpose(0, 1, 3, 2)[..., None]
        return out.transpose(0, 1, 3, 2, 4).reshape(b, heads, length, dim)


def _softmaxed(
    softmax: Softmax, scores: mx.array, mask: Any, shape: tuple[int, int, int, int]
) -> mx.array:
    """The attention weights, back in the grouped layout [b, kv heads, rows, positions]."""
    b, _, _, positions = shape
    weights = softmax(scores.astype(mx.float32).reshape(shape), mask)
    return weights.reshape(b, scores.shape[1], -1, positions).astype(scores.dtype)
