"""Quantized KV in the slot batch (MLXQ_KV_BITS): rows of keys and values kept as `mx.quantize`
triples, group-wise, 8 or 4 bits.

Each layer keeps, for keys and for values, the codes (uint32 words packing `32 / bits` values),
the scales and the biases of every group of `group_size` values along the head dimension:
mlx-lm's `QuantizedKVCache` layout, so a row handed to the prefix cache is a `QuantizedKVCache`
that mlx-lm can copy, trim, save and load, and a prefix cache's `QuantizedKVCache` is copied
into a row as it is. A position is quantized once, when it is written (a float cache handed in,
a prompt chunk, a decoded token), so a sequence's KV is the same whoever shares the batch.

The views (`QuantizedDecodeView`, `QuantizedPrefillView`) hand the model's attention the
triples and carry `bits` and `group_size`: mlx-lm's `scaled_dot_product_attention` then runs its
quantized attention (`mx.quantized_matmul`: Metal's and CUDA's kernels), and on the CPU the
worker's hooked attention runs worker/engine/cpu/quantized_attention.py instead for 8 bits,
which measured faster there. The float batch (worker/engine/batch/kv_rows.py) is left as it
is: a worker without MLXQ_KV_BITS runs none of this.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

import mlx.core as mx
from mlx_lm.models.cache import QuantizedKVCache, make_prompt_cache

from worker.engine.batch.kv_rows import DecodeView, PrefillView, SlotKV

Triple = tuple[mx.array, mx.array, mx.array]  # codes, scales, biases


@dataclass(frozen=True)
class KVQuantization:
    """How KV is quantized: `bits` per value (4 or 8), one scale and bias per `group_size`
    values (32, 64 or 128): the settings check both (shared/queue/config.py)."""

    bits: int
    group_size: int = 64

    def check(self, head_dim: int) -> None:
        """Refuse a model whose heads do not split into whole groups, naming the setting."""
        if head_dim % self.group_size:
            raise ValueError(
                f"MLXQ_KV_GROUP_SIZE={self.group_size} does not divide this model's head "
                f"dimension ({head_dim}): set a group size that does, or MLXQ_KV_BITS=0"
            )

    def vector_bytes(self, dim: int, dtype_bytes: int) -> int:
        """What one head's `dim` values take quantized: the codes, and a scale and a bias (in
        the model's dtype, `dtype_bytes` each) per group."""
        return dim * self.bits // 8 + 2 * (dim // self.group_size) * dtype_bytes

    def quantize(self, x: mx.array) -> Triple:
        w, scales, biases = mx.quantize(x, group_size=self.group_size, bits=self.bits)
        return w, scales, biases

    def new_cache(self) -> QuantizedKVCache:
        return QuantizedKVCache(group_size=self.group_size, bits=self.bits)


def kv_quantization(bits: int, group_size: int) -> KVQuantization | None:
    """The settings' quantization (MLXQ_KV_BITS, MLXQ_KV_GROUP_SIZE): None when bits is 0."""
    return KVQuantization(bits, group_size) if bits else None


def prompt_cache(model: Any, quantization: KVQuantization | None) -> list[Any]:
    """A fresh cache for one sequence of `model`: mlx-lm's own, or quantized KV per layer (the
    slot batch quantizes only models whose every layer is a plain KV cache)."""
    if quantization is None:
        return list(make_prompt_cache(model))
    return [quantization.new_cache() for _ in model.layers]


class QuantizedSlotKV(SlotKV):
    """One layer's keys and values as triples, a row per slot (see SlotKV for rows, capacity
    and when the buffers are dropped)."""

    keys: Triple | None  # type: ignore[assignment]
    values: Triple | None  # type: ignore[assignment]

    def __init__(
        self,
        slots: int,
        limit: int,
        quantization: KVQuantization,
        budget: int | None = None,
        doubling: bool = True,
    ):
        super().__init__(slots, limit, budget, doubling)
        self.quantization = quantization

    def _grow(self, rows: int, capacity: int) -> None:
        assert self.keys is not None and self.values is not None
        self.keys = _resized(self.keys, rows, capacity)
        self.values = _resized(self.values, rows, capacity)

    def allocate(self, keys: Any, values: Any) -> None:
        """Allocate from a write's keys and values: float arrays or triples."""
        if self.keys is None:
            self.keys = _zeros(self._triple(keys), self.rows, self.capacity)
            self.values = _zeros(self._triple(values), self.rows, self.capacity)

    def write(self, row: int, start: int, keys: Any, values: Any) -> None:
        """Positions `start...` of `row`: float arrays [1, heads, n, dim] (quantized here) or
        triples of them (copied as they are)."""
        keys, values = self._triple(keys), self._triple(values)
        self.allocate(keys, values)
        assert self.keys is not None and self.values is not None
        n = keys[0].shape[2]
        if n == 0:
            return
        for buffer, part in zip((*self.keys, *self.values), (*keys, *values), strict=True):
            buffer[row : row + 1, :, start : start + n, :] = part

    def read(self, row: int, positions: int) -> tuple[Triple, Triple]:  # type: ignore[override]
        """A copy of a row's first positions, evaluated: it holds no reference to the buffer."""
        assert self.keys is not None and self.values is not None
        keys = _copied(self.keys, row, positions)
        values = _copied(self.values, row, positions)
        mx.eval(keys, values)
        return keys, values

    def cache(self, row: int, positions: int) -> QuantizedKVCache:
        cache = self.quantization.new_cache()
        if positions and self.keys is not None:
            cache.keys, cache.values = self.read(row, positions)
            cache.offset = positions
        return cache

    def _triple(self, x: Any) -> Triple:
        if isinstance(x, mx.array):
            return self.quantization.quantize(x)
        w, scales, biases = x
        return w, scales, biases


