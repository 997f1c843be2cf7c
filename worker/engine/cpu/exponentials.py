"""The exponentials of a forward on MLX's CPU backend: a prompt chunk's in NumPy, a decode
forward's as a compiled polynomial.

On Linux x86 MLX's CPU backend computes `exp` one element at a time (about 12 ns each, with
no SIMD path for that CPU), so in a prompt chunk of 512 tokens the attention's softmax and
the MLP's SiLU take about two thirds of the forward, more than every weight matrix together
(docs/benchmarks.md, "Prefill on the CPU"). NumPy's `exp` is vectorised (about 1 ns an
element). So for a forward over many positions of one sequence (`MIN_POSITIONS`), the scores
and the gate are evaluated, handed to NumPy for the exponentials and handed back: a sync per
layer, which a prefill chunk pays easily.

A decode forward (one position per row) is built lazily a step ahead of the one being read
(worker/engine/batch/slot_batch.py): a sync per layer would undo that. Its softmax and SiLU take an
`exp` made of multiplies and adds instead (2^n from the exponent bits times a polynomial of the
remainder, Cephes' coefficients, relative error under 4e-6), inside `mx.compile`: MLX fuses
the elementwise chain into one C++ kernel that the host compiler vectorises, about 3.5x MLX's
`exp`, and nothing waits.

`install(model, ...)` swaps in these functions process-wide: MLX's
`scaled_dot_product_attention` (every mlx-lm model family calls it through `mx.fast`) and the
`swiglu` of the model's own family module. It does so only on the CPU device: Metal and CUDA
have fused kernels.
"""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import numpy as np
from mlx_lm.models import activations

log = logging.getLogger(__name__)

# Positions of one forward from which NumPy takes over: a decode forward has one per row.
MIN_POSITIONS = 16

_mlx_attention = mx.fast.scaled_dot_product_attention
_mlx_swiglu = activations.swiglu


@dataclass(frozen=True)
class Routes:
    """Which forwards leave MLX's own exponentials: prompt chunks (NumPy), decode (polynomial)."""

    prefill: bool = True
    decode: bool = True


BOTH = Routes()  # the default: prompt chunks and decode forwards
_routes = BOTH


def install(model: Any, routes: Routes) -> bool:
    """Route the model's exponentials as `routes` says, on the CPU device; True if any."""
    global _routes
    if mx.default_device() != mx.cpu or not (routes.prefill or routes.decode):
        return False
    _routes = routes
    for owner, name, _, ours in swaps(model):
        setattr(owner, name, ours)
    log.info(
        "exponentials on the CPU: prompt chunks from %d positions in NumPy: %s; decode forwards "
        "as a compiled polynomial: %s",
        MIN_POSITIONS,
        routes.prefill,
        routes.decode,
    )
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
    """MLX's scaled dot-product attention, its softmax routed by the number of queries."""
    b, heads, length, dim = queries.shape
    chunk = length >= MIN_POSITIONS
    if (
        sinks is not None
        or stream is not None
        or not (_routes.prefill if chunk else _routes.decode)
    ):
        return _mlx_attention(
            queries, keys, values, scale=scale, mask=mask, sinks=sinks, stream=stream
        )
    groups, positions = keys.shape[1], keys.shape[2]
    repeat = heads // groups  # query heads per key head (grouped-query attention)
    grouped = (queries * scale).reshape(b, groups, repeat, length, dim)
    scores = (grouped @ keys[:, :, None].swapaxes(-1, -2)).astype(mx.float32)
    if chunk:
        weights = mx.array(_softmax(np.array(scores).reshape(b, heads, length, positions), mask))
    else:
        weights = _compiled_softmax(scores.reshape(b, heads, length, positions), mask)
    out = weights.reshape(b, groups, repeat, length, positions).astype(values.dtype)
    return (out @ values[:, :, None]).reshape(b, heads, length, dim)


