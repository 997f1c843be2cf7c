"""GLM-4.5, 4.6 and 4.7: a call's name, then its arguments as key and value tags.

Markers: `<tool_call>` ... `</tool_call>` around each call (parallel calls are one wrapper
each); inside,

    NAME
    <arg_key>KEY</arg_key>
    <arg_value>VALUE</arg_value>

(GLM-4.5 and 4.6 put each on its own line; 4.7 writes them with no newlines between.)

How it is read: the name, then each key and value, the value coerced by the tool's schema
(families/values.py). A call with no arguments is its name alone.

Malformations tolerated:
- a missing `<arg_key>` or `<arg_value>` opener (vLLM's tracker saw 5-17% of calls at
  concurrency 6 lose one): keys and values are found by their closers, so an opener is optional;
  when the first key's opener is missing and 4.7 wrote no newline after the name, the name is
  the declared tool's name the text starts with;
- zero-argument calls (`<tool_call>NAME</tool_call>`) and arguments written as one JSON object
  after the name (some GLM outputs do);
- a call cut short by the end token: a last value with no `</arg_value>` is taken as written.

Forced calls (tool_choice required or named) are written in GLM-4.7's form, no newlines
inside a call (families/frames.py): string values free text up to `</arg_value>`, others JSON
of their schema; parallel calls one wrapper each, a newline between. 4.5 and 4.6 put newlines
there; their parser reads both.
"""

from __future__ import annotations

from worker.engine.sequence.calls.call_readers import ReadCall
from worker.engine.sequence.calls.families.frames import XmlFrame
from worker.engine.sequence.calls.families.syntax import (
    CallSyntax,
    CallSyntaxError,
    Opening,
    Tools,
    declared,
    json_arguments,
    schema_of,
)
from worker.engine.sequence.calls.families.values import arguments_json

KEY, KEY_END = "<arg_key>", "</arg_key>"
VALUE, VALUE_END = "<arg_value>", "</arg_value>"


def parse(text: str, tools: Tools) -> list[ReadCall]:
    name, rest = _name(text, tools)
    if rest.strip().startswith("{"):  # the arguments as one JSON object
        return [ReadCall(name, json_arguments(rest))]
    values = dict(_pairs(rest))
    return [ReadCall(name, arguments_json(values, schema_of(tools, name)))]


def _name(text: str, tools: Tools) -> tuple[str, str]:
    """The call's name and the text after it."""
    text = text.strip()
    opener, closer = text.find(KEY), text.find(KEY_END)
    if closer >= 0 and not 0 <= opener < closer:
        # The first key lost its opener: the name ends at its line, or (4.7 writes no newline
        # after it) it is the longest declared name the text starts with.
        line, newline, _ = text.partition("\n")
        if newline and len(line) < closer:
            return declared(tools, line), text[len(line) :]
        names = [
            n for t in tools if text.startswith(n := (t.get("function") or {}).get("name", "?"))
        ]
        if not names:
            raise CallSyntaxError("no declared tool's name opens the call")
        name = max(names, key=len)
        return name, text[len(name) :]
    first = min((at for at in (opener, text.find("{")) if at >= 0), default=len(text))
    return declared(tools, text[:first]), text[first:]


def _pairs(text: str) -> list[tuple[str, str]]:
    """The (key, value text) pairs, found by their closers; the openers are optional."""
    found = []
    rest = text
    while rest.strip():
        key, closed, rest = rest.partition(KEY_END)
        if not closed:
            raise CallSyntaxError("text that is no argument")
        key = _opened(key, KEY)
        value, _, rest = rest.partition(VALUE_END)  # none: cut short, the value as written
        if not key or (VALUE_END in value or KEY_END in value):
            raise CallSyntaxError("an argument without its key")
        found.append((key, _value(value)))
    return found


def _opened(text: str, opener: str) -> str:
    """A key's text, less white space around it and its opener, if written."""
    text = text.strip()
    return text[len(opener) :].strip() if text.startswith(opener) else text


def _value(text: str) -> str:
    """A value's text: exactly what its tags hold, or (its opener lost) what follows the
    newline after its key."""
    text = text.lstrip()
    return text[len(VALUE) :] if text.startswith(VALUE) else text.rstrip()


FRAME = XmlFrame(
    call_start="<tool_call>",
    name_end="",
    key_start=KEY,
    key_end=KEY_END + VALUE,
    value_end=VALUE_END,
    call_end="</tool_call>",
    between="\n",
)


SYNTAX = CallSyntax(
    name="glm",
    openings=(Opening("<tool_call>", "</tool_call>"),),
    parse=parse,
    grammar=FRAME.grammar,
)
