"""Prefill on MLX's CPU backend: the softmax of attention and the SiLU of the MLP in NumPy.

On Linux x86 MLX's CPU backend computes `exp` one element at a time (about 12 ns each, with
no SIMD path for that CPU), so in a prompt chunk of 512 tokens the attention's softmax and
the MLP's SiLU take about two thirds of the forward, more than every weight matrix together
(README, Benchmarks: "Where a prefill's time goes"). NumPy's `exp` is vectorised (about 1 ns an
element). So for a forward over many positions of one sequence, and only then, the scores and
the gate are evaluated, handed to NumPy for the exponentials and handed back: a sync per layer,
which a prefill chunk pays easily and a decode step (one position per row, built lazily a step
ahead, worker/engine/slot_batch.py) would not; a decode step stays on MLX's own path.

`install(model)` swaps in these functions process-wide: MLX's `scaled_dot_product_attention`
(every mlx-lm model family calls it through `mx.fast`) and the `swiglu` of the model's own
family module. It does so only on the CPU device: Metal and CUDA have fused kernels.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

import mlx.core as mx
import numpy as np
from mlx_lm.models import activations

log = logging.getLogger(__name__)

# Positions of one forward from which NumPy takes over: a decode forward has one per row.
MIN_POSITIONS = 16

_mlx_attention = mx.fast.scaled_dot_product_attention
_mlx_swiglu = activations.swiglu


def install(model: Any) -> bool:
    """Route the model's prefill exponentials through NumPy, on the CPU device; True if so."""
    if mx.default_device() != mx.cpu:
        return False
    for owner, name, _, ours in swaps(model):
        setattr(owner, name, ours)
    log.info("prefill on the CPU: softmax and SiLU in NumPy from %d positions", MIN_POSITIONS)
    return True


def swaps(model: Any) -> list[tuple[Any, str, Any, Any]]:
    """What `install` replaces: (owner, attribute, MLX's function, this module's)."""
    out: list[tuple[Any, str, Any, Any]] = [
        (mx.fast, "scaled_dot_product_attention", _mlx_attention, attention)
    ]
    family = sys.modules[type(model).__module__]
    if getattr(family, "swiglu", None) in (_mlx_swiglu, swiglu):
        out.append((family, "swiglu", _mlx_swiglu, swiglu))
    return out


def attention(
    queries: mx.array,
    keys: mx.array,
    values: mx.array,
    *,
    scale: float,
    mask: mx.array | str | None = None,
    sinks: mx.array | None = None,
    stream: Any = None,
) -> mx.array:
    """MLX's scaled dot-product attention, its softmax in NumPy when the queries are many."""
    b, heads, length, dim = queries.shape
    if length < MIN_POSITIONS or sinks is not None or stream is not None:
        return _mlx_attention(
            queries, keys, values, scale=scale, mask=mask, sinks=sinks, stream=stream
        )
    groups, positions = keys.shape[1], keys.shape[2]
    repeat = heads // groups  # query heads per key head (grouped-query attention)
    grouped = (queries * scale).reshape(b, groups, repeat, length, dim)
    scores = (grouped @ keys[:, :, None].swapaxes(-1, -2)).astype(mx.float32)
    weights = _softmax(np.array(scores).reshape(b, heads, length, positions), mask)
    out = mx.array(weights.reshape(b, groups, repeat, length, positions)).astype(values.dtype)
    return (out @ values[:, :, None]).reshape(b, heads, length, dim)


def _softmax(scores: np.ndarray, mask: mx.array | str | None) -> np.ndarray:
    """Softmax over the last axis, in place, with MLX's mask conventions."""
    if isinstance(mask, str):  # "causal": the queries are the last positions
        length, positions = scores.shape[-2:]
        mask = mx.arange(positions)[None] <= mx.arange(length)[:, None] + (positions - length)
    if mask is not None:
        allowed = np.array(mask)
        if allowed.dtype == np.bool_:
            np.copyto(scores, -np.inf, where=~allowed)
        else:
            scores += allowed
    with np.errstate(invalid="ignore", over="ignore"):
        scores -= scores.max(axis=-1, keepdims=True)
        np.exp(scores, out=scores)
        scores /= scores.sum(axis=-1, keepdims=True)
    return scores


def swiglu(gate: mx.array, x: mx.array) -> mx.array:
    """mlx-lm's `silu(gate) * x`, the exponential in NumPy when the positions are many."""
    if gate.ndim < 2 or gate.shape[-2] < MIN_POSITIONS:
        gated: mx.array = _mlx_swiglu(gate, x)
        return gated
    g = np.array(gate.astype(mx.float32))
    with np.errstate(over="ignore"):
        e = np.exp(-g)
    e += 1.0
    np.divide(g, e, out=g)
    return mx.array(g).astype(x.dtype) * x
