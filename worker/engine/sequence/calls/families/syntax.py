"""What a family's tool-call syntax is made of, for the scanner and the table
(worker/engine/sequence/calls/families/table.py): where its calls open and close (`Opening`),
how the text between is read into calls (`ParseCalls`), and how a forced call's grammar is
written in it, where it can be.

A family's parser reads one region (the text from an opening to its end) whole and gives every
call in it, or raises `CallSyntaxError`: then the region is no call and the scanner shows it as
written, so a call whose arguments do not parse reaches the client as text (with
finish_reason "stop"), never silently dropped.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from shared.wire.generation.tools import ToolUse
from worker.engine.sequence.calls.call_readers import ReadCall

# The request's tools as mlx-lm's parsers take them: [{"type": "function", "function": {...}}].
Tools = list[dict[str, Any]]
ParseCalls = Callable[[str, Tools], list[ReadCall]]


class CallSyntaxError(ValueError):
    """A region's text is not calls of this syntax (the scanner shows it as written)."""


@dataclass(frozen=True)
class Opening:
    """Where a call region begins and ends. `end` None: the region runs to the end of the
    sequence (Mistral has no end marker). `kept`: the markers are part of the call's text, and
    the parser is given them (a Qwen3-Coder `<function=...>` written without its wrapper)."""

    start: str
    end: str | None
    kept: bool = False


@dataclass(frozen=True)
class CallSyntax:
    """One family's tool-call syntax: its name (the module's), its openings (the first is its
    own, the others what its models write instead), its parser, and its forced-call grammar
    (None: a forced call cannot be written in this syntax yet)."""

    name: str
    openings: tuple[Opening, ...]
    parse: ParseCalls
    # The forced calls' grammar: the request's tools, the markers the vocabulary holds as one
    # added token (text to id), to Lark.
    grammar: Callable[[ToolUse, Mapping[str, int]], str] | None = None


def schema_of(tools: Tools, name: str) -> dict[str, Any]:
    """The parameters schema of the tool called `name` (empty where it declares none)."""
    for tool in tools:
        function = tool.get("function") or {}
        if function.get("name") == name:
            schema = function.get("parameters")
            return schema if isinstance(schema, dict) else {}
    return {}


def declared(tools: Tools, name: str) -> str:
    """`name` if the request declared a tool of that name; else the region is no call."""
    name = name.strip()
    if not any((t.get("function") or {}).get("name") == name for t in tools):
        raise CallSyntaxError(f"no tool named {name!r}")
    return name


def json_arguments(text: str) -> str:
    """Arguments written as one JSON object (white space alone: none), as JSON text; a region
    whose arguments are not an object is no call."""
    if not text.strip():
        return "{}"
    try:
        arguments = json.loads(text)
    except ValueError as err:
        raise CallSyntaxError("the arguments are not JSON") from err
    if not isinstance(arguments, dict):
        raise CallSyntaxError("the arguments are not a JSON object")
    return json.dumps(arguments)


def headed_calls(text: str, opener: str, separator: str, closer: str) -> list[tuple[str, str]]:
    """A section's calls, each written `opener HEADER separator BODY closer` (a last closer
    may be missing: cut short), as (header, body); a section holds nothing else."""
    before, *calls = text.split(opener)
    if before.strip() or not calls:
        raise CallSyntaxError(f"no {opener} in the section")
    found = []
    for call in calls:
        header, separated, body = call.partition(separator)
        body, _, after = body.partition(closer)
        if not separated or after.strip():
            raise CallSyntaxError(f"a call without its {separator}, or text after it")
        found.append((header, body))
    return found
