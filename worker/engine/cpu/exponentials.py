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

`attach(model, routes)` hooks these functions onto one loaded model, and only that one. mlx-lm's
model families call `scaled_dot_product_attention` (mlx-lm's, which calls MLX's) and `swiglu`
by name from their layers' forwards (`Attention.__call__`, `MLP.__call__`). Each of the model's
layers whose forward names one of them gets a subclass made for this model, whose forward is
the family's own code run against the family's names with those two replaced by this model's
`Exponentials`: its routes and the functions they route to. MLX and mlx-lm are left as they
are, so any other model in the process (plain `mlx_lm.load`'s included) runs MLX's own
functions, and the routing goes away with the model.

What the hook adds to a forward: the family's bytecode looks its names up in another
dictionary, and each routed call is a bound method plus a route check (under a microsecond per
layer). Measured on the default model, the Python that builds one decode forward of one row
(300 interleaved rounds on a busy 2-core machine): 4.50 ms hooked against 4.42 ms with the same
functions patched into MLX and mlx-lm process-wide, at the 10th percentile; 8.46 against
8.45 ms at the median: nothing measurable beside a forward of about 100 ms there.
Families that call MLX's `mx.fast.scaled_dot_product_attention` directly (3 of the 104 model
files of mlx-lm 0.32 that attend: deepseek_v41, muse_spark, plamo2) keep MLX's attention.
This happens only on the CPU device: Metal and CUDA have fused kernels.
Attention over a quantized cache (MLXQ_KV_BITS) takes the same softmax in
worker/engine/cpu/quantized_attention.py, but for a decode step over 8-bit KV, whose native
kernel (given to `attach`) does its own softmax.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from types import CodeType, FunctionType
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx_lm.models import activations, base

from worker.engine.cpu.quantized_attention import quantized_attention

log = logging.getLogger(__name__)

# Positions of one forward from which NumPy takes over: a decode forward has one per row.
MIN_POSITIONS = 16


@dataclass(frozen=True)
class Routes:
    """Which forwards leave MLX's own exponentials: prompt chunks (NumPy), decode (polynomial)."""

    prefill: bool = True
    decode: bool = True

    def take(self, positions: int) -> bool:
        """Whether a forward of `positions` positions per row takes this module's functions."""
        return self.prefill if positions >= MIN_POSITIONS else self.decode


BOTH = Routes()  # the default: prompt chunks and decode forwards


@dataclass(frozen=True)
class Exponentials:
    """One model's exponentials: what its family's two names stand for in its layers' forwards,
    each keeping mlx-lm's signature and falling back to mlx-lm's function off its routes;
    `native`: worker/engine/cpu/matvec.py's loaded module, whose kernel takes a decode step's
    attention over 8-bit KV (None: the pure-MLX quantized attention)."""

    routes: Routes
    native: Any = None

    def scaled_dot_product_attention(
        self,
        queries: mx.array,
        keys: Any,
        values: Any,
        cache: Any,
        scale: float,
        mask: mx.array | str | None,
        sinks: mx.array | None = None,
    ) -> mx.array:
        ours = sinks is None and self.routes.take(queries.shape[2])
        if hasattr(cache, "bits"):  # a quantized cache hands over (codes, scales, biases)
            # 4-bit codes unpack slowly here: mlx-lm's quantized_matmul measured faster for them.
            if ours and cache.bits == 8:
                return quantized_attention(
                    queries,
                    keys,
                    values,
                    scale=scale,
                    mask=mask,
                    group_size=cache.group_size,
                    bits=cache.bits,
                    softmax=softmax,
                    native=self.native,
                )
        elif ours:
            return attention(queries, keys, values, scale=scale, mask=mask)
        theirs: mx.array = base.scaled_dot_product_attention(
            queries, keys, values, cache=cache, scale=scale, mask=mask, sinks=sinks
        )
        return theirs

    def swiglu(self, gate: mx.array, x: mx.array) -> mx.array:
        if not self.routes.take(_positions(gate)):
            theirs: mx.array = activations.swiglu(gate, x)
            return theirs
        return swiglu(gate, x)


# The names a family's forwards call, and what mlx-lm binds them to.
_THEIRS = {
    "scaled_dot_product_attention": base.scaled_dot_product_attention,
    "swiglu": activations.swiglu,
}


def attach(model: nn.Module, routes: Routes, native: Any = None) -> int:
    """On the CPU device, route the model's exponentials as `routes` says (and its decode
    attention over 8-bit KV through `native`'s kernel, if given): the number of its layers
    whose forwards now call this module's functions (0: it runs MLX's own)."""
    if mx.default_device() != mx.cpu or not (routes.prefill or routes.decode):
        return 0
    hook = _Hook(Exponentials(routes, native))
    routed = 0
    for _, layer in model.named_modules():
        routed_class = hook.subclass(type(layer))
        if routed_class is not None:
            layer.__class__ = routed_class
            routed += 1
    log.info(
        "exponentials on the CPU for %d layers of %s: prompt chunks from %d positions in NumPy: "
        "%s; decode forwards as a compiled polynomial: %s",
        routed,
        type(model).__module__,
        MIN_POSITIONS,
        routes.prefill,
        routes.decode,
    )
    return routed


