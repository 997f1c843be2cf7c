"""The import's numerics (worker/gguf/weights.py): under "keep", every block type with one scale
and offset per 32 values becomes MLX's affine quantization value for value. The legacy types
are quantized by `gguf`; the K-quants, which `gguf` only reads, are random bytes (any bytes are
a valid Q4_K or Q5_K block) with sane float16 scales."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as Q
from gguf.quants import dequantize, quantize

from worker.gguf.file import Tensor
from worker.gguf.weights import convert_tensor


def blocks(kind: Q, rows: int, cols: int, rng: np.random.Generator) -> np.ndarray:
    if kind not in (Q.Q4_K, Q.Q5_K):
        values = rng.normal(0, 1, (rows, cols)).astype(np.float32)
        values[3, :32] = 0  # a block whose scale is 0
        return quantize(values, kind)
    per_block, size = GGML_QUANT_SIZES[kind]
    raw = rng.integers(0, 256, (rows, cols // per_block, size), dtype=np.uint8)
    halves = rng.uniform(0.001, 0.05, (rows, cols // per_block, 2)).astype(np.float16)
    raw[..., :4] = halves.view(np.uint8)  # d and dmin
    return raw.reshape(rows, -1)


@pytest.mark.parametrize(
    ("kind", "bits"),
    [(Q.Q4_0, 4), (Q.Q4_1, 4), (Q.Q5_0, 8), (Q.Q5_1, 8), (Q.Q8_0, 8), (Q.Q4_K, 4), (Q.Q5_K, 8)],
)
def test_keep_holds_single_scale_blocks_value_for_value(kind: Q, bits: int) -> None:
    shape = (48, 512)
    raw = blocks(kind, *shape, np.random.default_rng(int(kind)))
    tensor = Tensor(name="blk.0.attn_q.weight", ggml_type=kind, shape=shape, raw=raw)
    out = convert_tensor(tensor, "m.q_proj.weight", "keep", None)
    w, scales, biases = (out[f"m.q_proj.{part}"] for part in ("weight", "scales", "biases"))
    assert w.dtype == mx.uint32 and w.shape == (48, 512 * bits // 32)
    got = mx.dequantize(w, scales.astype(mx.float32), biases.astype(mx.float32), 32, bits)
    expected = dequantize(raw, kind).reshape(shape)
    np.testing.assert_allclose(np.array(got), expected, rtol=0, atol=1e-6)


def test_q4_requantizes_an_8_bit_block_type_to_4_bits() -> None:
    values = np.random.default_rng(1).normal(0, 1, (8, 64)).astype(np.float32)
    tensor = Tensor(name="t", ggml_type=Q.Q8_0, shape=values.shape, raw=quantize(values, Q.Q8_0))
    out = convert_tensor(tensor, "m.weight", "q4", None)
    assert out["m.weight"].shape == (8, 8) and out["m.scales"].shape == (8, 2)
