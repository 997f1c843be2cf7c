"""Turn a GGUF's tensors into MLX arrays under the import's dtype.

This module owns the numerics of the import: which tensors are kept as float, which become
MLX's affine 4- or 8-bit quantization (group size 32, GGUF's block size), and how. Under
"keep", Q4_0, Q4_1 and Q4_K become MLX 4-bit and Q5_0, Q5_1, Q5_K and Q8_0 MLX 8-bit, value for
value (each gives every 32 values one scale and one offset, as MLX's groups do); the block types
with 16-value scales or lookup tables (Q2_K, Q3_K, Q6_K, IQ), which MLX's groups of 32 cannot
hold, are dequantized by `gguf` and quantized again by MLX, to 4 bits where the type has 4 or
fewer, else to 8.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import numpy as np
from gguf import GGMLQuantizationType as T
from gguf.quants import Q4_K

from shared.wire.errors import ModelImportError
from worker.gguf import DTYPES
from worker.gguf.file import FLOAT_TYPES, Tensor

GROUP_SIZE = 32  # GGUF's own block of 32 values; MLX supports it
Weights = dict[str, mx.array]
FloatFix = Callable[[str, np.ndarray[Any, Any]], np.ndarray[Any, Any]]

FLOAT_DTYPES = {"float32": mx.float32, "float16": mx.float16, "bfloat16": mx.bfloat16}
QUANTIZED_DTYPES = {"q4": 4, "q8": 8}

_FOUR_BIT_OR_LESS = frozenset(
    {
        *(T.Q4_0, T.Q4_1, T.Q2_K, T.Q3_K, T.Q4_K, T.IQ4_NL, T.IQ4_XS, T.IQ3_S, T.IQ3_XXS),
        *(T.IQ2_XXS, T.IQ2_XS, T.IQ2_S, T.IQ1_S, T.IQ1_M, T.TQ1_0, T.TQ2_0),
    }
)
_STORED_FLOAT = {T.F32: mx.float32, T.F16: mx.float16, T.BF16: mx.bfloat16}


def convert_tensor(tensor: Tensor, name: str, dtype: str, fix: FloatFix | None) -> Weights:
    """`tensor` as MLX arrays under mlx-lm's `name`: `name` alone, or with its .scales and
    .biases when quantized. `fix` rewrites float values the way mlx-lm expects them (Gemma's
    norms); a tensor it applies to is never quantized."""
    if dtype not in DTYPES:
        raise ModelImportError(f"dtype must be one of {', '.join(DTYPES)}, not {dtype!r}")
    bits = None if fix is not None else _target_bits(tensor, name, dtype)
    if bits is not None:
        return _quantized(tensor, name, bits)
    values = tensor.dequantized()
    if fix is not None:
        values = fix(name, values)
    return {name: mx.array(values).astype(_float_dtype(tensor, dtype))}


def _target_bits(tensor: Tensor, name: str, dtype: str) -> int | None:
    quantizable = (
        name.endswith(".weight") and len(tensor.shape) == 2 and tensor.shape[1] % GROUP_SIZE == 0
    )
    if not quantizable or dtype in FLOAT_DTYPES:
        return None
    if dtype in QUANTIZED_DTYPES:
        return QUANTIZED_DTYPES[dtype]
    if tensor.ggml_type in FLOAT_TYPES:  # "keep": float stays float
        return None
    return 4 if tensor.ggml_type in _FOUR_BIT_OR_LESS else 8


def _float_dtype(tensor: Tensor, dtype: str) -> mx.Dtype:
    if dtype in FLOAT_DTYPES:
        return FLOAT_DTYPES[dtype]
    # "keep" (and the unquantized tensors of q4/q8): the stored float type, else float32.
    return _STORED_FLOAT.get(tensor.ggml_type, mx.float32)


def _quantized(tensor: Tensor, name: str, bits: int) -> Weights:
    prefix = name.removesuffix(".weight")
    exact = _EXACT.get(tensor.ggml_type)
    if exact is not None and exact.bits == bits:  # the file's own codes, unchanged
        codes, scales, biases = _transcoded(tensor, exact)
        packed = _pack(codes, bits)
    else:
        values = mx.array(tensor.dequantized())
        packed, scales, biases = mx.quantize(values, group_size=GROUP_SIZE, bits=bits)
        scales, biases = scales.astype(mx.float16), biases.astype(mx.float16)
    return {f"{prefix}.weight": packed, f"{prefix}.scales": scales, f"{prefix}.biases": biases}


def _pack(codes: np.ndarray[Any, Any], bits: int) -> mx.array:
    """MLX's layout: codes packed into uint32 words, the first code in the lowest bits."""
    codes = codes.astype(np.uint8)
    if bits == 4:
        codes = codes[..., 0::2] | (codes[..., 1::2] << 4)
    return mx.array(np.ascontiguousarray(codes).view(np.uint32))


