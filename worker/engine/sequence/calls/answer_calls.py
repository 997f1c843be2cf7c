"""Tool calls written as the whole answer, with no markers around them: Llama 3.x's JSON tools.

Llama 3.1, 3.2 and 3.3 call a custom tool by answering with nothing but
`{"name": ..., "parameters": {...}}` (their chat template asks for that form and renders earlier
calls in it), now and then after `<|python_tag|>`, several calls one after another separated by
`;` or white space. None of mlx-lm's parsers matches that template, so the family is told apart
here (`writes_answer_calls`: the vocabulary's `<|python_tag|>`, a template that speaks of
`ipython` and `"parameters"`) and its calls are read by an `AnswerCallScanner`.

The scanner looks at the answer's opening: one that opens with `{` is read as a call by the
JSON-tools reader (worker/engine/sequence/calls/call_readers.py, which takes `parameters` as the
arguments), so the name and then the arguments stream as they are written; any other opening
is text, shown as it streams from then on. A JSON object that names none of the request's
tools is no call: it is shown as written once it closes. A built-in tool call
(`<|python_tag|>brave_search.call(...)`) opens with no `{`, so it is text.
"""

from __future__ import annotations

from typing import Any, Literal

from worker.engine.sequence.calls.call_readers import JsonCallReader
from worker.engine.sequence.calls.scanned_calls import CallNumbering, Scanned

PYTHON_TAG = "<|python_tag|>"
_BETWEEN = " \t\r\n;"  # what may stand before, between and after the calls


def writes_answer_calls(tokenizer: Any, chat_template: str | None) -> bool:
    """Whether the model is a Llama 3.x with JSON tools: its calls are its whole answer."""
    if chat_template is None or PYTHON_TAG not in tokenizer.get_vocab():
        return False
    return "ipython" in chat_template and '"parameters"' in chat_template


def _opening(text: str) -> str:
    """`text` from where a call could begin: after separators and one `<|python_tag|>`."""
    text = text.lstrip(_BETWEEN)
    if text.startswith(PYTHON_TAG):
        text = text[len(PYTHON_TAG) :].lstrip(_BETWEEN)
    return text


class AnswerCallScanner:
    """A sequence's answer read as calls, or as text once anything but a call opens."""

    def __init__(self, names: frozenset[str]):
        self._names = names  # the request's tools: a call names one of them
        self._state: Literal["opening", "call", "text"] = "opening"
        self._buffer = ""  # the opening, until it says what comes
        self._held = ""  # the separators before the call being read
        self._body = ""  # the call's text, shown as written if it is no call
        self._reader: JsonCallReader | None = None  # set while inside a call
        self._numbering = CallNumbering()

    @property
    def made(self) -> int:
        return self._numbering.made

    def feed(self, text: str) -> Scanned:
        got = Scanned()
        shown: list[str] = []
        rest: str | None = text
        while rest:
            if self._state == "text":
                shown.append(rest)
                rest = None
            elif self._state == "call":
                rest = self._read(rest, got, shown)
            else:
                rest = self._open(rest)
        got.text = "".join(shown)
        return got

    def finish(self) -> Scanned:
        """At the end of the sequence: a call left open is read as it stands (the model ended
        on its end token); an opening held back is shown, unless it only followed calls."""
        got = Scanned()
        shown: list[str] = []
        if self._state == "call":
            self._end_call(got, shown)
        elif self._state == "opening" and not self.made:
            shown.append(self._buffer)
        self._buffer = ""
        got.text = "".join(shown)
        return got

    def _open(self, text: str) -> str | None:
        """More of the opening; what is left to read once it says what comes (None: it does
        not say yet, all of it could still open a call)."""
        self._buffer += text
        opening = _opening(self._buffer)
        if not opening or PYTHON_TAG.startswith(opening):
            return None
        if opening.startswith("{"):
            self._state, self._reader, self._body = "call", JsonCallReader(self._names), ""
            self._held = self._buffer[: len(self._buffer) - len(opening)]
        else:
            self._state, opening = "text", self._buffer
        self._buffer = ""
        return opening

    def _read(self, text: str, got: Scanned, shown: list[str]) -> str | None:
        """More of a call; the text after it, once its object has closed."""
        assert self._reader is not None
        got.deltas += [self._numbering.delta(piece) for piece in self._reader.feed(text)]
        if not self._reader.ended:
            self._body += text
            return None
        rest = self._reader.rest()
        self._body += text[: len(text) - len(rest)]
        self._end_call(got, shown)
        return rest

    def _end_call(self, got: Scanned, shown: list[str]) -> None:
        assert self._reader is not None
        pieces, calls = self._reader.close()
        self._reader = None
        got.deltas += [self._numbering.delta(piece) for piece in pieces]
        if not calls:
            shown.append(self._held + self._body)
            self._state = "text"
        else:
            got.calls += [self._numbering.call(call) for call in calls]
            self._state = "opening"
