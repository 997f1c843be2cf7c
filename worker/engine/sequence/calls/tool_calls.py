"""Tool calls read back from a sequence's text as it streams, and which way a model writes them
(`ToolFormat`).

A `ToolCallScanner` sits after the stop-string matcher. Most families mark their calls, and a
`MarkedCallScanner` (worker/engine/sequence/calls/marked_calls.py) reads them with a reader for
the model's format (worker/engine/sequence/calls/call_readers.py), which says what may be sent
of a call as it is written. The scanner numbers the calls of its sequence and turns them into
OpenAI's stream pieces (`ToolCallDelta`: the first with the call's id and name, then its
arguments) and, at each end marker, the whole `ToolCall`. Llama 3.x writes a call as its whole
answer, with no markers: an `AnswerCallScanner` reads those
(worker/engine/sequence/calls/answer_calls.py).

`ToolFormat.of` decides, in this order: gpt-oss's harmony (handed on as JSON tools); a family
whose syntax mlxq reads itself (worker/engine/sequence/calls/families/: Qwen3-Coder, GLM, Kimi
K2, MiniMax M2, Mistral, DeepSeek V3/V3.1 and DSML); the model's own mlx-lm parser (JSON tools
streams its arguments as written); Llama 3.x's whole-answer JSON; else mlxq's fallback format
(shared/wire/generation/tools.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from mlx_lm.tool_parsers import json_tools

from shared.wire.generation.tools import (
    ANSWER_FRAME,
    CALL_END,
    CALL_START,
    JSON_TOOLS_FRAME,
    CallFrame,
    ToolUse,
)
from worker.engine.sequence.calls.answer_calls import AnswerCallScanner, writes_answer_calls
from worker.engine.sequence.calls.call_readers import JsonCallReader, ParsedCallReader
from worker.engine.sequence.calls.families import syntax_for
from worker.engine.sequence.calls.families.mlx_lm_parsers import mlx_lm_syntax, parser_name
from worker.engine.sequence.calls.families.syntax import CallSyntax, Opening
from worker.engine.sequence.calls.marked_calls import MarkedCallScanner
from worker.engine.sequence.calls.scanned_calls import Scanned
from worker.engine.sequence.harmony import HarmonyTokens

__all__ = ["MarkedCallScanner", "Scanned", "ToolCallScanner", "ToolFormat"]


class ToolCallScanner(Protocol):
    """A sequence's text read for calls as it streams."""

    @property
    def made(self) -> int:
        """How many calls the sequence has made so far."""
        ...

    def feed(self, text: str) -> Scanned:
        """What `text` gives: the text that may be shown now, call pieces, completed calls."""
        ...

    def finish(self) -> Scanned:
        """At the end of the sequence: what is still held back."""
        ...


# mlxq's fallback format and Hermes/Qwen 2.5's: JSON between <tool_call> markers.
JSON_TOOLS = CallSyntax(
    name="json_tools",
    openings=(Opening(CALL_START, CALL_END),),
    parse=lambda text, tools: [],  # never called: JsonCallReader reads it as it streams
)


@dataclass(frozen=True)
class ToolFormat:
    """How one model writes tool calls (shared/wire/generation/tools.py explains the cases)."""

    in_template: bool
    syntax: CallSyntax
    # The call is the whole answer, with no markers (Llama 3.x: calls/answer_calls.py).
    whole_answer: bool = False
    # The vocabulary's added tokens (text to id): a forced call's markers are written as them.
    tokens: Mapping[str, int] = field(default_factory=dict)

    @classmethod
    def of(cls, tokenizer: Any) -> ToolFormat:
        form = cls._of(tokenizer)
        added = getattr(tokenizer, "get_added_vocab", None)
        return replace(form, tokens=dict(added())) if callable(added) else form

    @classmethod
    def _of(cls, tokenizer: Any) -> ToolFormat:
        if HarmonyTokens.of(tokenizer) is not None:
            # gpt-oss: its template renders the tools; its calls are harmony messages, which
            # the harmony split hands on in the JSON-tools format (sequence/harmony.py).
            return cls(True, JSON_TOOLS)
        template = getattr(tokenizer, "chat_template", None)
        template = template if isinstance(template, str) else None
        parser = parser_name(tokenizer) if tokenizer.has_tool_calling else None
        own = syntax_for(parser, template)
        if own is not None:
            return cls(True, own)
        if tokenizer.has_tool_calling:
            if tokenizer.tool_parser is json_tools.parse_tool_call:
                return cls(True, JSON_TOOLS)
            return cls(True, mlx_lm_syntax(tokenizer))
        if writes_answer_calls(tokenizer, template):
            return cls(True, JSON_TOOLS, whole_answer=True)
        return cls(False, JSON_TOOLS)

    @property
    def family(self) -> str:
        """The name of the syntax calls are read in (a family module's, or `mlx-lm:NAME`)."""
        return "llama3_json" if self.whole_answer else self.syntax.name

    def call_frame(self) -> CallFrame | None:
        """How the grammar writes a forced call in this format's JSON; None: the format is a
        family's own syntax (`call_grammar` says whether it can be forced)."""
        if self.whole_answer:
            return ANSWER_FRAME
        if self.syntax is JSON_TOOLS:
            return JSON_TOOLS_FRAME
        return None

    def call_grammar(self, tools: ToolUse) -> str | None:
        """The grammar of a forced call (tool_choice required or named) in this format; None:
        a forced call cannot be written in it."""
        frame = self.call_frame()
        if frame is not None:
            return tools.call_grammar(frame, self.tokens)
        return None if self.syntax.grammar is None else self.syntax.grammar(tools, self.tokens)

    def scanner(self, tools: ToolUse) -> ToolCallScanner:
        names = frozenset(t.function.name for t in tools.tools)
        if self.whole_answer:
            return AnswerCallScanner(names)
        if self.syntax is JSON_TOOLS:  # arguments stream as written
            return MarkedCallScanner(self.syntax.openings, lambda: JsonCallReader(names))
        described = [t.model_dump(exclude_none=True) for t in tools.tools]
        parse = self.syntax.parse
        return MarkedCallScanner(self.syntax.openings, lambda: ParsedCallReader(parse, described))
