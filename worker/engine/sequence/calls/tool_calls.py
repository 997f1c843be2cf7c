"""Tool calls read back from a sequence's text as it streams.

A `ToolCallScanner` sits after the stop-string matcher. Most families mark their calls, and a
`MarkedCallScanner` reads them: text outside a call passes through,
text from the call's start marker to its end marker goes to a reader for the model's format
(worker/engine/sequence/calls/call_readers.py; shared/wire/generation/tools.py says which format a
model gets), which says
what may be sent of the call as it is written. The scanner numbers the calls of its sequence and
turns them into OpenAI's stream pieces (`ToolCallDelta`: the first with the call's id and name,
then its arguments) and, at each end marker, the whole `ToolCall`. A suffix that could still
become a marker is held back, so a client never sees part of one. Text between markers that is
no call is shown as it was written. Llama 3.x writes a call as its whole answer, with no
markers: an `AnswerCallScanner` reads those (worker/engine/sequence/calls/answer_calls.py).
`ToolFormat` says which a model gets.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from mlx_lm.tool_parsers import json_tools

from shared.wire.generation.tools import (
    ANSWER_FRAME,
    CALL_END,
    CALL_START,
    JSON_TOOLS_FRAME,
    CallFrame,
    ToolUse,
)
from worker.engine.sequence.calls.answer_calls import AnswerCallScanner, writes_answer_calls
from worker.engine.sequence.calls.call_readers import (
    CallReader,
    JsonCallReader,
    ParsedCallReader,
    Parser,
)
from worker.engine.sequence.calls.scanned_calls import CallNumbering, Scanned
from worker.engine.sequence.harmony import HarmonyTokens

__all__ = ["MarkedCallScanner", "Scanned", "ToolCallScanner", "ToolFormat"]


class ToolCallScanner(Protocol):
    """A sequence's text read for calls as it streams."""

    @property
    def made(self) -> int:
        """How many calls the sequence has made so far."""
        ...

    def feed(self, text: str) -> Scanned:
        """What `text` gives: the text that may be shown now, call pieces, completed calls."""
        ...

    def finish(self) -> Scanned:
        """At the end of the sequence: what is still held back."""
        ...


class MarkedCallScanner:
    """Calls between a start and an end marker, read by a reader of the family's format."""

    def __init__(self, start: str, end: str, reader: Callable[[], CallReader]):
        self._start = start
        self._end = end
        self._new_reader = reader
        self._buffer = ""
        self._reader: CallReader | None = None  # set while inside a call
        self._body: list[str] = []  # the call's text, shown as written if it is no call
        self._numbering = CallNumbering()

    @property
    def made(self) -> int:
        return self._numbering.made

    def feed(self, text: str) -> Scanned:
        """What `text` gives: the text that may be shown now, call pieces, completed calls."""
        self._buffer += text
        got = Scanned()
        shown: list[str] = []
        while True:
            marker = self._end if self._reader is not None else self._start
            at = self._buffer.find(marker)
            if at < 0:
                keep = _partial_suffix(self._buffer, marker)
                rest = self._buffer[: len(self._buffer) - keep]
                self._buffer = self._buffer[len(self._buffer) - keep :]
                if self._reader is None:
                    shown.append(rest)
                else:
                    self._inside(rest, got)
                got.text = "".join(shown)
                return got
            before, self._buffer = self._buffer[:at], self._buffer[at + len(marker) :]
            if self._reader is None:
                shown.append(before)
                self._reader, self._body = self._new_reader(), []
            else:
                self._inside(before, got)
                shown.append(self._close(got, ended=True))

    def finish(self) -> Scanned:
        """At the end of the sequence: what is still held back. A call whose end marker never
        came is read as it stands (models often end on their stop token instead)."""
        got = Scanned()
        rest, self._buffer = self._buffer, ""
        if self._reader is None:
            got.text = rest
        else:
            self._inside(rest, got)
            got.text = self._close(got, ended=False)
        return got

    def _inside(self, text: str, got: Scanned) -> None:
        assert self._reader is not None
        self._body.append(text)
        got.deltas += [self._numbering.delta(piece) for piece in self._reader.feed(text)]

    def _close(self, got: Scanned, ended: bool) -> str:
        """The call's end (at its end marker, or the sequence's): the call is complete, or it
        is no call and its text is shown as written."""
        assert self._reader is not None
        pieces, call = self._reader.close()
        self._reader = None
        got.deltas += [self._numbering.delta(piece) for piece in pieces]
        if call is None:
            return self._start + "".join(self._body) + (self._end if ended else "")
        got.calls.append(self._numbering.call(call))
        return ""


def _partial_suffix(text: str, marker: str) -> int:
    """The length of the longest end of `text` that begins `marker`."""
    for n in range(min(len(text), len(marker) - 1), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0


@dataclass(frozen=True)
class ToolFormat:
    """How one model writes tool calls (shared/wire/generation/tools.py explains the cases)."""

    in_template: bool
    start: str
    end: str
    parse: Parser
    # The call is the whole answer, with no markers (Llama 3.x: calls/answer_calls.py).
    whole_answer: bool = False

    @classmethod
    def of(cls, tokenizer: Any) -> ToolFormat:
        if HarmonyTokens.of(tokenizer) is not None:
            # gpt-oss: its template renders the tools; its calls are harmony messages, which
            # the harmony split hands on in the JSON-tools format (sequence/harmony.py).
            return cls(True, CALL_START, CALL_END, json_tools.parse_tool_call)
        if tokenizer.has_tool_calling:
            start, end = tokenizer.tool_call_start, tokenizer.tool_call_end
            return cls(True, start, end, tokenizer.tool_parser)
        template = getattr(tokenizer, "chat_template", None)
        if writes_answer_calls(tokenizer, template if isinstance(template, str) else None):
            return cls(True, "", "", json_tools.parse_tool_call, whole_answer=True)
        return cls(False, CALL_START, CALL_END, json_tools.parse_tool_call)

    def call_frame(self) -> CallFrame | None:
        """How the grammar writes a forced call in this format; None: it cannot (a family's
        own syntax other than JSON)."""
        if self.whole_answer:
            return ANSWER_FRAME
        if self._json_tools():
            return JSON_TOOLS_FRAME
        return None

    def _json_tools(self) -> bool:
        return (self.start, self.end) == (CALL_START, CALL_END) and (
            self.parse is json_tools.parse_tool_call
        )

    def scanner(self, tools: ToolUse) -> ToolCallScanner:
        names = frozenset(t.function.name for t in tools.tools)
        if self.whole_answer:
            return AnswerCallScanner(names)
        if self._json_tools():  # arguments stream as written
            return MarkedCallScanner(self.start, self.end, lambda: JsonCallReader(names))
        described = [t.model_dump(exclude_none=True) for t in tools.tools]
        return MarkedCallScanner(
            self.start, self.end, lambda: ParsedCallReader(self.parse, described)
        )
