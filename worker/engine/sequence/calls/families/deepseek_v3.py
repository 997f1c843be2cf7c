"""DeepSeek V3, R1 and V3.1: calls between fullwidth-bar markers.

Markers, written here with `|` and spaces where the vocabulary has fullwidth bars (U+FF5C) and
U+2581 (tests/families/vocab.py's `deepseek` writes them so):

    <|tool calls begin|><|tool call begin|>NAME<|tool sep|>{JSON}<|tool call end|><|tool calls end|>

That is V3.1's. V3 and R1 write `function<|tool sep|>NAME` and then the arguments in a fenced
JSON block (three backticks, `json`, a newline). Both are read: every `<|tool call begin|>`
in the section is a call, its arguments one JSON object.

mlx-lm has no parser for this family: without this module a DeepSeek model's calls were never
read. Malformations tolerated: a call written without the section (the second opening), a
fence without its closing backticks, a call cut short (no `<|tool call end|>`) whose JSON is
whole. Arguments that are not a JSON object make the section no call.

The family is told apart by its template: it writes `<|tool calls begin|>` and renders the
request's `tools` (R1's template renders past calls but no tools, so R1 keeps mlxq's fallback
format, shared/wire/generation/tools.py).

Forced calls (tool_choice required or named) are written in V3.1's form (families/frames.py):
one section, each call `NAME<|tool sep|>{JSON}` with JSON of its schema.
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


def marker(words: str) -> str:
    """A DeepSeek marker by its words: fullwidth bars around them, U+2581 for each space."""
    return "<\uff5c" + words.replace(" ", "\u2581") + "\uff5c>"


SECTION, SECTION_END = marker("tool calls begin"), marker("tool calls end")
CALL, SEPARATOR, CALL_END = marker("tool call begin"), marker("tool sep"), marker("tool call end")
# V3/R1's arguments: ```json ... ``` (the closing fence may be missing when cut short).
_FENCED = re.compile(r"^\s*```(?:json)?\s*\n(.*?)(?:\n?```)?\s*$", re.DOTALL)


def parse(text: str, tools: Tools) -> list[ReadCall]:
    return [_call(h, b, tools) for h, b in headed_calls(text, CALL, SEPARATOR, CALL_END)]


def _call(header: str, body: str, tools: Tools) -> ReadCall:
    if header.strip() == "function":  # V3 and R1: the name on the separator's line
        name, _, body = body.partition("\n")
        fenced = _FENCED.match(body) if body.lstrip().startswith("```") else None
        body = fenced.group(1) if fenced else body
        return ReadCall(declared(tools, name), json_arguments(body))
    return ReadCall(declared(tools, header), json_arguments(body))


def writes_this(template: str | None) -> bool:
    """Whether a chat template is this family's and renders the request's tools."""
    if template is None or SECTION not in template:
        return False
    return re.search(r"\btools\b", template) is not None


FRAME = JsonFrame(
    section_start=SECTION,
    call_start=CALL,
    name_end="",
    arguments_start=SEPARATOR,
    call_end=CALL_END,
    section_end=SECTION_END,
)


SYNTAX = CallSyntax(
    name="deepseek_v3",
    openings=(Opening(SECTION, SECTION_END), Opening(CALL, CALL_END, kept=True)),
    parse=parse,
    grammar=FRAME.grammar,
)
