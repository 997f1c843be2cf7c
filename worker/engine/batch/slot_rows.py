"""The slot batch's rows in their slots (worker/engine/batch/slot_batch.py steps them): each
sequence's `Row`, the decode forward under way that writes them (`Launch`), and `SlotRows`, which
keeps the rows in slot order over every layer's KV buffer (worker/engine/batch/kv_rows.py, or
quantized_kv.py's) and decides what a KV budget admits.

With a KV budget (`kv_tokens`: the positions every row's buffer may take together, rows x
capacity), a waiting sequence is admitted only while every admitted sequence could still reach
its last position (prompt plus its token limit) within the budget: so the buffers never grow past
it, one long sequence may take the whole of it when it runs alone, and a sequence that does not
fit yet waits for rows to end, first come first served. The engine refuses what could never fit
(worker/engine/prepare.py).

Rows are kept in slot order, decoding rows first: a decode forward reads rows 0..n-1, with no
gather. A row promoted from prefill swaps with the first prefilling row; a row that ends takes
the last decoding row into its slot, and that one's slot the last prefilling row (each a copy of
one row's positions).

`SlotBatch` is a `SlotRows`: its step reads and moves the rows on every token, so they are its own
attributes, not another object's reached through one.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import mlx.core as mx

from worker.engine.batch.kv_rows import DecodeView, PrefillView, SlotKV
from worker.engine.batch.quantized_kv import (
    KVQuantization,
    QuantizedDecodeView,
    QuantizedPrefillView,
    QuantizedSlotKV,
)
from worker.engine.batch.types import Entry


@dataclass(eq=False)  # a row is itself: compared by identity
class Row:
    uid: int
    tokens: list[int]  # the sequence so far: prompt, then the tokens read back
    todo: list[int]  # prompt tokens whose KV is not in the row yet
    entry: Entry
    reach: int  # the positions it may hold at its end: its prompt, its token limit, one more
    offset: int = 0  # positions of the row holding KV (or being written by a forward)
    launched: int = 0  # tokens the decode forwards were asked for
    read: int = 0  # tokens read back
    next_token: int = -1  # the next decode forward's input, when known on the host
    # Where the next input is while it is still being computed: a forward's tokens, a row.
    source: tuple[Launch, int] | None = None
    gone: bool = False  # ended or removed: a forward still running for it is not read
    # A chunk of its prompt, longer than a short one, went in and more is left: its tail is
    # never a short prompt taken whole, so a burst's budget (PrefillBudget.short) never takes
    # long prompts' tails at once. A short prompt cut by a step's floor stays short.
    chunked: bool = False


@dataclass(frozen=True, eq=False)
class Launch:
    """A decode forward under way: its rows, in order, and the tokens it samples (lazy)."""

    rows: list[Row]
    tokens: mx.array
    read: set[int] = field(default_factory=set)  # rows whose token was read early (first ones)


class SlotRows:
    """Rows in slots over every layer's KV buffer: the first `_decoding` decode, the others
    prefill."""

    def __init__(
        self,
        layers: int,
        slots: int,
        positions: int,
        quantization: KVQuantization | None,
        kv_tokens: int | None,
        long_rows: bool,
    ):
        """`layers`: the model's; the others as `SlotBatch` takes them."""
        self._slots = slots
        self._kv_tokens = kv_tokens
        self._layers: list[SlotKV]
        # The views' classes, picked once: a batch of float KV runs none of the quantized code.
        self._decode_view: type[DecodeView] = DecodeView
        self._prefill_view: type[PrefillView] = PrefillView
        if quantization is None:
            self._layers = [
                SlotKV(slots, positions, kv_tokens, not long_rows) for _ in range(layers)
            ]
        else:
            self._layers = [
                QuantizedSlotKV(slots, positions, quantization, kv_tokens, not long_rows)
                for _ in range(layers)
            ]
            self._decode_view, self._prefill_view = QuantizedDecodeView, QuantizedPrefillView
        self._rows: list[Row] = []  # by slot; the first `_decoding` decode, the others prefill
        self._decoding = 0

    @property
    def decoding(self) -> bool:
        """Some sequence is past its prompt."""
        return self._decoding > 0

    @property
    def kv_size(self) -> tuple[int, int]:
        """The KV buffers' rows and positions per row ((0, 0): none allocated)."""
        return self._layers[0].rows, self._layers[0].capacity

    @property
    def kv_held(self) -> int:
        """The KV positions this batch takes of a budget: what its buffers hold, or what its
        rows may reach (rows x the furthest reach), whichever is more."""
        rows, capacity = self.kv_size
        promised = len(self._rows) * max((r.reach for r in self._rows), default=0)
        return max(rows * capacity, promised)

    def limit_kv(self, tokens: int) -> None:
        """The budget from now on (another batch shares it: worker/engine/batch/split_batch.py)."""
        self._kv_tokens = tokens
        for layer in self._layers:
            layer.budget = tokens

    def _fits(self, row: Row) -> bool:
        """Whether every admitted row, and `row`, could reach its end within the budget."""
        if self._kv_tokens is None:
            return True
        reach = max([row.reach, *(r.reach for r in self._rows)])
        return (len(self._rows) + 1) * reach <= self._kv_tokens

    def _reserve(self, positions: int) -> None:
        """Room in every layer for the rows in slots and `positions` positions each (under a
        budget, at least what every row holds: a buffer kept within it may shrink to that)."""
        if self._kv_tokens is not None:
            positions = max([positions, *(r.offset for r in self._rows)])
        for layer in self._layers:
            layer.reserve(len(self._rows), positions)

    def _room(self) -> int:
        """The positions a row's buffer may reach: a row's limit, and the budget's share."""
        limit = self._layers[0].limit
        if self._kv_tokens is None or not self._rows:
            return limit
        # Admission keeps every row's reach within this share.
        return min(limit, self._kv_tokens // len(self._rows))

    def _promote(self, slot: int) -> None:
        """The row's prompt is in its slot but for the last token: the next decode feeds it."""
        row = self._rows[slot]
        row.next_token = row.todo.pop()
        self._swap(slot, self._decoding)
        self._decoding += 1

    def _swap(self, a: int, b: int) -> None:
        if a == b:
            return
        rows = self._rows
        # A row admitted since the buffer last grew may lie past its rows: a slice written
        # there would be dropped without a word.
        self._reserve(max(rows[a].offset, rows[b].offset))
        for layer in self._layers:
            if layer.keys is None:
                continue
            first = layer.read(a, rows[a].offset)
            second = layer.read(b, rows[b].offset)
            layer.write(b, 0, *first)
            layer.write(a, 0, *second)
        rows[a], rows[b] = rows[b], rows[a]

    def _free(self, slot: int) -> None:
        """Give up a row: the last decoding row takes its slot, the last row that one's."""
        if slot < self._decoding:
            self._decoding -= 1
            self._move(self._decoding, slot)
            slot = self._decoding
        self._move(len(self._rows) - 1, slot)
        self._rows.pop()
        if not self._rows:
            for layer in self._layers:
                layer.release()

    def _move(self, source: int, target: int) -> None:
        if source != target:
            for layer in self._layers:
                layer.move(source, target, self._rows[source].offset)
            self._rows[target] = self._rows[source]
