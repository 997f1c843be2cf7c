"""mlxq's own continuous batch: sequences in slots of preallocated KV (worker/engine/slots.py).

A step (`next`) does two things. First it prefills waiting prompts, oldest first, one chunk of
at most `chunk` tokens per forward, until the step's prompt-token budget is spent: a long prompt
takes several steps and the running sequences go on between them. A prompt whose tokens are
all in its row but the last is promoted to decoding. Then one forward feeds every decoding row
its next token, the prompts just promoted included: their first token comes out of the step
that finished their prompt, without computing the vocabulary's logits over a whole chunk.

Rows are kept in slot order, decoding rows first: a decode forward reads rows 0..n-1, with no
gather. A row promoted from prefill swaps with the first prefilling row; a row that ends takes
the last decoding row into its slot, and that one's slot the last prefilling row (each a copy of
one row's positions). Admitting a sequence writes only its own row (the prefix cache's copy of
its opening, if any). Samplers and logits processors are mlx-lm's shape, called as mlx-lm's
generation batch calls them (worker/engine/decode.py); the first call of a sequence's processors
sees exactly its prompt.
"""

from __future__ import annotations

import sys
from collections import deque
from dataclasses import dataclass, replace
from typing import Any, cast

import mlx.core as mx
from mlx_lm.sample_utils import LogitsProcessor

from worker.engine.sampling import Sampler
from worker.engine.slots import DecodeRows, DecodeView, PrefillView, SlotKV, extract


@dataclass(frozen=True)
class Entry:
    """A sequence for the batch: `prompt` still to compute after `cached` (whose KV is in
    `cache`, or None), then up to `max_tokens` tokens."""

    prompt: list[int]
    cached: list[int]
    cache: list[Any] | None
    max_tokens: int
    sampler: Sampler
    processors: list[LogitsProcessor]


@dataclass(frozen=True)
class Token:
    uid: int
    token: int
    finish_reason: str | None
    # A sequence that ended on its own: the tokens whose KV `prompt_cache` holds.
    prompt_cache: list[Any] | None = None
    all_tokens: list[int] | None = None


@dataclass
class Row:
    uid: int
    tokens: list[int]  # the sequence so far: prompt, then what it generated
    todo: list[int]  # prompt tokens whose KV is not in the row yet
    entry: Entry
    offset: int = 0  # positions of the row holding KV
    generated: int = 0
    next_token: int = -1  # the next decode forward's input


