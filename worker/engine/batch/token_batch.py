"""The token batch under the engine: mlxq's own slot batch, or mlx-lm's BatchGenerator.

Both take sequences (prompt tokens, a cache of their opening if the prefix cache had one, a
sampler, logits processors, a token limit), advance all of them by one token per `next()`, and
report each token with why its sequence ended, if it did, and (for the prefix cache) the KV
cache of a sequence that ended on its own.

`open_batch` picks one per model, once, and logs it: the slot batch (worker/engine/
slot_batch.py) needs every layer's cache to be a plain KV cache; a model with a rotating
(sliding-window), SSM or quantized cache keeps mlx-lm's BatchGenerator, as does a worker set to
MLXQ_BATCH=mlx-lm.
"""

from __future__ import annotations

import logging
from typing import Any, Protocol

import mlx.core as mx
from mlx_lm.generate import BatchGenerator, StopSequences
from mlx_lm.models.cache import KVCache, make_prompt_cache

from worker.engine.batch.mlx_lm_decode import use_decode_batch
from worker.engine.batch.mlx_lm_prefill import size_prefill_group
from worker.engine.batch.slot_batch import SlotBatch
from worker.engine.batch.types import Entry, Token

log = logging.getLogger(__name__)
PREFILL_CHUNK = 512  # prompt tokens one prefill forward takes at most


class TokenBatch(Protocol):
    @property
    def decoding(self) -> bool: ...
    @property
    def prefill_rate(self) -> float | None: ...

    def insert(self, entries: list[Entry]) -> list[int]: ...
    def next(self, prefill_budget: int | None) -> list[Token]: ...
    def remove(self, uids: list[int]) -> None: ...


class MlxLmBatch:
    """mlx-lm's BatchGenerator with mlxq's decode step and prefill budget."""

    def __init__(self, model: Any, slots: int, stop_ids: frozenset[int]):
        self._stops = StopSequences([[i] for i in sorted(stop_ids)])
        self._batch = BatchGenerator(
            model,
            completion_batch_size=slots,
            # Set before every step from the prefill token budget
            # (worker/engine/batch/mlx_lm_prefill.py).
            prefill_batch_size=slots,
            prefill_step_size=PREFILL_CHUNK,
        )
        use_decode_batch(self._batch)

    @property
    def decoding(self) -> bool:
        """Some sequence is past its prompt."""
        return bool(len(self._batch._generation_batch))

    @property
    def prefill_rate(self) -> None:
        """Not measured: BatchGenerator prefills inside its own step."""
        return None

    def insert(self, entries: list[Entry]) -> list[int]:
        uids: list[int] = self._batch.insert(
            [e.prompt for e in entries],
            max_tokens=[e.max_tokens for e in entries],
            caches=[e.cache for e in entries],
            all_tokens=[e.cached for e in entries],
            samplers=[e.sampler for e in entries],
            stop_sequences=[self._stops] * len(entries),
            logits_processors=[e.processors for e in entries],
        )
        return uids

    def next(self, prefill_budget: int | None) -> list[Token]:
        size_prefill_group(self._batch, prefill_budget)
        _, generated = self._batch.next()
        return [
            Token(r.uid, r.token, r.finish_reason, r.prompt_cache, r.all_tokens) for r in generated
        ]

    def remove(self, uids: list[int]) -> None:
        self._batch.remove(uids)


def plain_kv(model: Any) -> str | None:
    """None if every layer's cache is a plain KV cache; else the cache kinds it uses."""
    kinds = sorted({type(c).__name__ for c in make_prompt_cache(model) if type(c) is not KVCache})
    return ", ".join(kinds) or None


def kv_bytes_per_token(model: Any) -> int:
    """What one position of one sequence takes in every layer's keys and values."""
    cache = make_prompt_cache(model)
    model(mx.array([[0]]), cache=cache)
    return sum(int(a.nbytes) for c in cache for a in c.keys_and_values())


def kv_window(model: Any, slots: int, kv_memory_mb: int | None) -> int | None:
    """How many positions each of `slots` rows may hold within MLXQ_KV_MEMORY (None: unset)."""
    if kv_memory_mb is None:
        return None
    per_token = kv_bytes_per_token(model)
    positions = (kv_memory_mb << 20) // (slots * per_token)
    if positions < 1:
        raise ValueError(
            f"MLXQ_KV_MEMORY={kv_memory_mb} MiB cannot hold one token for each of {slots} "
            f"sequences ({per_token} bytes per token)"
        )
    log.info("KV memory %d MiB: %d rows of %d positions", kv_memory_mb, slots, positions)
    return positions


def open_batch(
    model: Any,
    slots: int,
    stop_ids: frozenset[int],
    kind: str,
    keep_caches: bool,
    positions: int,
) -> TokenBatch:
    """The batch this model runs in (`kind`: the MLXQ_BATCH setting), logged; `keep_caches`:
    a sequence that ends hands back its KV cache (for the prefix cache); `positions`: the most
    one sequence holds."""
    other = plain_kv(model)
    if kind == "slots" and other is None:
        log.info("batch: mlxq slots (%d rows, plain KV cache)", slots)
        return SlotBatch(model, slots, stop_ids, PREFILL_CHUNK, keep_caches, positions)
    why = f"its cache is {other}" if other else "MLXQ_BATCH=mlx-lm"
    log.info("batch: mlx-lm BatchGenerator (%s)", why)
    return MlxLmBatch(model, slots, stop_ids)
