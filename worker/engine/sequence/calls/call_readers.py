"""Reading one tool call's text, between its markers, as the model writes it.

A `ToolCallScanner` (worker/engine/sequence/calls/tool_calls.py) hands each call's text to a reader
as it streams, and the reader says what may be sent of the call so far (`CallPiece`s: first its
name, then its arguments text) and, at the call's end marker, the call itself:

- `JsonCallReader`, for the JSON-tools format (`{"name": ..., "arguments": {...}}`, the fallback's
  and Hermes/Qwen 2.5's; Llama 3.x names the arguments `parameters`, and either key is read):
  the name once its string is written, then the arguments object's raw text as it is written,
  up to its closing brace. The call's `arguments` is exactly what was
  sent, so the pieces a client joins are the arguments (and parse as JSON once the object
  closes).
- `ParsedCallReader`, for every other family: the family's parser (mlxq's own,
  worker/engine/sequence/calls/families/, or mlx-lm's where it is right) reads the whole text at
  the end marker, and each call in it is sent in one piece.

A call whose text never gave the name of one of the request's tools is not a call: the scanner
shows its text as written.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

# A family's parser: a region's text and the request's tools (as mlx-lm's parsers take them)
# to every call in it; it raises where the text is no call.
ParseCalls = Callable[[str, list[dict[str, Any]]], list["ReadCall"]]
_SPACE = " \t\r\n"
# The key of a call's arguments: the JSON-tools format's, and Llama 3.x's.
ARGUMENT_KEYS = ("arguments", "parameters")


@dataclass(frozen=True)
class CallPiece:
    """What may be sent of a call now: its name (once, first), and more of its arguments."""

    arguments: str
    name: str | None = None


@dataclass(frozen=True)
class ReadCall:
    """A whole call read back: its name and its arguments (JSON text)."""

    name: str
    arguments: str


class CallReader(Protocol):
    def feed(self, text: str) -> list[CallPiece]:
        """More of the call's text; what may be sent of the call now."""
        ...

    def close(self) -> tuple[list[CallPiece], list[ReadCall]]:
        """The call's text has ended: the last pieces, and the calls (none: it is no call)."""
        ...


class ParsedCallReader:
    """Calls in a family's own format, parsed whole at the region's end; each sent in one
    piece. All or nothing: if the parser fails on any of the region's calls, or one names a
    function the request did not declare, the region is no call and is shown as written."""

    def __init__(self, parse: ParseCalls, tools: list[dict[str, Any]]):
        self._parse = parse
        self._tools = tools
        self._names = {t["function"]["name"] for t in tools}
        self._text: list[str] = []

    def feed(self, text: str) -> list[CallPiece]:
        self._text.append(text)
        return []

    def close(self) -> tuple[list[CallPiece], list[ReadCall]]:
        try:
            calls = self._parse("".join(self._text), self._tools)
        except Exception:  # any parser failure (mlx-lm's raise anything): the text is shown
            return [], []
        if not calls or any(call.name not in self._names for call in calls):
            return [], []
        return [CallPiece(call.arguments, call.name) for call in calls], calls


