"""mlxq's own continuous batch: sequences in slots of preallocated KV
(worker/engine/batch/kv_rows.py).

A step (`next`) does three things. First it prefills waiting prompts, oldest first, at most
`chunk` tokens of each per forward, until the step's prompt-token budget is spent: a long prompt
takes several steps and the running sequences go on between them. A prompt that the step can
finish whole counts against the budget's total only, not its cap on partial chunks
(`PrefillBudget`), so sixteen short prompts arriving together start together. Prompts of similar
lengths share a forward (right-padded; GROUP_TOKENS, PADDING), which reads the weights once for
all of them. A prompt whose tokens are all in its row but the last is promoted to decoding. Then
it queues one forward feeding every decoding row its next token, the prompts just promoted
included (their first token comes without computing the vocabulary's logits over a chunk), and
only then reads back the tokens of the forward queued by the step before: the step returns
those. So MLX computes a forward while the host builds the next one's graph and the caller
handles the tokens (mlx-lm's generate runs one token ahead the same way). A step whose forward
draws some sequence's first token reads that forward back too, so a first token comes out of the
step that finishes its prompt, as it would without the overlap (its second token then comes two
steps later: the overlap starts there). The forward's input is the last one's sampled tokens,
still lazy; a sequence that ends on a stop token has had one more forward queued, whose token is
dropped (its KV, written, goes with the prefix cache's copy). The last tokens are read first,
with no overlap, when a sequence's logits processors read its tokens on the host, or a
sequence's last token is the one being read.

A step with few decoding rows, one of them hoping for a draft, verifies drafts instead: it reads
the last tokens first and scores every row's next input and its draft in one forward
(worker/engine/batch/speculation.py decides when, and what each row keeps).

The rows, kept in slot order over the layers' KV buffers, and what a KV budget admits are
worker/engine/batch/slot_rows.py's. Admitting a sequence writes only its own row (the prefix
cache's copy of its opening, if any). Samplers and logits processors are mlx-lm's shape, called
as mlx-lm's generation batch calls them (worker/engine/batch/mlx_lm_decode.py); the first call of
a sequence's processors sees exactly its prompt.
"""

from __future__ import annotations

import sys
import time
from collections import deque
from dataclasses import replace
from typing import Any, cast

import mlx.core as mx

from worker.engine.batch.kv_rows import DecodeRows, PrefillRows, extract
from worker.engine.batch.quantized_kv import KVQuantization
from worker.engine.batch.slot_rows import Launch, Row, SlotRows
from worker.engine.batch.speculation import LONG_PREFILL, agreed, drafts, matched, speculates
from worker.engine.batch.types import Entry, PrefillBudget, Token
from worker.engine.sequence.sampling import greedy

# Prompt chunks of several rows go through one forward (reading the weights once), up to this
# many positions, padding included, and while padding adds at most this share of work.
GROUP_TOKENS = 512
PADDING = 1.25


