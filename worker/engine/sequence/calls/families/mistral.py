"""Mistral and Devstral: calls after `[TOOL_CALLS]`, with no end marker.

Markers: `[TOOL_CALLS]`, then either (tokenizers v11 and later: Mistral Small 3.2, Magistral,
Devstral)

    [TOOL_CALLS]NAME[ARGS]{JSON}[TOOL_CALLS]NAME[ARGS]{JSON}

(now and then with `[CALL_ID]ID` before `[ARGS]`), or (earlier tokenizers)

    [TOOL_CALLS][{"name": NAME, "arguments": {JSON}}, ...]

There is no end marker: the region runs to the end of the answer (the model ends its turn with
`</s>` after its calls), and every call in it is read. Arguments are one JSON object (a JSON
string holding one is taken too).

Malformations tolerated: `[TOOL_CALLS]` split across tokens (the scanner holds a partial marker
back, so nothing of it is shown), a repeated `[TOOL_CALLS]` between calls or none, white space
around the parts. Arguments whose JSON does not parse (cut short) make the region no call.

Forced calls (tool_choice required or named) are written in the v11 form (families/frames.py):
`[TOOL_CALLS]NAME[ARGS]{JSON}` for each call, JSON of its schema (a model of an earlier
tokenizer is forced into that form too; its parser reads both).
"""

from __future__ import annotations

import json
import re
from typing import Any

from worker.engine.sequence.calls.call_readers import ReadCall
from worker.engine.sequence.calls.families.frames import JsonFrame
from worker.engine.sequence.calls.families.syntax import (
    CallSyntax,
    CallSyntaxError,
    Opening,
    Tools,
    declared,
    json_arguments,
)

CALLS = "[TOOL_CALLS]"
_HEADER = re.compile(r"\s*([\w.-]+)\s*(?:\[CALL_ID\]\s*\w+\s*)?\[ARGS\]\s*")
_DECODER = json.JSONDecoder()


def parse(text: str, tools: Tools) -> list[ReadCall]:
    text = text.replace(CALLS, " ")
    if text.lstrip().startswith("["):
        return _listed(text, tools)
    calls = []
    at = 0
    while text[at:].strip():
        header = _HEADER.match(text, at)
        if header is None:
            raise CallSyntaxError("no NAME[ARGS] where a call should be")
        arguments, at = _decoded(text, header.end())
        calls.append(ReadCall(declared(tools, header[1]), _object(arguments)))
    if not calls:
        raise CallSyntaxError("no call after [TOOL_CALLS]")
    return calls


def _listed(text: str, tools: Tools) -> list[ReadCall]:
    """The earlier form: one JSON list of {"name", "arguments"} objects."""
    listed, end = _decoded(text, len(text) - len(text.lstrip()))
    if text[end:].strip() or not isinstance(listed, list) or not listed:
        raise CallSyntaxError("not a list of calls")
    calls = []
    for call in listed:
        if not isinstance(call, dict) or not isinstance(call.get("name"), str):
            raise CallSyntaxError("a listed call without its name")
        calls.append(ReadCall(declared(tools, call["name"]), _object(call.get("arguments", {}))))
    return calls


def _decoded(text: str, at: int) -> tuple[Any, int]:
    """The JSON value at `at`, and where it ends."""
    try:
        return _DECODER.raw_decode(text, at)
    except ValueError as err:
        raise CallSyntaxError("arguments are not JSON (cut short?)") from err


def _object(arguments: Any) -> str:
    if isinstance(arguments, str):  # some templates render the arguments as a JSON string
        return json_arguments(arguments)
    if not isinstance(arguments, dict):
        raise CallSyntaxError("arguments are not a JSON object")
    return json.dumps(arguments)


FRAME = JsonFrame(
    section_start="",
    call_start=CALLS,
    name_end="",
    arguments_start="[ARGS]",
    call_end="",
    section_end="",
)


SYNTAX = CallSyntax(
    name="mistral", openings=(Opening(CALLS, None),), parse=parse, grammar=FRAME.grammar
)