def _zeros(like: Triple, rows: int, capacity: int) -> Triple:
    w, s, b = (mx.zeros((rows, a.shape[1], capacity, a.shape[-1]), a.dtype) for a in like)
    return w, s, b


def _resized(triple: Triple, rows: int, capacity: int) -> Triple:
    resized = _zeros(triple, rows, capacity)
    old_rows, _, old, _ = triple[0].shape
    kept_rows, kept = min(rows, old_rows), min(capacity, old)
    for target, source in zip(resized, triple, strict=True):
        target[:kept_rows, :, :kept, :] = source[:kept_rows, :, :kept, :]
    return resized


def _copied(triple: Triple, row: int, positions: int) -> Triple:
    w, s, b = (mx.contiguous(a[row : row + 1, :, :positions, :]) for a in triple)
    return w, s, b


def _rows(triple: Triple, rows: Any, end: int) -> Triple:
    """`triple[rows, :, :end]` of each array (`rows`: a slice or an index array)."""
    w, s, b = (a[rows, :, :end, :] for a in triple)
    return w, s, b


class _Quantized:
    """What both quantized views share: the layer's quantization, which the attention reads
    (`bits`, `group_size`), and a forward's new keys and values quantized once."""

    _layer: SlotKV

    @property
    def _quantized_layer(self) -> QuantizedSlotKV:
        return cast(QuantizedSlotKV, self._layer)

    @property
    def bits(self) -> int:
        return self._quantized_layer.quantization.bits

    @property
    def group_size(self) -> int:
        return self._quantized_layer.quantization.group_size

    def _quantized(self, keys: mx.array, values: mx.array) -> tuple[Triple, Triple]:
        quantization = self._quantized_layer.quantization
        return quantization.quantize(keys), quantization.quantize(values)


class QuantizedDecodeView(_Quantized, DecodeView):
    """DecodeView over quantized rows: each row's new position quantized and written in place;
    the attention gets the triples."""

    def update_and_fetch(self, keys: mx.array, values: mx.array) -> tuple[Triple, Triple]:  # type: ignore[override]
        layer, rows = self._quantized_layer, self._rows
        new_keys, new_values = self._quantized(keys[:, :, 0, :], values[:, :, 0, :])
        layer.allocate(new_keys, new_values)
        assert layer.keys is not None and layer.values is not None
        heads = rows.heads(keys.shape[1])
        for buffer, part in zip(
            (*layer.keys, *layer.values), (*new_keys, *new_values), strict=True
        ):
            buffer[rows.rows, heads, rows.positions] = part
        window = slice(0, keys.shape[0])
        return _rows(layer.keys, window, rows.length), _rows(layer.values, window, rows.length)


class QuantizedPrefillView(_Quantized, PrefillView):
    """PrefillView over quantized rows: the chunk quantized once for all its rows, each row's
    part written at its offset; the attention gets the triples."""

    def update_and_fetch(self, keys: mx.array, values: mx.array) -> tuple[Triple, Triple]:  # type: ignore[override]
        layer, rows = self._quantized_layer, self._rows
        new_keys, new_values = self._quantized(keys, values)
        for b, (slot, start, n) in enumerate(
            zip(rows.slots, rows.starts, rows.lengths, strict=True)
        ):
            part_keys = tuple(a[b : b + 1, :, :n] for a in new_keys)
            part_values = tuple(a[b : b + 1, :, :n] for a in new_values)
            layer.write(slot, start, part_keys, part_values)
        assert layer.keys is not None and layer.values is not None
        if rows.index is None:
            row = rows.slots[0]
            end = rows.starts[0] + keys.shape[2]
            window = slice(row, row + 1)
            return _rows(layer.keys, window, end), _rows(layer.values, window, end)
        return _rows(layer.keys, rows.index, rows.end), _rows(layer.values, rows.index, rows.end)
