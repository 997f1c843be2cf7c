"""Qwen3-Coder and Qwen3.5+: XML calls with bare-text values.

Markers: `<tool_call>` ... `</tool_call>` around each call; inside, as the template writes it,

    <function=NAME>
    <parameter=KEY>
    VALUE
    </parameter>
    </function>

How it is read: each `<function=NAME>` block (several in one wrapper are several calls), its
parameters in order; a value loses the one newline the template writes on each side of it and
is coerced by the tool's schema (families/values.py: a value that does not coerce stays a
string and the call is kept).

Malformations tolerated (mlx-lm's `qwen3_coder` parser, which takes the first `</parameter>`,
truncates or drops these):
- a literal `</parameter>` inside a value (code that mentions the tag): a parameter ends at the
  last `</parameter>` before the next parameter or the function's end, and only a
  `<parameter=` that follows a closed parameter (or the function's name) starts a new one;
- a literal `<function=` inside a value, likewise: only one after `</function>` starts a call;
- a call written without its `<tool_call>` wrapper: a bare `<function=...>...</function>` is read
  as a call too (the second opening; there, a literal `</function>` inside a value ends the call
  early, and the call is then read up to it). The price: prose that writes `<function=` is held
  back from the stream until its `</function>` or the answer's end, then shown as written;
- a call cut short by the end token: a missing `</parameter>` or `</function>` is taken as
  written.

Forced calls (tool_choice required or named) are written in this syntax, as the template
writes a call (families/frames.py): string values free text up to `</parameter>`, others JSON
of their schema; parallel calls one wrapper each, a newline between.
"""

from __future__ import annotations

import re

from worker.engine.sequence.calls.call_readers import ReadCall
from worker.engine.sequence.calls.families.frames import XmlFrame
from worker.engine.sequence.calls.families.syntax import (
    CallSyntax,
    CallSyntaxError,
    Opening,
    Tools,
    declared,
    schema_of,
)
from worker.engine.sequence.calls.families.values import arguments_json

FUNCTION = "<function="
FUNCTION_END = "</function>"
PARAMETER = "<parameter="
PARAMETER_END = "</parameter>"


def parse(text: str, tools: Tools) -> list[ReadCall]:
    starts = [m.start() for m in _opens(text, FUNCTION, FUNCTION_END)]
    if not starts:
        raise CallSyntaxError("no <function=...> block")
    ends = [*starts[1:], len(text)]
    return [_call(text[a + len(FUNCTION) : b], tools) for a, b in zip(starts, ends, strict=True)]


def _call(block: str, tools: Tools) -> ReadCall:
    """One `<function=` block, from after its opener to the next block (or the text's end)."""
    name, closed, body = block.partition(">")
    if not closed:
        raise CallSyntaxError("a function's name is not closed")
    name = declared(tools, name)
    end = body.rfind(FUNCTION_END)
    if end >= 0:
        if body[end + len(FUNCTION_END) :].strip():
            raise CallSyntaxError("text after </function>")
        body = body[:end]
    values = dict(_parameters(body))
    return ReadCall(name, arguments_json(values, schema_of(tools, name)))


def _parameters(body: str) -> list[tuple[str, str]]:
    """A function's parameters, in order, as (key, value text)."""
    opens = [m.end() for m in _opens(body, PARAMETER, PARAMETER_END)]
    if not opens:
        if body.strip():
            raise CallSyntaxError("text in a function that is no parameter")
        return []
    found = []
    for at, following in zip(opens, [*opens[1:], None], strict=True):
        stop = len(body) if following is None else following - len(PARAMETER)
        segment = body[at:stop]
        key, closed, value = segment.partition(">")
        if not closed or not key.strip():
            raise CallSyntaxError("a parameter's name is not closed")
        last = value.rfind(PARAMETER_END)
        if last >= 0:
            value = value[:last]
        found.append((key.strip(), _unwrapped(value)))
    return found


def _opens(text: str, opener: str, closer: str) -> list[re.Match[str]]:
    """The `opener`s that start an element: the first, at the text's start, and each after a
    closed one (an opener inside a value, not after its `closer`, is part of the value)."""
    opens: list[re.Match[str]] = []
    for match in re.finditer(re.escape(opener), text):
        before = text[: match.start()].rstrip()
        if not opens:
            if before:
                raise CallSyntaxError(f"text before the first {opener}")
            opens.append(match)
        elif before.endswith(closer):
            opens.append(match)
    return opens


def _unwrapped(value: str) -> str:
    """A value less the one newline the template writes on each side of it."""
    if value.startswith("\n"):
        value = value[1:]
    return value[:-1] if value.endswith("\n") else value


FRAME = XmlFrame(
    call_start="<tool_call>\n" + FUNCTION,
    name_end=">\n",
    key_start=PARAMETER,
    key_end=">\n",
    value_end="\n" + PARAMETER_END + "\n",
    call_end=FUNCTION_END + "\n</tool_call>",
    between="\n",
)


SYNTAX = CallSyntax(
    name="qwen3_coder",
    openings=(
        Opening("<tool_call>", "</tool_call>"),
        Opening(FUNCTION, FUNCTION_END, kept=True),
    ),
    parse=parse,
    grammar=FRAME.grammar,
)
