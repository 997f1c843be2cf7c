"""Turn a GGUF's tensors into MLX arrays under the import's dtype.

This module owns the numerics of the import: which tensors are kept as float, which become
MLX's affine 4- or 8-bit quantization (group size 32, GGUF's block size), and how. Under
"keep", Q4_0, Q4_1 and Q8_0 blocks are rewritten into MLX's layout bit for bit (both are
scale-and-offset codes over 32 values); every other block type (the K-quants, Q5, IQ) is
dequantized by `gguf` and quantized again by MLX, to 4 bits where the type has 4 or fewer, else
to 8, so no tensor loses more precision than the file already did.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import mlx.core as mx
import numpy as np
from gguf import GGMLQuantizationType as T

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
    exact_bits, transcode = _TRANSCODERS.get(tensor.ggml_type, (None, None))
    if transcode is not None and exact_bits == bits:  # the file's own codes, unchanged
        codes, scales, biases = transcode(tensor)
        packed = _pack(codes, bits)
    else:
        values = mx.array(tensor.dequantized())
        packed, scales, biases = mx.quantize(values, group_size=GROUP_SIZE, bits=bits)
        scales, biases = scales.astype(mx.float16), biases.astype(mx.float16)
    return {f"{prefix}.weight": packed, f"{prefix}.scales": scales, f"{prefix}.biases": biases}


def _pack(codes: np.ndarray[Any, Any], bits: int) -> mx.array:
    """MLX's layout: codes packed into uint32 words, the first code in the lowest bits."""
    if bits == 4:
        codes = codes[..., 0::2] | (codes[..., 1::2] << 4)
    packed = np.ascontiguousarray(codes.astype(np.uint8)).view(np.uint32)
    return mx.array(packed)


Transcoded = tuple[np.ndarray[Any, Any], mx.array, mx.array]


def _blocks(tensor: Tensor, block_bytes: int) -> np.ndarray[Any, Any]:
    rows = tensor.shape[0]
    return np.asarray(tensor.raw, dtype=np.uint8).reshape(rows, -1, block_bytes)


def _halves(blocks: np.ndarray[Any, Any], at: int) -> np.ndarray[Any, Any]:
    return np.ascontiguousarray(blocks[..., at : at + 2]).view(np.float16)[..., 0]


def _nibbles(packed: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    # ggml: byte j holds value j in its low nibble and value j + 16 in its high nibble.
    return np.concatenate([packed & 0x0F, packed >> 4], axis=-1)


def _q8_0(tensor: Tensor) -> Transcoded:
    blocks = _blocks(tensor, 34)  # float16 scale d, 32 int8 codes q: value = d * q
    d = _halves(blocks, 0)
    codes = (blocks[..., 2:].view(np.int8).astype(np.int16) + 128).astype(np.uint8)
    return codes.reshape(tensor.shape), mx.array(d), mx.array(d * np.float16(-128))


def _q4_0(tensor: Tensor) -> Transcoded:
    blocks = _blocks(tensor, 18)  # float16 d, 16 bytes of 4-bit q: value = d * (q - 8)
    d = _halves(blocks, 0)
    codes = _nibbles(blocks[..., 2:]).reshape(tensor.shape)
    return codes, mx.array(d), mx.array(d * np.float16(-8))


def _q4_1(tensor: Tensor) -> Transcoded:
    blocks = _blocks(tensor, 20)  # float16 d and m, 16 bytes of 4-bit q: value = d * q + m
    d, m = _halves(blocks, 0), _halves(blocks, 2)
    codes = _nibbles(blocks[..., 4:]).reshape(tensor.shape)
    return codes, mx.array(d), mx.array(m)


_TRANSCODERS: dict[T, tuple[int, Callable[[Tensor], Transcoded]]] = {
    T.Q8_0: (8, _q8_0),
    T.Q4_0: (4, _q4_0),
    T.Q4_1: (4, _q4_1),
}