def routes_of(layer: nn.Module) -> Routes | None:
    """The routes a layer's forward takes, if `attach` hooked it."""
    exponentials = getattr(type(layer), "cpu_exponentials", None)
    return exponentials.routes if isinstance(exponentials, Exponentials) else None


class _Hook:
    """What `attach` makes for one model: a routed subclass per layer class (None where no
    forward of the class names a routed function) and a routed copy of each family module's
    names, all held by the model's layers alone."""

    def __init__(self, exponentials: Exponentials):
        self._exponentials = exponentials
        self._ours = {
            "scaled_dot_product_attention": exponentials.scaled_dot_product_attention,
            "swiglu": exponentials.swiglu,
        }
        self._classes: dict[type, type | None] = {}
        self._scopes: dict[int, dict[str, Any]] = {}

    def subclass(self, layer_class: type) -> type | None:
        if layer_class not in self._classes:
            methods = dict(self._routed_methods(layer_class))
            self._classes[layer_class] = (
                type(
                    layer_class.__name__,
                    (layer_class,),
                    {
                        **methods,
                        "__module__": layer_class.__module__,
                        "__qualname__": layer_class.__qualname__,
                        "cpu_exponentials": self._exponentials,
                    },
                )
                if methods
                else None
            )
        return self._classes[layer_class]

    def _routed_methods(self, layer_class: type) -> Iterator[tuple[str, FunctionType]]:
        """Each method of the class (its own or inherited, below MLX's) that names a routed
        function, bound to its module's names with those replaced."""
        seen: set[str] = set()
        for owner in layer_class.__mro__:
            if owner.__module__.startswith("mlx.") or owner is object:
                continue
            for name, method in vars(owner).items():
                if name in seen or not isinstance(method, FunctionType):
                    continue
                seen.add(name)
                if _named(method.__code__) & self._replaced(method.__globals__):
                    yield name, _rebound(method, self._scope(method.__globals__))

    def _replaced(self, names: dict[str, Any]) -> set[str]:
        return {name for name, theirs in _THEIRS.items() if names.get(name) is theirs}

    def _scope(self, names: dict[str, Any]) -> dict[str, Any]:
        """A module's names with the routed ones replaced: one copy per module per model."""
        if id(names) not in self._scopes:
            self._scopes[id(names)] = {
                **names,
                **{name: self._ours[name] for name in self._replaced(names)},
            }
        return self._scopes[id(names)]


def _named(code: CodeType) -> set[str]:
    """The global names a function's code (its nested functions' included) looks up."""
    names = set(code.co_names)
    for constant in code.co_consts:
        if isinstance(constant, CodeType):
            names |= _named(constant)
    return names


def _rebound(method: FunctionType, scope: dict[str, Any]) -> FunctionType:
    """The same function (code, defaults, closure) looking its global names up in `scope`."""
    out = FunctionType(
        method.__code__, scope, method.__name__, method.__defaults__, method.__closure__
    )
    out.__kwdefaults__ = method.__kwdefaults__
    out.__qualname__ = method.__qualname__
    out.__doc__ = method.__doc__
    return out


def attention(
    queries: mx.array,
    keys: mx.array,
    values: mx.array,
    *,
    scale: float,
    mask: mx.array | str | None = None,
) -> mx.array:
    """MLX's scaled dot-product attention, its softmax by NumPy for a prompt chunk, by the
    compiled polynomial for fewer queries."""
    b, heads, length, dim = queries.shape
    groups, positions = keys.shape[1], keys.shape[2]
    repeat = heads // groups  # query heads per key head (grouped-query attention)
    grouped = (queries * scale).reshape(b, groups, repeat, length, dim)
    scores = (grouped @ keys[:, :, None].swapaxes(-1, -2)).astype(mx.float32)
    weights = softmax(scores.reshape(b, heads, length, positions), mask)
    out = weights.reshape(b, groups, repeat, length, positions).astype(values.dtype)
    return (out @ values[:, :, None]).reshape(b, heads, length, dim)


def softmax(scores: mx.array, mask: mx.array | str | None) -> mx.array:
    """Attention weights from float32 `scores` [b, heads, queries, positions]: by NumPy for a
    prompt chunk, by the compiled polynomial for fewer queries; MLX's mask conventions."""
    if scores.shape[2] >= MIN_POSITIONS:
        return mx.array(_softmax(np.array(scores), mask))
    return _compiled_softmax(scores, mask)


def swiglu(gate: mx.array, x: mx.array) -> mx.array:
    """mlx-lm's `silu(gate) * x`, its exponential by NumPy for a prompt chunk, by the compiled
    polynomial for fewer positions."""
    if _positions(gate) < MIN_POSITIONS:
        return _poly_swiglu(gate, x)
    g = np.array(gate.astype(mx.float32))
    with np.errstate(over="ignore"):
        e = np.exp(-g)
    e += 1.0
    np.divide(g, e, out=g)
    return mx.array(g).astype(x.dtype) * x


def _positions(activation: mx.array) -> int:
    """Positions per row of an MLP's (rows, positions, features) activation."""
    return activation.shape[-2] if activation.ndim >= 2 else 1


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