Grid = tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]  # (scale, bias) per 32 values


def _half(blocks: np.ndarray[Any, Any], at: int) -> np.ndarray[Any, Any]:
    """The float16 at byte `at` of each block, as float32."""
    return (
        np.ascontiguousarray(blocks[..., at : at + 2]).view(np.float16)[..., 0].astype(np.float32)
    )


def _offset_grid(offset: int) -> Callable[[np.ndarray[Any, Any]], Grid]:
    """value = d * (q - offset): scale d, bias -offset * d."""

    def read(blocks: np.ndarray[Any, Any]) -> Grid:
        d = _half(blocks, 0)
        return d, d * -offset

    return read


def _min_grid(blocks: np.ndarray[Any, Any]) -> Grid:
    """value = d * q + m, m the float16 after d."""
    return _half(blocks, 0), _half(blocks, 2)


def _k_grid(blocks: np.ndarray[Any, Any]) -> Grid:
    """Q4_K and Q5_K: a 256-value super-block of eight 32-value sub-blocks, each with 6-bit
    scale sc and min m (packed as gguf's Q4_K.get_scale_min reads them): value =
    d * sc * q - dmin * m."""
    rows, supers = blocks.shape[:2]
    sc, m = Q4_K.get_scale_min(np.ascontiguousarray(blocks[..., 4:16]).reshape(-1, 12))
    d, dmin = _half(blocks, 0)[..., None], _half(blocks, 2)[..., None]
    scale = d * sc.reshape(rows, supers, 8).astype(np.float32)
    bias = -dmin * m.reshape(rows, supers, 8).astype(np.float32)
    return scale.reshape(rows, -1), bias.reshape(rows, -1)


@dataclass(frozen=True)
class _Codes:
    """A block type whose every 32 values share one scale and one offset, as MLX's groups do:
    MLX's affine quantization in `bits` holds it value for value, its scales in `scales_dtype`
    (float16 holds d and -offset * d exactly; d * sc needs float32)."""

    bits: int
    block_bytes: int
    grid: Callable[[np.ndarray[Any, Any]], Grid]
    scales_dtype: mx.Dtype = mx.float16


_EXACT = {
    T.Q4_0: _Codes(4, 18, _offset_grid(8)),
    T.Q4_1: _Codes(4, 20, _min_grid),
    T.Q5_0: _Codes(8, 22, _offset_grid(16)),
    T.Q5_1: _Codes(8, 24, _min_grid),
    T.Q8_0: _Codes(8, 34, _offset_grid(128)),  # int8 q: q + 128 is the code
    T.Q4_K: _Codes(4, 144, _k_grid, mx.float32),
    T.Q5_K: _Codes(8, 176, _k_grid, mx.float32),
}


def _transcoded(tensor: Tensor, kind: _Codes) -> tuple[np.ndarray[Any, Any], mx.array, mx.array]:
    """(codes, scales, biases): the grid read from the blocks, the codes recovered from the
    values `gguf` decodes (exactly: value - bias is the scale times a small integer)."""
    rows = tensor.shape[0]
    scale, bias = kind.grid(
        np.asarray(tensor.raw, dtype=np.uint8).reshape(rows, -1, kind.block_bytes)
    )
    scale, bias = scale.reshape(rows, -1, 1), bias.reshape(rows, -1, 1)
    # In place: the values of a large embedding are gigabytes as float32.
    codes = tensor.dequantized().reshape(rows, -1, GROUP_SIZE)
    codes -= bias
    np.divide(codes, scale, out=codes, where=scale != 0)
    codes[np.broadcast_to(scale == 0, codes.shape)] = 0
    np.rint(codes, out=codes)
    np.clip(codes, 0, (1 << kind.bits) - 1, out=codes)
    codes = codes.reshape(tensor.shape)
    stored = kind.scales_dtype
    return codes, mx.array(scale[..., 0]).astype(stored), mx.array(bias[..., 0]).astype(stored)
