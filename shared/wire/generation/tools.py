"""Tool (function) calling: the wire models, and the text format used where a model's chat
template knows no tools.

Two ways a model sees tools, decided per model by the worker and published in its
`TokenizerSpec` (`tools_in_template`), so that the API counts prompts the way the worker renders
them (shared/queue/prompt/prompt_tokens.py):
- The chat template knows tools and mlx-lm has a parser for the model family (Qwen, Mistral,
  Gemma, GLM, Kimi, ...): tools go to the template and calls are parsed with the family's mlx-lm
  parser. Llama 3.x, whose calls are its whole answer in bare JSON and which mlx-lm cannot read,
  gets its template too and mlxq's own reader (worker/engine/sequence/calls/answer_calls.py).
- Otherwise (the default SmolLM2 and every ChatML model without a tool template): the fallback
  below. The tools are described in a system message, and the model calls one by writing
  `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, the JSON-tools format of Hermes and
  Qwen 2.5 (mlx-lm's `json_tools` parser reads it back).
`tool_choice` "required" or a named function constrains decoding to that call format with a
grammar whose arguments follow each function's `parameters` schema (the JSON formats here; a
family's own syntax, where one can be written, by worker/engine/sequence/calls/families/).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from llguidance import LLMatcher
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    model_serializer,
)

from shared.wire.generation.grammar import grammar_for_schema

FUNCTION_NAME_PATTERN = r"^[a-zA-Z0-9_-]{1,64}$"
MAX_TOOLS = 128  # OpenAI's limit
CALL_START = "<tool_call>"
CALL_END = "</tool_call>"
FunctionName = Annotated[str, Field(pattern=FUNCTION_NAME_PATTERN)]
_CALL_JSON = {"whitespace_flexible": False, "key_separator": ": ", "item_separator": ", "}


@dataclass(frozen=True)
class CallFrame:
    """How a format writes a call's JSON: the markers around it (none: the call is the whole
    answer), the key of its arguments, and what stands between two calls."""

    start: str
    end: str
    arguments: str
    between: str = ""


JSON_TOOLS_FRAME = CallFrame(CALL_START, CALL_END, "arguments")
# Llama 3.x: `{"name": ..., "parameters": {...}}` as the whole answer, calls joined by "; ".
ANSWER_FRAME = CallFrame("", "", "parameters", between="; ")


class FunctionDefinition(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: FunctionName
    description: Annotated[str, Field(max_length=8192)] | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ChatTool(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["function"]
    function: FunctionDefinition


class FunctionChoice(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: FunctionName


class NamedToolChoice(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["function"]
    function: FunctionChoice


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice


class FunctionCall(BaseModel):
    name: str
    arguments: str  # JSON text, as OpenAI sends it


class ToolCall(BaseModel):
    """A call the model made (in an answer) or made earlier (in an assistant message)."""

    model_config = ConfigDict(extra="forbid")
    id: Annotated[str, Field(max_length=128)]
    type: Literal["function"] = "function"
    function: FunctionCall


class FunctionCallDelta(BaseModel):
    name: str | None = None  # only in a call's first piece
    arguments: str = ""


class ToolCallDelta(BaseModel):
    """A piece of a call as it streams (chat's `delta.tool_calls`): the first piece of a call
    carries its id, type and name, the next ones more of its arguments text; `index` numbers
    the calls of one choice. Fields left None are omitted, as OpenAI does."""

    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: FunctionCallDelta

    @model_serializer(mode="wrap")
    def _omit_none(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        data["function"] = {k: v for k, v in data["function"].items() if v is not None}
        return {k: v for k, v in data.items() if v is not None}


class ToolUse(BaseModel):
    """What a chat job carries about tools."""

    tools: list[ChatTool]
    choice: ToolChoice = "auto"
    parallel: bool = True

    def constrained(self) -> bool:
        return self.choice == "required" or isinstance(self.choice, NamedToolChoice)

    def parses_calls(self) -> bool:
        return self.choice != "none"

    def allowed(self) -> list[FunctionDefinition]:
        """The functions `choice` lets a forced call name."""
        return [
            t.function
            for t in self.tools
            if not isinstance(self.choice, NamedToolChoice)
            or t.function.name == self.choice.function.name
        ]

    def several(self) -> bool:
        """Whether a forced answer may hold several calls."""
        return self.parallel and not isinstance(self.choice, NamedToolChoice)

    def call_grammar(
        self, frame: CallFrame = JSON_TOOLS_FRAME, tokens: Mapping[str, int] | None = None
    ) -> str:
        """The Lark grammar (llguidance) of the calls `choice` allows, written in `frame`;
        `tokens`: the markers the vocabulary holds as one added token (`lark_text`)."""
        # Whitespace is fixed to json.dumps' separators: a sampled model left free to write
        # whitespace between tokens can spend its whole max_tokens on it, mid-call.
        calls = [_call_schema(f, frame.arguments) for f in self.allowed()]
        schema = {"anyOf": calls, "x-guidance": _CALL_JSON}
        several = self.several()
        between = f"{json.dumps(frame.between)} " if frame.between else ""
        framed = " ".join(
            [*([lark_text(frame.start, tokens)] if frame.start else []), "body"]
            + ([lark_text(frame.end, tokens)] if frame.end else [])
        )
        lark = (
            f"start: call{f' ({between}call)*' if several else ''}\n"
            f"call: {framed}\n"
            f"body: %json {json.dumps(schema)}\n"
        )
        return str(LLMatcher.grammar_from_lark(lark))


def lark_text(text: str, tokens: Mapping[str, int] | None = None) -> str:
    """Fixed text as a Lark grammar's items, each marker the vocabulary holds as one added
    token (`tokens`, text to id) written as that token (`<[id]>`): llguidance takes an added
    token only where the grammar names it, never for the text it spells."""
    # The first marker in the text, the longest where several begin there; white space is
    # left to the tokenizer, in whichever tokens it likes.
    found = sorted(
        ((text.find(m), m) for m in tokens or () if m.strip() and m in text),
        key=lambda f: (f[0], -len(f[1])),
    )
    if not found:
        return json.dumps(text)
    at, marker = found[0]
    items = [json.dumps(text[:at])] if at else []
    items.append(f"<[{(tokens or {})[marker]}]>")
    rest = text[at + len(marker) :]
    return " ".join([*items, lark_text(rest, tokens)] if rest else items)


def _call_schema(function: FunctionDefinition, arguments: str) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {
            "name": {"const": function.name},
            arguments: function.parameters or {"type": "object"},
        },
        "required": ["name", arguments],
        "additionalProperties": False,
    }


def check_tools(tools: list[ChatTool]) -> None:
    """Refuse (400 naming `tools`) a function whose parameters schema cannot be compiled."""
    for tool in tools:
        if tool.function.parameters is not None:
            grammar_for_schema(tool.function.parameters, "tools")


def fallback_system_prompt(tools: list[ChatTool]) -> str:
    described = "\n".join(json.dumps(t.function.model_dump(exclude_none=True)) for t in tools)
    return (
        "You can call these functions:\n<tools>\n"
        f"{described}\n</tools>\n"
        "To call a function, reply with a JSON object naming it and giving its arguments, "
        f'between {CALL_START} and {CALL_END}:\n{CALL_START}{{"name": "<function name>", '
        f'"arguments": {{"<parameter>": <value>}}}}{CALL_END}'
    )


def fallback_call_text(call: ToolCall) -> str:
    """An earlier call, as the model wrote it in the fallback format."""
    arguments = _json_or_text(call.function.arguments)
    body = json.dumps({"name": call.function.name, "arguments": arguments})
    return f"{CALL_START}{body}{CALL_END}"


def template_call(call: ToolCall) -> dict[str, Any]:
    """An earlier call as Hugging Face chat templates take it (arguments as an object)."""
    return {
        "id": call.id,
        "type": "function",
        "function": {
            "name": call.function.name,
            "arguments": _json_or_text(call.function.arguments),
        },
    }


def _json_or_text(arguments: str) -> Any:
    try:
        return json.loads(arguments)
    except ValueError:
        return arguments