class JsonCallReader:
    """A JSON-tools call, read character by character: the top-level object's keys, the name's
    string, and the span of the arguments value (an object or array streams as it is written;
    a string is sent decoded, and any other value whole, once complete)."""

    def __init__(self, names: frozenset[str]):
        self._names = names  # the request's tools: a call names one of them
        self._text = ""
        self._at = 0  # the next character to read
        self._depth = 0
        self._in_string = False
        self._escape = False
        self._string_start = 0  # where the top-level string being read began
        self._expect = "key"  # at depth 1: key, colon, value, "in value", or comma (after one)
        self._key: str | None = None
        self._value_start: int | None = None
        self._name: str | None = None
        self._arguments: str | None = None  # the arguments value, once it is complete
        self._streaming = False  # the arguments value is an object or array being written
        self._sent = 0  # characters of the arguments sent so far
        self._named = False  # the piece with the name has been sent
        self._closed = False  # the top-level object has closed (or the text is no object)

    def feed(self, text: str) -> list[CallPiece]:
        self._text += text
        while self._at < len(self._text) and not self._closed:
            self._read(self._text[self._at])
            self._at += 1
        return self._pieces()

    @property
    def ended(self) -> bool:
        """Whether the call's object has closed (or the text turned out to be no object)."""
        return self._closed

    def rest(self) -> str:
        """The text fed after the point where reading ended (after the object's last brace)."""
        return self._text[self._at :]

    def close(self) -> tuple[list[CallPiece], list[ReadCall]]:
        if self._name is None:
            return [], []
        pieces = self._pieces()
        if self._arguments is None and not self._streaming:
            self._arguments = "{}"  # a call that never wrote its arguments takes none
            pieces += self._pieces()
        return pieces, [ReadCall(self._name, self._written())]

    def _written(self) -> str:
        """The arguments text sent so far (all of it, once the name is known)."""
        if self._arguments is not None:
            return self._arguments
        if self._streaming and self._value_start is not None:
            return self._text[self._value_start : self._at]
        return ""

    def _pieces(self) -> list[CallPiece]:
        if self._name is None:
            return []
        written = self._written()
        more, self._sent = written[self._sent :], len(written)
        if not self._named:
            self._named = True
            return [CallPiece(more, self._name)]
        return [CallPiece(more)] if more else []

    def _read(self, char: str) -> None:
        if self._in_string:
            self._read_in_string(char)
        elif char == '"':
            self._in_string = True
            if self._depth == 1:
                self._string_start = self._at
                self._value_began()
        elif char in "{[]}":
            self._read_bracket(char)
        elif self._depth == 1:
            self._read_top_level(char)
        elif self._depth == 0 and char not in _SPACE:
            self._closed = True  # text before the object: not the JSON-tools format

    def _read_bracket(self, char: str) -> None:
        if char in "{[":
            self._depth += 1
            if self._depth == 2:
                self._value_began()
            return
        self._depth -= 1
        if self._depth == 1:
            self._value_ended(self._at + 1)
        elif self._depth <= 0:
            self._scalar_ended()
            self._closed = True

    def _read_in_string(self, char: str) -> None:
        if self._escape:
            self._escape = False
        elif char == "\\":
            self._escape = True
        elif char == '"':
            self._in_string = False
            if self._depth == 1:
                if self._expect == "key":
                    key = _decoded(self._text[self._string_start : self._at + 1])
                    self._key = key if isinstance(key, str) else None
                    self._expect = "colon"
                else:
                    self._value_ended(self._at + 1)

    def _read_top_level(self, char: str) -> None:
        if char == ":" and self._expect == "colon":
            self._expect = "value"
        elif char == ",":
            self._scalar_ended()
            self._expect = "key"
        elif char in _SPACE:
            self._scalar_ended()
        else:
            self._value_began()

    def _value_began(self) -> None:
        if self._expect != "value":
            return
        self._expect = "in value"
        self._value_start = self._at
        self._streaming = (
            self._key in ARGUMENT_KEYS and self._arguments is None and self._text[self._at] in "{["
        )

    def _scalar_ended(self) -> None:
        if self._expect == "in value":
            self._value_ended(self._at)

    def _value_ended(self, end: int) -> None:
        if self._expect != "in value" or self._value_start is None:
            return
        self._expect = "comma"
        raw = self._text[self._value_start : end]
        if self._key == "name" and self._name is None:
            name = _decoded(raw)
            self._name = name if name in self._names else None
        elif self._key in ARGUMENT_KEYS and self._arguments is None:
            self._streaming = False
            decoded = _decoded(raw) if raw.startswith('"') else raw
            self._arguments = decoded if isinstance(decoded, str) else "{}"


def _decoded(raw: str) -> Any:
    """A JSON value's text decoded; None where it is not valid JSON."""
    try:
        return json.loads(raw)
    except ValueError:
        return None
