"""A reasoning model's thinking, kept apart from its answer, token by token.

Models that think write their reasoning between markers (`<think>` ... `</think>` for Qwen3,
DeepSeek, GLM and most others; mlx-lm infers each family's markers from the vocabulary, and a
marker may take several tokens, as Gemma 4's does). A `ThinkSplit` follows one sequence: each
token's decoded text goes to the reasoning or to the content, and the marker tokens themselves
to neither. Matching is on token ids, so a marker is never confused with text that spells it,
and tokens that could still become a marker are held back until they do or cannot: no part of
a marker reaches either field.

The split sits before the stop-string matcher and the tool-call scanner (they see content
only), so a stop string or a call marker inside the reasoning does nothing, except that a
tool-call start marker inside the reasoning ends it (mlx-lm's state machine does the same: some
models call a tool without closing their thinking).

A sequence of a model that does not think has no split and pays nothing for it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, cast

import mlx.core as mx

from worker.engine.sequence.grammar import GrammarConstraint


class Split(Protocol):
    """A sequence's output routed, token by token, to content or reasoning (`ThinkSplit`, or
    gpt-oss's `HarmonySplit` in worker/engine/sequence/harmony.py)."""

    reasoning_tokens: int

    def feed(self, token: int, piece: str) -> tuple[str, str]:
        """Take one token and its text; return (content, reasoning) that may be shown now."""

    def finish(self, rest: str) -> tuple[str, str]:
        """At the sequence's end, with the detokenizer's last text: what is still held back,
        as (content, reasoning)."""


@dataclass(frozen=True)
class ThinkMarkers:
    """A model's reasoning markers, as token ids (one or several tokens each)."""

    start: tuple[int, ...]
    end: tuple[int, ...]
    # The tool-call start marker, which ends reasoning when it comes inside it.
    call_start: tuple[int, ...] = ()

    @classmethod
    def of(cls, tokenizer: Any) -> ThinkMarkers | None:
        """The markers mlx-lm infers for this TokenizerWrapper; None for a model that does not
        think."""
        if not getattr(tokenizer, "has_thinking", False):
            return None
        start = tuple(int(t) for t in tokenizer.think_start_tokens or ())
        end = tuple(int(t) for t in tokenizer.think_end_tokens or ())
        if not start or not end:
            return None
        call: tuple[int, ...] = ()
        if getattr(tokenizer, "has_tool_calling", False):
            call = tuple(int(t) for t in tokenizer.tool_call_start_tokens or ())
        return cls(start, end, call)

    def opens_inside(self, prompt: list[int]) -> bool:
        """Whether output starts inside reasoning: the prompt's last start marker comes after
        its last end marker (a template that pre-fills the opening marker, as DeepSeek R1's
        and Qwen3's thinking templates do)."""
        return _rfind(prompt, self.start) > _rfind(prompt, self.end)


def _rfind(tokens: list[int], marker: tuple[int, ...]) -> int:
    """Where `marker` last begins in `tokens`; -1 if nowhere."""
    n = len(marker)
    first = marker[0]
    for at in range(len(tokens) - n, -1, -1):
        if tokens[at] == first and tuple(tokens[at : at + n]) == marker:
            return at
    return -1


