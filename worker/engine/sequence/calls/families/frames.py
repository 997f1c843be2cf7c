"""Forced calls written in a family's own syntax: the Lark grammar (llguidance) of the calls a
`ToolUse` allows, each call a frame of fixed text around its name and arguments. Two kinds:
XML-like frames, whose arguments are key/value elements (`XmlFrame`: Qwen3-Coder, GLM, and the
invoke elements of MiniMax M2 and DeepSeek DSML), and frames whose arguments are one JSON
object (`JsonFrame`: Kimi K2, DeepSeek V3.1, Mistral v11), written with json.dumps' separators
as the JSON-tools grammar fixes them.

A family gives the frame's pieces (`XmlFrame`): the text before a call's name, after it, around
each parameter's key and after its value, the call's end, what stands between two calls, and
the section's markers where all calls share one wrapper (MiniMax's, DSML's). A string value is
free text up to the parameter's closer (a lazy lexeme: it ends at the first closer, which the
family's parser reads the same way); any other value is JSON following its schema (`%json`,
with json.dumps' separators, as the JSON-tools grammar fixes them), after its own key end where
the family marks how a value is written (DSML's `string="false"`). Required parameters are
written in the schema's order, each optional one may be left out.
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
    `key_start KEY key_end VALUE value_end` (`json_key_end` in place of `key_end` before a JSON
    value, where the family writes one), then `call_end`; `between` joins two calls, and
    `section_start` and `section_end` stand around all of them."""

    call_start: str
    name_end: str
    key_start: str
    key_end: str
    value_end: str
    call_end: str
    between: str = ""
    section_start: str = ""
    section_end: str = ""
    json_key_end: str | None = None

    def grammar(self, tools: ToolUse, tokens: Mapping[str, int]) -> str:
        """The grammar of the calls `tools.choice` allows, written in this frame; `tokens`: the
        markers the vocabulary holds as one added token (shared's `lark_text`)."""
        rules: list[str] = []
        written = _Written(self, tokens)
        calls = [_call(written, f, i, rules) for i, f in enumerate(tools.allowed())]
        rules.insert(0, f"call: {' | '.join(calls)}")
        start = _start(self.section_start, self.between, self.section_end, tools, tokens)
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
        start = _start(self.section_start, "", self.section_end, tools, tokens)
        lark = "\n".join([start, f"call: {alternatives}", *rules]) + "\n"
        return str(LLMatcher.grammar_from_lark(lark))


def _start(
    section_start: str, between: str, section_end: str, tools: ToolUse, tokens: Mapping[str, int]
) -> str:
    """The start rule: one call, or (parallel calls allowed) several joined by `between`,
    inside the section's markers where the family writes any."""
    joined = f"{lark_text(between, tokens)} call" if between else "call"
    calls = f"call ({joined})*" if tools.several() else "call"
    opening = [lark_text(section_start, tokens)] if section_start else []
    closing = [lark_text(section_end, tokens)] if section_end else []
    return " ".join(["start:", *opening, calls, *closing])


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
    schema = schema if isinstance(schema, dict) else {}
    choices = schema.get("enum")
    named = isinstance(choices, list) and bool(choices) and all(isinstance(c, str) for c in choices)
    # A string enum's value is text too (DSML's `string="true"`).
    text = named or _is_text(schema)
    key_end = frame.key_end if text or frame.json_key_end is None else frame.json_key_end
    opening = written.text(frame.key_start + key + key_end)
    closing = written.text(frame.value_end)
    if named:
        return [f"{name}: {opening} ({' | '.join(json.dumps(c) for c in choices)}) {closing}"]
    if text:
        # A lexeme cannot name an added token (llguidance), so the closer that ends a lazy value
        # is written as text; a marker llguidance reads as text (DSML's `|DSML|` on DeepSeek's
        # vocabulary) is still the model's own token there.
        closer = json.dumps(frame.value_end)
        return [f"{name}: {opening} {name}_v", f"{name}_v[lazy]: /(?s:.*)/ {closer}"]
    constrained = {**schema, "x-guidance": _JSON}
    return [f"{name}: {opening} {name}_v {closing}", f"{name}_v: %json {json.dumps(constrained)}"]


def _is_text(schema: dict[str, Any]) -> bool:
    """Whether a property's value is free text: a string, or a schema that says no type (the
    families' parsers keep such a value as the string written)."""
    kind = schema.get("type")
    if kind is None:
        return not any(k in schema for k in ("enum", "anyOf", "oneOf", "const"))
    return kind == "string" or (isinstance(kind, list) and "string" in kind)
