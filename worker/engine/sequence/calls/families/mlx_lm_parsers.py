"""mlx-lm's tool parsers, where mlxq keeps them (the families no module of this package
replaces: Gemma 4, FunctionGemma, pythonic, LongCat, MiniCPM, Muse Spark, Kimi K3, ...), as a
`CallSyntax`: the parser's own start and end markers, and its reading of a region turned into
calls. mlx-lm's parsers give one call as a dict and several as a list; either is read, and a
region whose parser raises or gives something else is no call.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable
from typing import Any

from worker.engine.sequence.calls.call_readers import ReadCall
from worker.engine.sequence.calls.families.syntax import (
    CallSyntax,
    CallSyntaxError,
    Opening,
    Tools,
)


def parser_name(tokenizer: Any) -> str | None:
    """The mlx-lm parser module a TokenizerWrapper uses (`qwen3_coder`, ...); None: none."""
    parse = getattr(tokenizer, "tool_parser", None)
    module = getattr(parse, "__module__", "") or ""
    prefix = "mlx_lm.tool_parsers."
    return module[len(prefix) :] if module.startswith(prefix) else None


def mlx_lm_syntax(tokenizer: Any) -> CallSyntax:
    """The tokenizer's own mlx-lm parser, as a syntax."""
    name = f"mlx-lm:{parser_name(tokenizer)}"
    return parser_syntax(
        name, tokenizer.tool_parser, tokenizer.tool_call_start, tokenizer.tool_call_end
    )


def module_syntax(module: str) -> CallSyntax:
    """The syntax of mlx-lm's parser module `module` (`mlx_lm.tool_parsers.<module>`)."""
    found = importlib.import_module(f"mlx_lm.tool_parsers.{module}")
    return parser_syntax(
        f"mlx-lm:{module}", found.parse_tool_call, found.tool_call_start, found.tool_call_end
    )


def parser_syntax(name: str, parse: Callable[..., Any], start: str, end: str) -> CallSyntax:
    """An mlx-lm parser and its markers as a syntax; an empty end marker (Mistral's) makes the
    call run to the sequence's end."""

    def read(text: str, tools: Tools) -> list[ReadCall]:
        parsed = parse(text, tools)
        return [_call(p) for p in (parsed if isinstance(parsed, list) else [parsed])]

    return CallSyntax(name=name, openings=(Opening(start, end or None),), parse=read)


def _call(parsed: Any) -> ReadCall:
    if not isinstance(parsed, dict) or not isinstance(parsed.get("name"), str):
        raise CallSyntaxError("the parser gave no call")
    arguments = parsed.get("arguments", {})
    text = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return ReadCall(parsed["name"], text)
