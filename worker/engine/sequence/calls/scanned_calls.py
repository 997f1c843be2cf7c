"""What a tool-call scanner gives for a piece of a sequence's text (`Scanned`), and the numbering
of that sequence's calls into OpenAI's pieces (`CallNumbering`): each scanner
(worker/engine/sequence/calls/tool_calls.py's between markers, answer_calls.py's as the whole
answer) reads calls its own way and hands them on the same way."""

from __future__ import annotations

from dataclasses import dataclass, field

from shared.wire.generation.tools import FunctionCall, FunctionCallDelta, ToolCall, ToolCallDelta
from shared.wire.ids import new_id
from worker.engine.sequence.calls.call_readers import CallPiece, ReadCall


@dataclass
class Scanned:
    """What a piece of text gave: text to show, pieces of calls to send, calls completed."""

    text: str = ""
    deltas: list[ToolCallDelta] = field(default_factory=list)
    calls: list[ToolCall] = field(default_factory=list)


@dataclass
class CallNumbering:
    """A sequence's calls numbered in the order they are made: the first piece of each carries
    its new id and its name, the later ones its index only. A reader sends a call's first
    piece before the call, and its calls in the order it sent them (several may close at
    once: a section of calls)."""

    made: int = 0
    _ids: list[str] = field(default_factory=list)  # each call's id, by index
    _completed: int = 0  # calls handed on whole so far

    def delta(self, piece: CallPiece) -> ToolCallDelta:
        if piece.name is None:
            return ToolCallDelta(
                index=self.made - 1, function=FunctionCallDelta(arguments=piece.arguments)
            )
        self._ids.append(new_id("call_"))
        self.made += 1
        function = FunctionCallDelta(name=piece.name, arguments=piece.arguments)
        return ToolCallDelta(
            index=self.made - 1, id=self._ids[-1], type="function", function=function
        )

    def call(self, call: ReadCall) -> ToolCall:
        call_id = self._ids[self._completed]  # its first piece was sent before it
        self._completed += 1
        return ToolCall(id=call_id, function=FunctionCall(name=call.name, arguments=call.arguments))
