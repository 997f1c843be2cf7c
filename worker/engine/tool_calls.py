"""Tool calls read back from a sequence's text as it streams.

A `ToolCallScanner` sits after the stop-string matcher: text outside a call passes through,
text from the call's start marker to its end marker is held back and parsed with the model
family's mlx-lm parser (shared/wire/tools.py says which format a model gets) into an OpenAI
`ToolCall`. A suffix that could still become a start marker is held back too, so a client never
sees part of a marker. Text between markers that does not parse is shown as it was written.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from mlx_lm.tool_parsers import json_tools

from shared.wire.ids import new_id
from shared.wire.tools import CALL_END, CALL_START, FunctionCall, ToolCall, ToolUse

Parser = Callable[..., Any]  # mlx-lm's parse_tool_call(text, tools) -> {"name", "arguments"}


class ToolCallScanner:
    def __init__(self, start: str, end: str, parse: Parser, tools: list[dict[str, Any]]):
        self._start = start
        self._end = end
        self._parse = parse
        self._tools = tools
        self._buffer = ""
        self._inside = False
        self.made = 0

    def feed(self, text: str) -> tuple[str, list[ToolCall]]:
        """The text that may be shown now, and the calls completed by `text`."""
        self._buffer += text
        shown: list[str] = []
        calls: list[ToolCall] = []
        while True:
            marker = self._end if self._inside else self._start
            at = self._buffer.find(marker)
            if at < 0:
                if not self._inside:
                    keep = _partial_suffix(self._buffer, self._start)
                    shown.append(self._buffer[: len(self._buffer) - keep])
                    self._buffer = self._buffer[len(self._buffer) - keep :]
                return "".join(shown), calls
            before, self._buffer = self._buffer[:at], self._buffer[at + len(marker) :]
            if not self._inside:
                shown.append(before)
            else:
                call = self._call(before)
                if call is None:
                    shown.append(self._start + before + self._end)
                else:
                    calls.append(call)
            self._inside = not self._inside

    def finish(self) -> tuple[str, list[ToolCall]]:
        """At the end of the sequence: what is still held back. A call whose end marker never
        came is parsed as it stands (models often end on their stop token instead)."""
        rest, self._buffer = self._buffer, ""
        if not self._inside:
            return rest, []
        call = self._call(rest)
        return (self._start + rest, []) if call is None else ("", [call])

    def _call(self, body: str) -> ToolCall | None:
        try:
            parsed = self._parse(body, self._tools)
            name, arguments = parsed["name"], parsed.get("arguments", {})
        except Exception:  # any parser failure: the text is shown, not lost
            return None
        if not isinstance(name, str):
            return None
        text = arguments if isinstance(arguments, str) else json.dumps(arguments)
        self.made += 1
        return ToolCall(id=new_id("call_"), function=FunctionCall(name=name, arguments=text))


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
        described = [t.model_dump(exclude_none=True) for t in tools.tools]
        return ToolCallScanner(self.start, self.end, self.parse, described)
