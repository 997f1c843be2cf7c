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
from mlx.utils import tree_flatten
from mlx_lm.generate import BatchGenerator, StopSequences
from mlx_lm.models.cache import KVCache, make_prompt_cache

from worker.engine.batch.mlx_lm_decode import use_decode_batch
from worker.engine.batch.mlx_lm_prefill import size_prefill_group
from worker.engine.batch.quantized_kv import KVQuantization, prompt_cache
from worker.engine.batch.slot_batch import SlotBatch
from worker.engine.batch.split_batch import LONG_UIDS, SplitBatch
from worker.engine.batch.types import Entry, PrefillBudget, Token

log = logging.getLogger(__name__)
PREFILL_CHUNK = 512  # prompt tokens one prefill forward takes at most


class TokenBatch(Protocol):
    @property
    def decoding(self) -> bool: ...
    @property
    def prefill_rate(self) -> float | None: ...
    @property
    def prefilled(self) -> int: ...

    def insert(self, entries: list[Entry]) -> list[int]: ...
    def next(self, prefill_budget: PrefillBudget | None) -> list[Token]: ...
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

    @property
    def prefilled(self) -> int:
        """Not known (BatchGenerator prefills inside its own step): counted as none, so work
        outside the batch may take a step's whole budget beside it."""
        return 0

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

    def next(self, prefill_budget: PrefillBudget | None) -> list[Token]:
        strict = None if prefill_budget is None else prefill_budget.strict
        size_prefill_group(self._batch, strict)
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


def kv_form(model: Any, kind: str, quantization: KVQuantization | None) -> KVQuantization | None:
    """The KV form a model's batch keeps (`kind`: the MLXQ_BATCH setting): `quantization` in
    the slot batch; the model's dtype in mlx-lm's, which has no quantized batch."""
    return quantization if kind == "slots" and plain_kv(model) is None else None


def kv_bytes_per_token(model: Any, quantization: KVQuantization | None = None) -> int:
    """What one position of one sequence takes in every layer's keys and values, in the
    model's dtype or quantized (MLXQ_KV_BITS): measured on a one-token forward."""
    cache = prompt_cache(model, quantization)
    model(mx.array([[0]]), cache=cache)
    return sum(int(a.nbytes) for c in cache for _, a in tree_flatten(c.keys_and_values()))


def check_quantizable(model: Any, quantization: KVQuantization) -> None:
    """Refuse, naming the setting, a model whose heads do not split into whole groups."""
    cache = make_prompt_cache(model)
    model(mx.array([[0]]), cache=cache)
    keys, values = cache[0].keys_and_values()
    quantization.check(keys.shape[-1])
    quantization.check(values.shape[-1])


def open_batch(
    model: Any,
    slots: int,
    stop_ids: frozenset[int],
    kind: str,
    keep_caches: bool,
    positions: int,
    quantization: KVQuantization | None = None,
    kv_tokens: int | None = None,
) -> TokenBatch:
    """The batch this model runs in (`kind`: the MLXQ_BATCH setting), logged; `keep_caches`:
    a sequence that ends hands back its KV cache (for the prefix cache); `positions`: the most
    one sequence holds; `quantization`: the slot batch keeps KV quantized (MLXQ_KV_BITS);
    `kv_tokens`: the positions the slot batch's sequences share (MLXQ_KV_TOKENS)."""
    other = plain_kv(model)
    if kind == "slots" and other is None:
        kv = "plain KV cache"
        if quantization is not None:
            check_quantizable(model, quantization)
            kv = f"KV quantized to {quantization.bits} bits, groups of {quantization.group_size}"

        def batch(long_rows: bool = False) -> SlotBatch:
            return SlotBatch(
                model,
                slots,
                stop_ids,
                PREFILL_CHUNK,
                keep_caches,
                positions,
                quantization,
                kv_tokens,
                long_rows,
                LONG_UIDS if long_rows else 0,
            )

        if kv_tokens is None or slots == 1:
            log.info("batch: mlxq slots (up to %d rows, %s)", slots, kv)
            return batch()
        threshold = kv_tokens // slots
        log.info(
            "batch: mlxq slots (up to %d rows, %s, a KV budget of %d positions; prompts over %d "
            "tokens in a batch of their own)",
            slots,
            kv,
            kv_tokens,
            threshold,
        )
        return SplitBatch(batch(), batch(long_rows=True), kv_tokens, threshold)
    why = f"its cache is {other}" if other else "MLXQ_BATCH=mlx-lm"
    log.info("batch: mlx-lm BatchGenerator (%s)", why)
    if quantization is not None:
        log.warning("MLXQ_KV_BITS is not applied: this model runs in mlx-lm's batch")
    return MlxLmBatch(model, slots, stop_ids)
