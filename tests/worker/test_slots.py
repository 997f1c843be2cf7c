"""Slot KV storage (worker/engine/batch/kv_rows.py) writes in place, and the KV memory rule refuses
what
cannot fit (worker/engine/prepare.py's `fit_kv`).

MLX copies a buffer before a slice update or scatter when something else holds a reference to
it. Whether a write ran in place shows in MLX's peak memory: a copy needs a second buffer.
"""

from __future__ import annotations

import mlx.core as mx
import pytest

from shared.wire.errors import ContextLengthError
from worker.engine.batch.kv_rows import DecodeRows, DecodeView, PrefillRows, PrefillView, SlotKV
from worker.engine.prepare import fit_kv

SLOTS, HEADS, DIM, POSITIONS = 8, 2, 64, 2048


def _layer() -> tuple[SlotKV, int]:
    layer = SlotKV(SLOTS, POSITIONS)
    layer.reserve(SLOTS, POSITIONS)
    PrefillView(layer, PrefillRows([0], [0], [16])).update_and_fetch(*_kv(1, 16))
    assert layer.keys is not None and layer.values is not None
    mx.eval(layer.keys, layer.values)
    return layer, int(layer.keys.nbytes)


def _kv(rows: int, positions: int) -> tuple[mx.array, mx.array]:
    keys = mx.random.normal((rows, HEADS, positions, DIM))
    values = mx.random.normal((rows, HEADS, positions, DIM))
    mx.eval(keys, values)
    return keys, values


def _extra_peak(write: object) -> int:
    """Bytes MLX's peak memory rose above what was in use, while `write()` ran."""
    mx.synchronize()
    before = mx.get_active_memory()
    mx.reset_peak_memory()
    write()  # type: ignore[operator]
    return int(mx.get_peak_memory() - before)


def test_a_decode_step_writes_every_row_in_place() -> None:
    layer, size = _layer()
    rows = DecodeRows([5, 100, 7, 2000, 0, 1, 2, 3])
    new = _kv(SLOTS, 1)

    def decode() -> None:
        keys, values = DecodeView(layer, rows).update_and_fetch(*new)
        mx.eval(keys.sum(), values.sum(), layer.keys, layer.values)

    assert _extra_peak(decode) < size / 2
    assert layer.keys is not None
    assert mx.array_equal(layer.keys[3, :, 2000], new[0][3, :, 0]).item()


def test_a_prompt_chunk_and_a_row_move_write_in_place() -> None:
    layer, size = _layer()
    chunk = _kv(1, 512)

    def prefill_and_move() -> None:
        PrefillView(layer, PrefillRows([2], [100], [chunk[0].shape[2]])).update_and_fetch(*chunk)
        assert layer.keys is not None and layer.values is not None
        mx.eval(layer.keys, layer.values)
        layer.move(2, 5, 612)
        mx.eval(layer.keys, layer.values)

    assert _extra_peak(prefill_and_move) < size / 2
    assert layer.keys is not None
    assert mx.array_equal(layer.keys[5, :, 100:612], chunk[0][0]).item()


def test_a_view_kept_across_a_write_costs_a_whole_copy() -> None:
    """The measurement above can see a copy: hold a reference, and the buffer is copied."""
    layer, size = _layer()
    assert layer.keys is not None
    kept = layer.keys[0:1]
    chunk = _kv(1, 16)

    def write() -> None:
        layer.write(1, 0, *chunk)
        assert layer.keys is not None
        mx.eval(layer.keys)

    assert _extra_peak(write) >= size
    del kept


def test_capacity_grows_in_steps_and_never_past_the_limit() -> None:
    layer = SlotKV(SLOTS, 1000)
    layer.reserve(1, 10)
    assert layer.capacity == 256
    layer.reserve(1, 300)
    assert layer.capacity == 512
    layer.reserve(1, 990)
    assert layer.capacity == 1000


def test_rows_grow_with_the_rows_in_use_up_to_the_slots_keeping_what_they_hold() -> None:
    layer = SlotKV(SLOTS, POSITIONS)
    layer.reserve(1, 16)
    chunk = _kv(1, 16)
    PrefillView(layer, PrefillRows([0], [0], [16])).update_and_fetch(*chunk)
    assert layer.keys is not None and layer.keys.shape[0] == 4  # not SLOTS: one row is in use
    layer.reserve(5, 300)
    assert (layer.rows, layer.capacity) == (SLOTS, 512)
    layer.reserve(SLOTS, 16)
    assert layer.keys.shape[:3] == (SLOTS, HEADS, 512)
    assert mx.array_equal(layer.keys[0, :, :16], chunk[0][0]).item()
    assert not mx.any(layer.keys[1:]).item()


def test_a_completion_without_max_tokens_shrinks_to_the_kv_budget() -> None:
    assert fit_kv(prompt=100, asked=None, budget=4000, window=1000, where="messages") == 900
    assert fit_kv(prompt=100, asked=50, budget=50, window=1000, where="messages") == 50


def test_a_request_that_cannot_fit_the_kv_budget_is_refused_naming_its_settings() -> None:
    with pytest.raises(ContextLengthError, match=r"MLXQ_POOL_KV_TOKENS.*MLXQ_KV_TOKENS"):
        fit_kv(prompt=900, asked=200, budget=200, window=1000, where="messages")
    with pytest.raises(ContextLengthError, match="holds 1000 tokens"):
        fit_kv(prompt=1000, asked=None, budget=10, window=1000, where="prompt")


def test_a_grouped_prompt_chunk_writes_each_row_in_place_and_no_padding() -> None:
    layer, size = _layer()
    lengths = [40, 33, 37]
    chunk = _kv(3, 40)

    def prefill_three() -> None:
        rows = PrefillRows([1, 4, 6], [10, 0, 200], lengths)
        PrefillView(layer, rows).update_and_fetch(*chunk)
        assert layer.keys is not None and layer.values is not None
        mx.eval(layer.keys, layer.values)

    assert _extra_peak(prefill_three) < size / 2
    assert layer.keys is not None
    assert mx.array_equal(layer.keys[4, :, 0:33], chunk[0][1, :, :33]).item()
    assert mx.array_equal(layer.keys[6, :, 200:237], chunk[0][2, :, :37]).item()
    assert not mx.any(layer.keys[4, :, 33:40]).item()  # the padded positions are not written