class SlotBatch(SlotRows):
    """Sequences in slots, stepped: admission, chunked prefill, the decode forward a step ahead
    of its read, and the verify forward of a speculating step."""

    def __init__(
        self,
        model: Any,
        slots: int,
        stop_ids: frozenset[int],
        chunk: int,
        keep_caches: bool,
        positions: int,
        quantization: KVQuantization | None = None,
        kv_tokens: int | None = None,
        long_rows: bool = False,
        first_uid: int = 0,
    ):
        """`positions`: what one row may hold at most (the engine refuses longer sequences);
        `quantization`: KV kept quantized (worker/engine/batch/quantized_kv.py), or in the
        model's dtype; `kv_tokens`: the budget of positions every row shares (None: none);
        `long_rows`: the buffers grow a row at a time, not by doubling (rows of long prompts,
        worker/engine/batch/split_batch.py); `first_uid`: its first sequence's id."""
        super().__init__(len(model.layers), slots, positions, quantization, kv_tokens, long_rows)
        self._model = model
        self._stops = stop_ids
        self._chunk = chunk
        self._keep_caches = keep_caches
        self._waiting: deque[Row] = deque()
        self._unread: Launch | None = None  # the last decode forward, its tokens not read yet
        self._uid = first_uid
        self._prefill_rate: float | None = None
        self._prefilled = 0

    @property
    def prefill_rate(self) -> float | None:
        """Prompt tokens a second in the last steps' prefill forwards (None before any)."""
        return self._prefill_rate

    @property
    def prefilled(self) -> int:
        """Prompt tokens the last step prefilled: what it took of its budget."""
        return self._prefilled

    def insert(self, entries: list[Entry]) -> list[int]:
        uids = []
        for entry in entries:
            uids.append(self._uid)
            tokens = [*entry.cached, *entry.prompt]
            reach = min(len(tokens) + entry.max_tokens + 1, self._layers[0].limit)
            self._waiting.append(Row(self._uid, tokens, list(entry.prompt), entry, reach))
            self._uid += 1
        self._admit()
        return uids

    def next(self, prefill_budget: PrefillBudget | None) -> list[Token]:
        """Prefill within `prefill_budget` (None: every waiting prompt), start the decode
        forward for every decoding sequence, and return the tokens of the one before; in a
        step that starts a sequence's first token, this forward's tokens too."""
        self._prefill(prefill_budget or PrefillBudget.flat(sys.maxsize))
        rows = self._rows[: self._decoding]
        if rows and self._prefilled < LONG_PREFILL and speculates(rows):
            # Drafts follow the last tokens: those are read first, with no overlap.
            out = self._read()
            rows = self._rows[: self._decoding]
            drafted = drafts(rows, self._room()) if rows else []
            if any(drafted):
                out += self._verify(rows, drafted)
            elif rows:
                self._unread = self._launch(rows)
        elif rows and not self._read_first(rows):
            # The forward is queued on the last one's tokens, still lazy: MLX computes it while
            # this step reads the last tokens back and the caller handles them.
            launch = self._launch(rows)
            out = self._read()
            self._unread = launch
        else:
            out = self._read()
            if self._decoding:
                self._unread = self._launch(self._rows[: self._decoding])
        if self._unread is not None and any(r.launched == 1 for r in self._unread.rows):
            # A prompt's first token is read in the step that finished the prompt, so its time
            # to first token does not wait a step for the overlap; the other rows' tokens of
            # that forward are returned by the next step, as usual.
            out += self._read(firsts=True)
        self._admit()
        return out

    def remove(self, uids: list[int]) -> None:
        gone = set(uids)
        self._waiting = deque(r for r in self._waiting if r.uid not in gone)
        for slot in sorted((s for s, r in enumerate(self._rows) if r.uid in gone), reverse=True):
            self._rows[slot].gone = True
            self._free(slot)
        self._admit()

    def _admit(self) -> None:
        while self._waiting and len(self._rows) < self._slots and self._fits(self._waiting[0]):
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

    def _prefill(self, budget: PrefillBudget) -> None:
        if budget.tokens > 0 and self._decoding < len(self._rows) and self._unread is not None:
            # The buffers are written in place only when no forward under way still reads them.
            mx.eval(self._unread.tokens)
        started, done, partial = time.perf_counter(), 0, 0
        while done < budget.tokens and self._decoding < len(self._rows):
            left = budget.tokens - done, budget.partial - partial
            group, chunked = self._group(*left, short=budget.short)
            if not group:
                break
            partial += chunked
            rows = [self._rows[slot] for slot, _ in group]
            lengths = [n for _, n in group]
            shared = PrefillRows([s for s, _ in group], [r.offset for r in rows], lengths)
            # Right-padded rows attend up to the furthest offset plus the widest chunk, which
            # may lie past what any one row needs.
            self._reserve(shared.end)
            views = [self._prefill_view(layer, shared) for layer in self._layers]
            width = max(lengths)
            inputs = [r.todo[:n] + [0] * (width - n) for r, n in zip(rows, lengths, strict=True)]
            self._model(mx.array(inputs), cache=views)  # the logits are never computed
            mx.eval([a for layer in self._layers for a in (layer.keys, layer.values)])
            for row, n in zip(rows, lengths, strict=True):
                long = len(row.todo) - 1 > budget.short
                row.offset += n
                del row.todo[:n]
                row.chunked = row.chunked or (long and len(row.todo) > 1)
            # Only once every row's offset counts its chunk: a promotion swaps two rows' KV up
            # to their offsets, and may swap in another row of this group.
            for row in rows:
                if len(row.todo) == 1:
                    self._promote(self._rows.index(row))
            done += sum(lengths)
        self._prefilled = done
        if done:
            # Half the last step's rate, half the earlier ones': a chunk costs more as its
            # context grows, and one step may be slow by chance on a shared machine. Every
            # prefill counts, with what it waits for (a buffer that grows, a prefix cache's KV
            # copied into its row): that is what a decoding row waits for too.
            rate = done / (time.perf_counter() - started)
            self._prefill_rate = (
                rate if self._prefill_rate is None else (rate + self._prefill_rate) / 2
            )

    def _group(self, tokens: int, partial: int, short: int) -> tuple[list[tuple[int, int]], int]:
        """The prefilling rows whose next chunks one forward takes, as (slot, tokens), and the
        tokens of them that count against the cap on partial chunks: the oldest first, then
        others while what is left of the budget lasts (`tokens` in all, `partial` under the
        cap) and padding wastes little. A short prompt (no longer than `short`, and not the tail
        of a chunked one) taken whole counts against `tokens` only."""
        slots = sorted(range(self._decoding, len(self._rows)), key=lambda s: self._rows[s].uid)
        group: list[tuple[int, int]] = []
        useful = width = furthest = chunked = 0
        for slot in slots:
            row = self._rows[slot]
            rest = len(row.todo) - 1
            n = min(rest, self._chunk, tokens - useful)
            whole = n == rest and rest <= short and not row.chunked
            if not whole:
                n = min(n, partial - chunked)
            if n <= 0:
                if useful < tokens:  # the partial cap is spent: a short prompt may still fit
                    continue
                break
            padded = (len(group) + 1) * max(width, n)
            if group and (padded > GROUP_TOKENS or padded > PADDING * (useful + n)):
                continue
            # The padded forward attends up to the furthest offset plus the widest chunk: that
            # must stay within what a row may hold (the buffer is reserved for it).
            if group and max(furthest, row.offset) + max(width, n) > self._room():
                continue
            group.append((slot, n))
            useful, width, furthest = useful + n, max(width, n), max(furthest, row.offset)
            chunked += 0 if whole else n
        return group, chunked

    def _read_first(self, rows: list[Row]) -> bool:
        """Whether the last forward's tokens must be read before the next forward is built:
        a logits processor reads the whole sequence on the host, and a sequence whose last
        token is under way needs no more."""
        return any(r.entry.processors or r.launched >= r.entry.max_tokens for r in rows)

    def _verify(self, rows: list[Row], drafted: list[list[int]]) -> list[Token]:
        """One forward over every row's next input and its draft (rows without one: just the
        input, padded), read at once; each row keeps what it draws (worker/engine/batch/
        speculation.py), and its offset moves back over the rejected positions."""
        lengths = [1 + len(d) for d in drafted]
        shared = PrefillRows(list(range(len(rows))), [r.offset for r in rows], lengths)
        self._reserve(shared.end)
        views = [self._prefill_view(layer, shared) for layer in self._layers]
        width = max(lengths)
        inputs = [
            [r.next_token, *d] + [0] * (width - n)
            for r, d, n in zip(rows, drafted, lengths, strict=True)
        ]
        logits = self._model(mx.array(inputs), cache=views)
        mx.eval(logits)
        out: list[Token] = []
        for i, (row, draft) in enumerate(zip(rows, drafted, strict=True)):
            drawn = matched(row.entry, row.tokens, logits[i], draft, self._stops)
            if row.entry.drafter is not None:
                row.entry.drafter.checked(len(draft), agreed(drawn, draft))
            row.offset += len(drawn)  # the KV of the inputs that led to a kept token
            row.launched += len(drawn)
            out += self._take(row, drawn)
        for slot in sorted((s for s, r in enumerate(self._rows) if r.gone), reverse=True):
            self._free(slot)
        return out

    def _take(self, row: Row, drawn: list[int]) -> list[Token]:
        """A row's verified tokens, up to the one that ends it."""
        out = []
        for token in drawn:
            row.read += 1
            row.tokens.append(token)
            reason = self._finish_reason(row, token)
            if reason is None:
                out.append(Token(row.uid, token, None))
                continue
            out.append(self._end(row, token, reason))
            break
        row.next_token, row.source = row.tokens[-1], None
        return out

    def _launch(self, rows: list[Row]) -> Launch:
        """Queue one decode forward for `rows` (slots 0..n-1) and its sampling; nothing waits."""
        self._reserve(max(r.offset for r in rows) + 1)
        shared = DecodeRows([r.offset for r in rows])
        views = [self._decode_view(layer, shared) for layer in self._layers]
        logits = self._model(self._inputs(rows), cache=views)[:, -1, :]
        if any(r.entry.processors for r in rows):
            logits = self._process(rows, logits)
        launch = Launch(list(rows), self._sample(rows, logits))
        mx.async_eval(launch.tokens)
        for i, row in enumerate(rows):
            row.offset += 1
            row.launched += 1
            row.source = (launch, i)
        return launch

    def _inputs(self, rows: list[Row]) -> mx.array:
        """Each row's next input: the last forward's token for it (lazy), or a known one."""
        sources = [r.source for r in rows]
        last = self._unread
        if last is not None and sources == [(last, i) for i in range(len(last.rows))]:
            return last.tokens[:, None]  # the same rows as the last forward, in order
        known = mx.array([r.next_token for r in rows])
        if last is None:
            return known[:, None]
        picks = mx.take(last.tokens, mx.array([s[1] if s else 0 for s in sources]))
        return mx.where(mx.array([s is not None for s in sources]), picks, known)[:, None]

    def _read(self, firsts: bool = False) -> list[Token]:
        """The tokens of the last forward, for the rows still here (`firsts`: only the rows
        whose first token it is, and the forward stays unread for the others); ends the rows
        they end."""
        launch = self._unread
        if launch is None:
            return []
        if not firsts:
            self._unread = None
        out, ended = [], []
        tokens = cast(list[int], launch.tokens.tolist())
        for i, (row, token) in enumerate(zip(launch.rows, tokens, strict=True)):
            if row.gone or i in launch.read or (firsts and row.launched != 1):
                continue
            launch.read.add(i)
            row.read += 1
            row.tokens.append(token)
            if row.source is not None and row.source[0] is launch:
                row.next_token, row.source = token, None
            reason = self._finish_reason(row, token)
            if reason is None:
                out.append(Token(row.uid, token, None))
                continue
            ended.append(row)
            out.append(self._end(row, token, reason))
        for slot in sorted((self._rows.index(r) for r in ended), reverse=True):
            self._free(slot)
        return out

    def _end(self, row: Row, token: int, reason: str) -> Token:
        """A row's last token, with its KV where the batch keeps caches; the row is gone."""
        row.gone = True
        cache = None
        if self._keep_caches:
            cache = extract(self._layers, self._rows.index(row), row.offset)
        return Token(row.uid, token, reason, cache, row.tokens[: row.offset])

    def _finish_reason(self, row: Row, token: int) -> str | None:
        if token in self._stops:
            return "stop"
        return "length" if row.read >= row.entry.max_tokens else None

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
        drawn = [i for i, s in enumerate(samplers) if s is not greedy]
        if len(drawn) == len(rows):
            return mx.concatenate([samplers[i](logits[i : i + 1]) for i in drawn], axis=0)
        # The greedy rows in one argmax over all rows; the others drawn each by its sampler.
        tokens = greedy(logits)
        tokens[mx.array(drawn)] = mx.concatenate([samplers[i](logits[i : i + 1]) for i in drawn])
        return tokens
