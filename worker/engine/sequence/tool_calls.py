"""Tool calls read back from a sequence's text as it streams.

A `ToolCallScanner` sits after the stop-string matcher: text outside a call passes through,
text from the call's start marker to its end marker goes to a reader for the model's format
(worker/engine/sequence/call_readers.py; shared/wire/tools.py says which format a model gets),
which says
what may be sent of the call as it is written. The scanner numbers the calls of its sequence and
turns them into OpenAI's stream pieces (`ToolCallDelta`: the first with the call's id and name,
then its arguments) and, at each end marker, the whole `ToolCall`. A suffix that could still
become a marker is held back, so a client never sees part of one. Text between markers that is
no call is shown as it was written.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from mlx_lm.tool_parsers import json_tools

from shared.wire.ids import new_id
from shared.wire.tools import (
    CALL_END,
    CALL_START,
    FunctionCall,
    FunctionCallDelta,
    ToolCall,
    ToolCallDelta,
    ToolUse,
)
from worker.engine.sequence.call_readers import (
    CallPiece,
    CallReader,
    JsonCallReader,
    ParsedCallReader,
    Parser,
    ReadCall,
)
from worker.engine.sequence.harmony import HarmonyTokens


@dataclass
class Scanned:
    """What a piece of text gave: text to show, pieces of calls to send, calls completed."""

    text: str = ""
    deltas: list[ToolCallDelta] = field(default_factory=list)
    calls: list[ToolCall] = field(default_factory=list)


class ToolCallScanner:
    def __init__(self, start: str, end: str, reader: Callable[[], CallReader]):
        self._start = start
        self._end = end
        self._new_reader = reader
        self._buffer = ""
        self._reader: CallReader | None = None  # set while inside a call
        self._body: list[str] = []  # the call's text, shown as written if it is no call
        self._call_id: str | None = None  # the id of the call being sent
        self.made = 0

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
        got.deltas += [self._delta(piece) for piece in self._reader.feed(text)]

    def _close(self, got: Scanned, ended: bool) -> str:
        """The call's end (at its end marker, or the sequence's): the call is complete, or it
        is no call and its text is shown as written."""
        assert self._reader is not None
        pieces, call = self._reader.close()
        self._reader = None
        got.deltas += [self._delta(piece) for piece in pieces]
        if call is None:
            return self._start + "".join(self._body) + (self._end if ended else "")
        got.calls.append(self._call(call))
        return ""

    def _delta(self, piece: CallPiece) -> ToolCallDelta:
        if piece.name is None:
            return ToolCallDelta(
                index=self.made - 1, function=FunctionCallDelta(arguments=piece.arguments)
            )
        self._call_id = new_id("call_")
        self.made += 1
        function = FunctionCallDelta(name=piece.name, arguments=piece.arguments)
        return ToolCallDelta(
            index=self.made - 1, id=self._call_id, type="function", function=function
        )

    def _call(self, call: ReadCall) -> ToolCall:
        assert self._call_id is not None  # a reader sends a call's name before the call
        function = FunctionCall(name=call.name, arguments=call.arguments)
        return ToolCall(id=self._call_id, function=function)


def _partial_suffix(text: str, marker: str) -> int:
    """The length of the longest end of `text` that begins `marker`."""
    for n in range(min(len(text), len(marker) - 1), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0


@dataclass(frozen=True)
class ToolFormat:
    """How one model writes tool calls (shared/wire/tools.py explains the two cases)."""

    in_template: bool
    start: str
    end: str
    parse: Parser

    @classmethod
    def of(cls, tokenizer: Any) -> ToolFormat:
        if HarmonyTokens.of(tokenizer) is not None:
            # gpt-oss: its template renders the tools; its calls are harmony messages, which
            # the harmony split hands on in the JSON-tools format (sequence/harmony.py).
            return cls(True, CALL_START, CALL_END, json_tools.parse_tool_call)
        if tokenizer.has_tool_calling:
            start, end = tokenizer.tool_call_start, tokenizer.tool_call_end
            return cls(True, start, end, tokenizer.tool_parser)
        return cls(False, CALL_START, CALL_END, json_tools.parse_tool_call)

    def constrainable(self) -> bool:
        """Whether a forced call can be written by the grammar (the JSON-tools format)."""
        return (self.start, self.end) == (CALL_START, CALL_END) and (
            self.parse is json_tools.parse_tool_call
        )

    def scanner(self, tools: ToolUse) -> ToolCallScanner:
        if self.constrainable():  # the JSON-tools format: arguments stream as written
            names = frozenset(t.function.name for t in tools.tools)
            return ToolCallScanner(self.start, self.end, lambda: JsonCallReader(names))
        described = [t.model_dump(exclude_none=True) for t in tools.tools]
        return ToolCallScanner(
            self.start, self.end, lambda: ParsedCallReader(self.parse, described)
        )