class ThinkSplit:
    """One sequence's tokens routed to reasoning or content (module docstring)."""

    def __init__(self, markers: ThinkMarkers, inside: bool):
        self._markers = markers
        self.inside = inside
        self.reasoning_tokens = 0
        self._firsts = frozenset(
            m[0] for m in (markers.start, markers.end, markers.call_start) if m
        )
        self._held: list[tuple[int, str]] = []  # tokens that may be the start of a marker
        self._trim = inside  # strip the newlines a marker is followed by
        self._newlines = ""  # newlines that end the reasoning so far (`_reason`)

    def feed(self, token: int, piece: str) -> tuple[str, str]:
        """Take one token and its text; return (content, reasoning) that may be shown now."""
        if not self._held and token not in self._firsts:
            return self._plain(piece)
        self._held.append((token, piece))
        return self._resolve()

    def finish(self, rest: str) -> tuple[str, str]:
        """At the end of the sequence: what is still held back, as what it turned out to be."""
        held, self._held = self._held, []
        text = "".join(p for _, p in held) + rest
        return ("", self._reason(text)) if self.inside else (text, "")

    def _resolve(self) -> tuple[str, str]:
        tokens = tuple(t for t, _ in self._held)
        watched = self._watched()
        for marker, switch in watched:
            if tokens == marker:
                text = "".join(p for _, p in self._held)
                self._held = []
                self._switch(switch)
                # A call's marker is the call's start: the tool-call scanner must see it.
                return (text, "") if switch == "call" else ("", "")
        if any(marker[: len(tokens)] == tokens for marker, _ in watched):
            return "", ""  # may still become a marker
        # Not a marker: the first held token is text; the ones after it may begin one.
        (_, piece), rest = self._held[0], self._held[1:]
        self._held = []
        content, reasoning = self._plain(piece)
        for token, later in rest:
            more = self.feed(token, later)
            content, reasoning = content + more[0], reasoning + more[1]
        return content, reasoning

    def _plain(self, piece: str) -> tuple[str, str]:
        if self.inside:
            self.reasoning_tokens += 1
            return "", self._reason(piece)
        return self._trimmed(piece), ""

    def _reason(self, piece: str) -> str:
        """Reasoning text, less the newlines at its end: they are held until more reasoning
        follows them, and dropped when the end marker does (templates write `\n</think>`)."""
        piece = self._trimmed(piece)
        body = piece.rstrip("\n")
        if not body:
            self._newlines += piece
            return ""
        shown, self._newlines = self._newlines + body, piece[len(body) :]
        return shown

    def _watched(self) -> list[tuple[tuple[int, ...], str]]:
        m = self._markers
        if self.inside:
            found = [(m.end, "end")]
            if m.call_start:
                found.append((m.call_start, "call"))
            return found
        # An end marker outside reasoning closes nothing and is dropped, never shown.
        return [(m.start, "start"), (m.end, "end")]

    def _switch(self, to: str) -> None:
        self.inside = to == "start"
        self._newlines = ""
        self._trim = to != "call"  # a call's marker is content: nothing to strip after it

    def _trimmed(self, piece: str) -> str:
        if not self._trim:
            return piece
        piece = piece.lstrip("\n")
        self._trim = not piece
        return piece


class ReasoningGate:
    """A logits processor for a sequence of a thinking model that has a reasoning budget or a
    grammar: while the sequence reasons, the grammar waits (a JSON schema or a forced call
    constrains the answer, not the thinking) and, once `budget` reasoning tokens are written,
    the end marker is forced; once reasoning ends, the grammar constrains every token.

    A sequence whose prompt did not open the reasoning may open it with its first token (Qwen3
    writes `<think>` itself): that token is allowed beside what the grammar allows. The gate
    follows the markers on the tokens it is given (the slot batch calls it before the engine
    reads the step's token), so it keeps its own state rather than the split's.
    """

    def __init__(
        self,
        markers: ThinkMarkers,
        inside: bool,
        budget: int | None,
        grammar: GrammarConstraint | None,
    ):
        self._markers = markers
        self._state = "inside" if inside else "before"
        self._budget = budget
        self._grammar = grammar
        self._count = 0  # reasoning tokens so far
        self._seen = -1  # context tokens already followed; -1 before the first call

    def __call__(self, context: mx.array, logits: mx.array) -> mx.array:
        if self._seen >= 0:
            self._follow(cast(list[int], context[self._seen - 1 :].tolist()), context.size)
        self._seen = context.size
        if self._state == "inside":
            if self._budget is not None and self._count >= self._budget:
                return _only(logits, self._forced(cast(list[int], context.tolist())))
            return logits
        out = logits if self._grammar is None else self._grammar(context, logits)
        if self._state == "before" and len(self._markers.start) == 1 and self._grammar:
            opening = mx.arange(logits.shape[-1]) == self._markers.start[0]
            out = mx.where(opening, logits, out)
        return out

    def _follow(self, tail: list[int], size: int) -> None:
        """Take the tokens written since the last call (`tail` starts one token earlier, for
        two-token markers' sake)."""
        markers = self._markers
        if self._state == "before":
            self._state = "inside" if _ends_with(tail, markers.start) else "after"
        elif self._state == "inside":
            call = markers.call_start
            if _ends_with(tail, markers.end) or (call and _ends_with(tail, call)):
                self._state = "after"
                if self._grammar is not None:
                    self._grammar.restart(size)
            else:
                self._count += len(tail) - 1

    def _forced(self, tokens: list[int]) -> int:
        """The end marker's next token: after as much of it as the tokens already end with."""
        end = self._markers.end
        for n in range(len(end) - 1, 0, -1):
            if _ends_with(tokens, end[:n]):
                return end[n]
        return end[0]


def _ends_with(tokens: list[int], marker: tuple[int, ...]) -> bool:
    return len(tokens) >= len(marker) and tuple(tokens[-len(marker) :]) == marker


def _only(logits: mx.array, token: int) -> mx.array:
    """Logits that allow `token` alone."""
    keep = mx.arange(logits.shape[-1]) == token
    return mx.where(keep, logits, -mx.inf)