class SlotBatch:
    def __init__(
        self,
        model: Any,
        slots: int,
        stop_ids: frozenset[int],
        chunk: int,
        keep_caches: bool,
        positions: int,
    ):
        """`positions`: what one row may hold at most (the engine refuses longer sequences)."""
        self._model = model
        self._slots = slots
        self._stops = stop_ids
        self._chunk = chunk
        self._keep_caches = keep_caches
        self._layers = [SlotKV(slots, positions) for _ in model.layers]
        self._rows: list[Row] = []  # by slot; the first `_decoding` decode, the others prefill
        self._decoding = 0
        self._waiting: deque[Row] = deque()
        self._uid = 0

    @property
    def capacity(self) -> int:
        return self._layers[0].capacity

    def insert(self, entries: list[Entry]) -> list[int]:
        uids = []
        for entry in entries:
            uids.append(self._uid)
            tokens = [*entry.cached, *entry.prompt]
            self._waiting.append(Row(self._uid, tokens, list(entry.prompt), entry))
            self._uid += 1
        self._admit()
        return uids

    def next(self, prefill_budget: int | None) -> list[Token]:
        """Prefill within `prefill_budget` prompt tokens (None: every waiting prompt), then
        one token for every decoding sequence."""
        self._prefill(prefill_budget if prefill_budget is not None else sys.maxsize)
        if not self._decoding:
            return []
        out, ended = self._decode()
        for slot in sorted(ended, reverse=True):
            self._free(slot)
        self._admit()
        return out

    def remove(self, uids: list[int]) -> None:
        gone = set(uids)
        self._waiting = deque(r for r in self._waiting if r.uid not in gone)
        for slot in sorted((s for s, r in enumerate(self._rows) if r.uid in gone), reverse=True):
            self._free(slot)
        self._admit()

    def _admit(self) -> None:
        while self._waiting and len(self._rows) < self._slots:
            row = self._waiting.popleft()
            slot = len(self._rows)
            self._rows.append(row)
            cache = row.entry.cache
            if cache is not None and cache[0].offset:
                self._reserve(cache[0].offset)
                for layer, c in zip(self._layers, cache, strict=True):
                    keys, values = c.keys_and_values()
                    layer.write(slot, 0, keys, values)
                row.offset = cache[0].offset
                row.entry = replace(row.entry, cache=None)  # its KV is in the row now
            if len(row.todo) == 1:
                self._promote(slot)

    def _reserve(self, positions: int) -> None:
        for layer in self._layers:
            layer.reserve(positions)

    def _prefill(self, budget: int) -> None:
        while budget > 0 and self._decoding < len(self._rows):
            slot = min(range(self._decoding, len(self._rows)), key=lambda s: self._rows[s].uid)
            row = self._rows[slot]
            n = min(len(row.todo) - 1, self._chunk, budget)
            self._reserve(row.offset + n)
            views = [PrefillView(layer, slot, row.offset) for layer in self._layers]
            self._model(mx.array([row.todo[:n]]), cache=views)  # the logits are never computed
            mx.eval([a for layer in self._layers for a in (layer.keys, layer.values)])
            row.offset += n
            del row.todo[:n]
            budget -= n
            if len(row.todo) == 1:
                self._promote(slot)

    def _promote(self, slot: int) -> None:
        """The row's prompt is in its slot but for the last token: the next decode feeds it."""
        row = self._rows[slot]
        row.next_token = row.todo.pop()
        self._swap(slot, self._decoding)
        self._decoding += 1

    def _decode(self) -> tuple[list[Token], list[int]]:
        rows = self._rows[: self._decoding]
        self._reserve(max(r.offset for r in rows) + 1)
        shared = DecodeRows([r.offset for r in rows])
        views = [DecodeView(layer, shared) for layer in self._layers]
        inputs = mx.array([r.next_token for r in rows])[:, None]
        logits = self._model(inputs, cache=views)[:, -1, :]
        if any(r.entry.processors for r in rows):
            logits = self._process(rows, logits)
        tokens = cast(list[int], self._sample(rows, logits).tolist())
        out, ended = [], []
        for slot, (row, token) in enumerate(zip(rows, tokens, strict=True)):
            row.offset += 1
            row.generated += 1
            row.tokens.append(token)
            row.next_token = token
            reason = self._finish_reason(row, token)
            if reason is None:
                out.append(Token(row.uid, token, None))
                continue
            ended.append(slot)
            cache = extract(self._layers, slot, row.offset) if self._keep_caches else None
            out.append(Token(row.uid, token, reason, cache, row.tokens[: row.offset]))
        return out, ended

    def _finish_reason(self, row: Row, token: int) -> str | None:
        if token in self._stops:
            return "stop"
        return "length" if row.generated >= row.entry.max_tokens else None

    @staticmethod
    def _process(rows: list[Row], logits: mx.array) -> mx.array:
        mx.async_eval(logits)  # the forward runs while the processors do their host-side work
        processed = []
        for e, row in enumerate(rows):
            line = logits[e : e + 1]
            if row.entry.processors:
                context = mx.array(row.tokens)
                for processor in row.entry.processors:
                    line = processor(context, line)
            processed.append(line)
        return mx.concatenate(processed, axis=0)

    @staticmethod
    def _sample(rows: list[Row], logits: mx.array) -> mx.array:
        samplers = [r.entry.sampler for r in rows]
        if all(s is samplers[0] for s in samplers):  # e.g. all greedy: one call
            return samplers[0](logits)
        return mx.concatenate([s(logits[i : i + 1]) for i, s in enumerate(samplers)], axis=0)

    def _swap(self, a: int, b: int) -> None:
        if a == b:
            return
        rows = self._rows
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

    def _move(self, source: int, target: int) -> None:
        if source != target:
            for layer in self._layers:
                layer.move(source, target, self._rows[source].offset)
            self._rows[target] = self._rows[source]
