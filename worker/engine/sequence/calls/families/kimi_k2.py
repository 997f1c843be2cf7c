"""Kimi K2: calls in a section, each with an id that names the function.

Markers:

    <|tool_calls_section_begin|>
    <|tool_call_begin|>functions.NAME:0<|tool_call_argument_begin|>{JSON}<|tool_call_end|>
    <|tool_call_begin|>functions.NAME:1<|tool_call_argument_begin|>{JSON}<|tool_call_end|>
    <|tool_calls_section_end|>

How it is read: every `<|tool_call_begin|>` in the section is a call; its id is
`functions.NAME:INDEX`, and the name is what stands between the `functions.` prefix and the
`:INDEX` counter; the arguments are one JSON object.

mlx-lm's `kimi_k2` parser reads these right, but gives a list even for one call, which mlxq's
reader of mlx-lm parsers took for no call (the section was shown as text): this module replaces
it. Malformations tolerated: an id without the `functions.` prefix or the counter; a call
written without its section (the second opening); a call cut short (no `<|tool_call_end|>`)
whose JSON is whole; empty arguments (`{}` or nothing). Arguments that are not a JSON object
make the section no call.

Forced calls (tool_choice required or named) are written in this syntax (families/frames.py):
one section, each call's id `functions.NAME:N`, its arguments JSON of its schema.
"""

from __future__ import annotations

import re

from worker.engine.sequence.calls.call_readers import ReadCall
from worker.engine.sequence.calls.families.frames import JsonFrame
from worker.engine.sequence.calls.families.syntax import (
    CallSyntax,
    Opening,
    Tools,
    declared,
    headed_calls,
    json_arguments,
)

SECTION, SECTION_END = "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"
CALL, ARGUMENTS, CALL_END = (
    "<|tool_call_begin|>",
    "<|tool_call_argument_begin|>",
    "<|tool_call_end|>",
)
_COUNTER = re.compile(r":\d+$")


def parse(text: str, tools: Tools) -> list[ReadCall]:
    return [
        ReadCall(declared(tools, _name(header)), json_arguments(body))
        for header, body in headed_calls(text, CALL, ARGUMENTS, CALL_END)
    ]


def _name(call_id: str) -> str:
    """The function's name in a call's id (`functions.NAME:0`)."""
    return _COUNTER.sub("", call_id.strip()).removeprefix("functions.")


FRAME = JsonFrame(
    section_start=SECTION,
    call_start=CALL + "functions.",
    name_end=":",
    arguments_start=ARGUMENTS,
    call_end=CALL_END,
    section_end=SECTION_END,
    counted=True,
)


SYNTAX = CallSyntax(
    name="kimi_k2",
    openings=(Opening(SECTION, SECTION_END), Opening(CALL, CALL_END, kept=True)),
    parse=parse,
    grammar=FRAME.grammar,
)