def swiglu(gate: mx.array, x: mx.array) -> mx.array:
    """mlx-lm's `silu(gate) * x`, its exponential routed by the number of positions."""
    chunk = gate.ndim >= 2 and gate.shape[-2] >= MIN_POSITIONS
    if not (_routes.prefill if chunk else _routes.decode):
        gated: mx.array = _mlx_swiglu(gate, x)
        return gated
    if not chunk:
        return _poly_swiglu(gate, x)
    g = np.array(gate.astype(mx.float32))
    with np.errstate(over="ignore"):
        e = np.exp(-g)
    e += 1.0
    np.divide(g, e, out=g)
    return mx.array(g).astype(x.dtype) * x


def _causal(length: int, positions: int) -> mx.array:
    """MLX's "causal" mask: the queries are the last `length` of `positions`."""
    return mx.arange(positions)[None] <= mx.arange(length)[:, None] + (positions - length)


def _softmax(scores: np.ndarray, mask: mx.array | str | None) -> np.ndarray:
    """Softmax over the last axis in NumPy, in place, with MLX's mask conventions."""
    if isinstance(mask, str):
        mask = _causal(*scores.shape[-2:])
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


# exp(x) = 2^n * exp(r), n = round(x / ln 2), r = x - n ln 2 (ln 2 in two parts, so r is exact)
_LOG2E = 1.4426950408889634
_LN2_HI, _LN2_LO = 0.693359375, -2.12194440e-4
_POLY = (
    1.9875691500e-4,
    1.3981999507e-3,
    8.3334519073e-3,
    4.1665795894e-2,
    1.6666665459e-1,
    5.0000001201e-1,
)
_EXP_MIN, _EXP_MAX = -87.0, 88.0  # float32's normal range: 2^n from the exponent bits


def poly_exp(x: mx.array) -> mx.array:
    """`exp` of a float32 array in multiplies and adds (0 below -87, clipped above 88)."""
    clipped = mx.clip(x, _EXP_MIN, _EXP_MAX)
    n = mx.floor(clipped * _LOG2E + 0.5)
    r = clipped - n * _LN2_HI - n * _LN2_LO
    p = mx.array(_POLY[0], mx.float32)
    for c in _POLY[1:]:
        p = p * r + c
    p = p * (r * r) + r + 1.0
    two_n = mx.view((n.astype(mx.int32) + 127) << 23, mx.float32)
    return mx.where(x < _EXP_MIN, 0.0, p * two_n)


def _softmax_of(scores: mx.array) -> mx.array:
    e = poly_exp(scores - mx.max(scores, axis=-1, keepdims=True))
    return e / mx.sum(e, axis=-1, keepdims=True)


@mx.compile
def _softmax_plain(scores: mx.array) -> mx.array:
    return _softmax_of(scores)


@mx.compile
def _softmax_allowed(scores: mx.array, allowed: mx.array) -> mx.array:
    return _softmax_of(mx.where(allowed, scores, -mx.inf))


@mx.compile
def _softmax_added(scores: mx.array, added: mx.array) -> mx.array:
    return _softmax_of(scores + added)


def _compiled_softmax(scores: mx.array, mask: mx.array | str | None) -> mx.array:
    """Softmax over the last axis with the polynomial `exp`, MLX's mask conventions. The
    compiled functions are traced again for each new shape (cheap: the kernels are reused)."""
    if isinstance(mask, str):
        length, positions = scores.shape[-2:]
        mask = None if length == 1 else _causal(length, positions)
    if mask is None:
        return _softmax_plain(scores)
    if mask.dtype == mx.bool_:
        return _softmax_allowed(scores, mask)
    return _softmax_added(scores, mask.astype(mx.float32))


@mx.compile
def _poly_swiglu_f32(gate: mx.array, x: mx.array) -> mx.array:
    return gate / (1.0 + poly_exp(-gate)) * x


def _poly_swiglu(gate: mx.array, x: mx.array) -> mx.array:
    out = _poly_swiglu_f32(gate.astype(mx.float32), x.astype(mx.float32))
    return out.astype(x.dtype)
