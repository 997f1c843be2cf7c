"""Forced calls written in a family's own syntax: the Lark grammar (llguidance) of the calls a
`ToolUse` allows, each call a frame of fixed text around its name and arguments. Two kinds:
XML-like frames, whose arguments are key/value elements (`XmlFrame`: Qwen3-Coder, GLM), and
frames whose arguments are one JSON object (`JsonFrame`: Kimi K2, DeepSeek V3.1, Mistral v11),
written with json.dumps' separators as the JSON-tools grammar fixes them.

A family gives the frame's pieces (`XmlFrame`): the text before a call's name, after it, around
each parameter's key and after its value, the call's end, and what stands between two calls. A
string value is free text up to the parameter's closer (a lazy lexeme: it ends at the first
closer, which the family's parser reads the same way); any other value is JSON following its
schema (`%json`, with json.dumps' separators, as the JSON-tools grammar fixes them). Required
parameters are written in the schema's order, each optional one may be left out.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from llguidance import LLMatcher

from shared.wire.generation.tools import FunctionDefinition, ToolUse, lark_text

_JSON = {"whitespace_flexible": False, "key_separator": ": ", "item_separator": ", "}


@dataclass(frozen=True)
class XmlFrame:
    """The fixed text of one family's call: `call_start NAME name_end`, then per parameter
    `key_start KEY key_end VALUE value_end`, then `call_end`; `between` joins two calls."""

    call_start: str
    name_end: str
    key_start: str
    key_end: str
    value_end: str
    call_end: str
    between: str = ""

    def grammar(self, tools: ToolUse, tokens: Mapping[str, int]) -> str:
        """The grammar of the calls `tools.choice` allows, written in this frame; `tokens`: the
        markers the vocabulary holds as one added token (shared's `lark_text`)."""
        rules: list[str] = []
        written = _Written(self, tokens)
        calls = [_call(written, f, i, rules) for i, f in enumerate(tools.allowed())]
        rules.insert(0, f"call: {' | '.join(calls)}")
        joined = f"{lark_text(self.between, tokens)} call" if self.between else "call"
        start = f"start: call ({joined})*" if tools.several() else "start: call"
        lark = "\n".join([start, *rules]) + "\n"
        return str(LLMatcher.grammar_from_lark(lark))


@dataclass(frozen=True)
class JsonFrame:
    """A section of calls whose arguments are JSON: `section_start`, then per call
    `call_start NAME name_end [COUNTER] arguments_start {JSON} call_end`, then `section_end`.
    `counted`: a number follows the name (Kimi's `functions.NAME:0`)."""

    section_start: str
    call_start: str
    name_end: str
    arguments_start: str
    call_end: str
    section_end: str
    counted: bool = False

    def grammar(self, tools: ToolUse, tokens: Mapping[str, int]) -> str:
        """The grammar of the calls `tools.choice` allows, written in this frame."""
        rules: list[str] = []
        for i, function in enumerate(tools.allowed()):
            schema = {**(function.parameters or {"type": "object"}), "x-guidance": _JSON}
            head = lark_text(self.call_start + function.name + self.name_end, tokens)
            counter = " /[0-9]+/" if self.counted else ""
            tail = f" {lark_text(self.arguments_start, tokens)}" if self.arguments_start else ""
            end = f" {lark_text(self.call_end, tokens)}" if self.call_end else ""
            rules += [
                f"call_{i}: {head}{counter}{tail} args_{i}{end}",
                f"args_{i}: %json {json.dumps(schema)}",
            ]
        alternatives = " | ".join(f"call_{i}" for i in range(len(tools.allowed())))
        section = [lark_text(t, tokens) for t in (self.section_start,) if t]
        closing = [lark_text(t, tokens) for t in (self.section_end,) if t]
        repeat = "call+" if tools.several() else "call"
        start = " ".join(["start:", *section, repeat, *closing])
        lark = "\n".join([start, f"call: {alternatives}", *rules]) + "\n"
        return str(LLMatcher.grammar_from_lark(lark))


@dataclass(frozen=True)
class _Written:
    """A frame and the vocabulary's marker tokens: how its fixed text is written in Lark."""

    frame: XmlFrame
    tokens: Mapping[str, int]

    def text(self, text: str) -> str:
        return lark_text(text, self.tokens)


def _call(written: _Written, function: FunctionDefinition, index: int, rules: list[str]) -> str:
    """One function's call as a rule's body; its parameters' rules are added to `rules`."""
    schema = function.parameters or {}
    properties: dict[str, Any] = schema.get("properties") or {}
    required = set(schema.get("required") or ())
    frame = written.frame
    parts = [written.text(frame.call_start + function.name + frame.name_end)]
    for number, (key, prop) in enumerate(properties.items()):
        name = f"f{index}_p{number}"
        rules += _parameter(written, name, key, prop)
        parts.append(name if key in required else f"{name}?")
    parts.append(written.text(frame.call_end))
    return " ".join(parts)


def _parameter(written: _Written, name: str, key: str, schema: Any) -> list[str]:
    frame = written.frame
    opening = written.text(frame.key_start + key + frame.key_end)
    closing = written.text(frame.value_end)
    schema = schema if isinstance(schema, dict) else {}
    choices = schema.get("enum")
    if isinstance(choices, list) and choices and all(isinstance(c, str) for c in choices):
        return [f"{name}: {opening} ({' | '.join(json.dumps(c) for c in choices)}) {closing}"]
    if _is_text(schema):
        return [f"{name}: {opening} {name}_v", f"{name}_v[lazy]: /(?s:.*)/ {closing}"]
    constrained = {**schema, "x-guidance": _JSON}
    return [f"{name}: {opening} {name}_v {closing}", f"{name}_v: %json {json.dumps(constrained)}"]


def _is_text(schema: dict[str, Any]) -> bool:
    """Whether a property's value is free text: a string, or a schema that says no type (the
    families' parsers keep such a value as the string written)."""
    kind = schema.get("type")
    if kind is None:
        return not any(k in schema for k in ("enum", "anyOf", "oneOf", "const"))
    return kind == "string" or (isinstance(kind, list) and "string" in kind)
