"""KV storage by slot: one preallocated buffer per layer, each running sequence a row of it.

Each layer keeps keys and values of shape `[rows, kv_heads, capacity, head_dim]`, rows and
capacity grown with the load and dropped when the batch empties (`SlotKV`), and kept within the
batch's KV budget (rows x capacity positions, MLXQ_KV_TOKENS) where one is set. A sequence
owns one row from the step it is admitted until it ends; its positions are written in place at
its own offset, so admitting a sequence costs its own prompt and nothing of the other rows, and
a sequence that ends gives its row to the last one (one row copied, `SlotKV.move`).

MLX writes a slice update or a scatter into its input's buffer only when nothing else holds a
reference to that buffer (otherwise it copies the whole buffer first): so nothing here keeps a
view of a buffer across forwards, and a row is copied out (`mx.contiguous`, evaluated) before
its source is overwritten. tests/worker/test_slots.py checks it with MLX's peak memory.

The model's attention modules are mlx-lm's, untouched: they read `cache.offset` for RoPE, call
`cache.update_and_fetch(keys, values)` and get their mask from `cache.make_mask`. A forward sees
the buffers through a view per layer: `DecodeView` (every decoding row, one new token each, at
their own offsets: a vector of offsets for `mx.fast.rope` and a boolean mask hiding each row's
unused positions) or `PrefillView` (the next prompt chunk of one row, with a plain causal mask,
or of several rows at once, right-padded, at their own offsets).
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
from mlx_lm.models.cache import KVCache, create_attention_mask

GROWTH = 256  # capacity grows in multiples of this many positions
ROW_GROWTH = 4  # rows, the first time the buffer grows


class SlotKV:
    """One layer's keys and values, a row per slot; allocated at its first write.

    The buffer holds as many rows as the batch has held at once since it was last empty, not
    `slots`, and is dropped when the batch empties: memory follows the load, so a large
    MLXQ_BATCH_SIZE costs nothing until it is used, and a burst of short prompts does not
    leave every row at a later long prompt's capacity.
    """

    def __init__(self, slots: int, limit: int, budget: int | None = None, doubling: bool = True):
        self.slots = slots  # rows at most
        self.limit = limit  # positions per row at most
        self.budget = budget  # rows x capacity at most (None: no bound)
        self.doubling = doubling  # rows grow by doubling (else one at a time: long rows)
        self.rows = 0
        self.capacity = 0
        self.keys: mx.array | None = None
        self.values: mx.array | None = None

    def reserve(self, rows: int, positions: int) -> None:
        """Make room for `rows` rows of `positions` positions (copies the buffer when it grows:
        rows double, positions grow by half, each in steps, as far as the budget allows; rows
        past `rows` and positions past `positions` may be dropped then, so `positions` must
        cover every row's KV)."""
        if rows <= self.rows and positions <= self.capacity:
            return
        grown_rows = self.rows
        if rows > self.rows:
            grown_rows = rows
            if self.doubling:
                grown_rows = min(max(rows, 2 * self.rows, ROW_GROWTH), self.slots)
        grown = self.capacity
        if positions > self.capacity:
            grown = -(-max(positions, self.capacity * 3 // 2) // GROWTH) * GROWTH
            grown = max(positions, min(grown, self.limit))
        if self.budget is not None and grown_rows * grown > self.budget:
            # The headroom of doubling is given up first, then rows nobody holds.
            grown = max(positions, min(grown, self.budget // max(grown_rows, 1)))
            grown_rows = max(rows, min(grown_rows, self.budget // grown))
        if self.keys is not None and self.values is not None:
            self._grow(grown_rows, grown)
        self.rows, self.capacity = grown_rows, grown

    def _grow(self, rows: int, capacity: int) -> None:
        assert self.keys is not None and self.values is not None
        self.keys = _resized(self.keys, rows, capacity)
        self.values = _resized(self.values, rows, capacity)

    def release(self) -> None:
        """Drop the buffers (the batch holds no row any more): the next rows start small. A
        forward still under way keeps what it reads."""
        self.keys = self.values = None
        self.rows = self.capacity = 0

    def allocate(self, keys: mx.array, values: mx.array) -> None:
        if self.keys is None:
            _, heads, _, k_dim = keys.shape
            shape = (self.rows, heads, self.capacity)
            self.keys = mx.zeros((*shape, k_dim), keys.dtype)
            self.values = mx.zeros((*shape, values.shape[3]), values.dtype)

    def write(self, row: int, start: int, keys: mx.array, values: mx.array) -> None:
        """Positions `start...` of `row` (keys and values of shape [1, heads, n, dim])."""
        self.allocate(keys, values)
        assert self.keys is not None and self.values is not None
        if keys.shape[2] == 0:
            return
        end = start + keys.shape[2]
        self.keys[row : row + 1, :, start:end, :] = keys
        self.values[row : row + 1, :, start:end, :] = values

    def move(self, source: int, target: int, positions: int) -> None:
        """Copy the first `positions` positions of row `source` into row `target`."""
        if self.keys is None or self.values is None or positions == 0:
            return
        keys, values = self.read(source, positions)
        self.write(target, 0, keys, values)

    def read(self, row: int, positions: int) -> tuple[mx.array, mx.array]:
        """A copy of a row's first positions, evaluated: it holds no reference to the buffer."""
        assert self.keys is not None and self.values is not None
        keys = mx.contiguous(self.keys[row : row + 1, :, :positions, :])
        values = mx.contiguous(self.values[row : row + 1, :, :positions, :])
        mx.eval(keys, values)
        return keys, values

    def cache(self, row: int, positions: int) -> Any:
        """A row's first positions as an mlx-lm cache (what the prefix cache stores)."""
        cache = KVCache()
        if positions and self.keys is not None:
            cache.keys, cache.values = self.read(row, positions)
            cache.offset = positions
        return cache


def _resized(buffer: mx.array, rows: int, capacity: int) -> mx.array:
    """The buffer as `rows` rows of `capacity` positions, what fits of it kept (one copy)."""
    old_rows, heads, old, dim = buffer.shape
    kept_rows, kept = min(rows, old_rows), min(capacity, old)
    resized = mx.zeros((rows, heads, capacity, dim), buffer.dtype)
    resized[:kept_rows, :, :kept, :] = buffer[:kept_rows, :, :kept, :]
    return resized


def extract(layers: list[SlotKV], row: int, positions: int) -> list[Any]:
    """A row's first positions as mlx-lm caches, one per layer (what the prefix cache stores)."""
    return [layer.cache(row, positions) for layer in layers]


class DecodeRows:
    """What every layer's view shares in a decode forward: rows 0..n-1, one token each."""

    def __init__(self, offsets: list[int]):
        rows = len(offsets)
        self.rows = mx.arange(rows)[:, None]
        self.offsets = mx.array(offsets)
        self.length = max(offsets) + 1
        self.mask = (mx.arange(self.length)[None] <= self.offsets[:, None]).reshape(
            rows, 1, 1, self.length
        )
        self.positions = self.offsets[:, None]
        self._heads: dict[int, mx.array] = {}

    def heads(self, count: int) -> mx.array:
        if count not in self._heads:
            self._heads[count] = mx.arange(count)[None, :]
        return self._heads[count]


class DecodeView:
    """One layer, seen by a forward that feeds each decoding row its next token."""

    def __init__(self, layer: SlotKV, rows: DecodeRows):
        self._layer = layer
        self._rows = rows
        self.offset = rows.offsets

    def update_and_fetch(self, keys: mx.array, values: mx.array) -> tuple[mx.array, mx.array]:
        layer, rows = self._layer, self._rows
        layer.allocate(keys, values)
        assert layer.keys is not None and layer.values is not None
        heads = rows.heads(keys.shape[1])
        layer.keys[rows.rows, heads, rows.positions] = keys[:, :, 0, :]
        layer.values[rows.rows, heads, rows.positions] = values[:, :, 0, :]
        n = keys.shape[0]
        return layer.keys[:n, :, : rows.length, :], layer.values[:n, :, : rows.length, :]

    def make_mask(self, n: int, return_array: bool = False, window_size: Any = None) -> mx.array:
        return self._rows.mask


class PrefillRows:
    """What every layer's view shares in a prefill forward: one prompt chunk per row, the
    chunks right-padded to the longest (a padded position's output is never used, and its
    keys and values are not written)."""

    def __init__(self, slots: list[int], offsets: list[int], lengths: list[int]):
        self.slots = slots
        self.starts = offsets
        self.lengths = lengths
        width = max(lengths)
        self.end = max(offsets) + width  # the positions a forward attends over
        self.offset: int | mx.array = offsets[0]
        self.mask: mx.array | None = None
        self.index: mx.array | None = None  # rows to gather, if not one row
        if len(slots) > 1:
            self.offset = mx.array(offsets)
            queries = self.offset[:, None] + mx.arange(width)[None]
            self.mask = (mx.arange(self.end)[None, None] <= queries[:, :, None])[:, None]
            self.index = mx.array(slots)


class PrefillView:
    """One layer, seen by a forward over the next prompt chunk of one or more rows."""

    def __init__(self, layer: SlotKV, rows: PrefillRows):
        self._layer = layer
        self._rows = rows
        self.offset = rows.offset

    def update_and_fetch(self, keys: mx.array, values: mx.array) -> tuple[mx.array, mx.array]:
        layer, rows = self._layer, self._rows
        if rows.index is None:
            layer.write(rows.slots[0], rows.starts[0], keys, values)
            row, end = rows.slots[0], rows.starts[0] + keys.shape[2]
            assert layer.keys is not None and layer.values is not None
            return layer.keys[row : row + 1, :, :end, :], layer.values[row : row + 1, :, :end, :]
        for b, (slot, start, n) in enumerate(
            zip(rows.slots, rows.starts, rows.lengths, strict=True)
        ):
            layer.write(slot, start, keys[b : b + 1, :, :n], values[b : b + 1, :, :n])
        assert layer.keys is not None and layer.values is not None
        return layer.keys[rows.index, :, : rows.end], layer.values[rows.index, :, : rows.end]

    def make_mask(self, n: int, return_array: bool = False, window_size: Any = None) -> Any:
        if self._rows.mask is not None:
            return self._rows.mask
        return create_attention_mask(n, self._rows.starts[0], return_array, window_size)
