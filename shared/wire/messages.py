"""Anthropic's Messages API requests (/v1/messages, /v1/messages/count_tokens), and their
translation onto the one request model inside: a chat completion request.

The Messages API is an edge: a request is validated here in Anthropic's terms (a 400 names the
field as Anthropic's API calls it), then `chat_request()` turns it into the
`ChatCompletionRequest` that becomes a job like any other (same lanes, fairness, metrics, logs).
Everything that could fail is checked on this side, so the translation itself cannot.

How Anthropic's shapes map:
- `system` (text or text blocks) -> a system message; `tool_result` blocks -> tool messages;
  an assistant's `tool_use` blocks -> its tool_calls (arguments as JSON text).
- `tool_choice` auto/any/tool/none -> auto/required/named/none, each `any` and `tool`
  constrained by grammar; `disable_parallel_tool_use` -> parallel_tool_calls false.
- `output_config.format` json_schema -> response_format json_schema (constrained by grammar).
- `metadata.user_id` -> `user`, the caller whose turn it is in fair sharing.
Accepted and changing nothing here, as docs/api.md says: `cache_control` (the worker's
prefix cache reuses any repeated prompt opening without being asked), `thinking` and
`output_config.effort` (the models served have no separate reasoning: no thinking blocks come
back), `service_tier` (one tier serves all). Unknown fields are refused (400 naming them).
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from shared.wire.completions import (
    MAX_CONTENT_CHARS,
    MAX_CONTENT_PARTS,
    MAX_MESSAGES,
    MAX_STOP,
    MAX_STOP_CHARS,
    MAX_TOKENS,
    ChatCompletionRequest,
    ChatMessage,
)
from shared.wire.errors import InvalidRequestError
from shared.wire.grammar import JsonSchemaFormat, JsonSchemaSpec, grammar_for_schema
from shared.wire.ids import MODEL_NAME_PATTERN
from shared.wire.tools import (
    MAX_TOOLS,
    ChatTool,
    FunctionCall,
    FunctionChoice,
    FunctionDefinition,
    FunctionName,
    NamedToolChoice,
    ToolCall,
    ToolChoice,
    check_tools,
)

# The routes that speak Anthropic's API (and answer errors in its shape, api/http/errors.py).
MESSAGES_PATH = "/v1/messages"
# The `anthropic-version` header: a version date (the SDK sends its own, newer with each
# release). Every version gets the same answers, whose shape has not changed since 2023-06-01;
# a value that is not a date is refused.
ANTHROPIC_VERSION_PATTERN = r"^\d{4}-\d{2}-\d{2}$"

Text = Annotated[str, Field(max_length=MAX_CONTENT_CHARS)]
ToolUseId = Annotated[str, Field(pattern=r"^[a-zA-Z0-9_-]{1,128}$")]


class CacheControl(BaseModel):
    """A prompt-caching breakpoint: accepted; the worker's prefix cache needs none."""

    model_config = ConfigDict(extra="forbid")
    type: Literal["ephemeral"]
    ttl: Literal["5m", "1h"] | None = None


class TextBlock(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["text"]
    text: Text
    cache_control: CacheControl | None = None


class ToolUseBlock(BaseModel):
    """A call the assistant made earlier in the conversation."""

    model_config = ConfigDict(extra="forbid")
    type: Literal["tool_use"]
    id: ToolUseId
    name: FunctionName
    input: dict[str, Any]
    cache_control: CacheControl | None = None


class ToolResultBlock(BaseModel):
    """What a call returned, sent back in a user message."""

    model_config = ConfigDict(extra="forbid")
    type: Literal["tool_result"]
    tool_use_id: ToolUseId
    content: Text | Annotated[list[TextBlock], Field(max_length=MAX_CONTENT_PARTS)] = ""
    is_error: bool = False
    cache_control: CacheControl | None = None

    def text(self) -> str:
        text = self.content if isinstance(self.content, str) else _joined(self.content)
        # The model is told that the call failed, in words, as no chat template has a flag.
        return f"Error: {text}" if self.is_error else text


ContentBlock = Annotated[TextBlock | ToolUseBlock | ToolResultBlock, Field(discriminator="type")]


class InputMessage(BaseModel):
    model_config = ConfigDict(extra="forbid")
    role: Literal["user", "assistant"]
    content: Text | Annotated[list[ContentBlock], Field(max_length=MAX_CONTENT_PARTS)]

    @model_validator(mode="after")
    def _blocks_of_the_role(self) -> InputMessage:
        wrong = ToolResultBlock if self.role == "assistant" else ToolUseBlock
        if isinstance(self.content, list) and any(isinstance(b, wrong) for b in self.content):
            kind = "tool_result" if self.role == "assistant" else "tool_use"
            raise ValueError(f"a {self.role} message cannot carry {kind} blocks")
        return self

    def blocks(self) -> list[TextBlock | ToolUseBlock | ToolResultBlock]:
        if isinstance(self.content, str):
            return [TextBlock(type="text", text=self.content)]
        return list(self.content)

    def chat_messages(self) -> list[ChatMessage]:
        """This message as chat messages: one per tool result, then the rest of its text."""
        blocks = self.blocks()
        results = [b for b in blocks if isinstance(b, ToolResultBlock)]
        texts = [b for b in blocks if isinstance(b, TextBlock)]
        calls = [_tool_call(b) for b in blocks if isinstance(b, ToolUseBlock)]
        chat = [
            ChatMessage(role="tool", content=r.text(), tool_call_id=r.tool_use_id) for r in results
        ]
        if texts or calls or not results:
            text = _joined(texts)
            content = None if calls and not text else text
            chat.append(ChatMessage(role=self.role, content=content, tool_calls=calls or None))
        return chat


def _joined(blocks: list[TextBlock]) -> str:
    return "".join(block.text for block in blocks)


def _tool_call(block: ToolUseBlock) -> ToolCall:
    return ToolCall(
        id=block.id, function=FunctionCall(name=block.name, arguments=json.dumps(block.input))
    )


class Tool(BaseModel):
    """A client tool (Anthropic's server tools, with other `type`s, are refused)."""

    model_config = ConfigDict(extra="forbid")
    name: FunctionName
    description: Annotated[str, Field(max_length=8192)] | None = None
    input_schema: dict[str, Any]
    type: Literal["custom"] | None = None
    cache_control: CacheControl | None = None
    # Output always follows the schema where a call is forced; accepted either way, as for chat.
    strict: bool | None = None

    def chat_tool(self) -> ChatTool:
        function = FunctionDefinition(
            name=self.name, description=self.description, parameters=self.input_schema
        )
        return ChatTool(type="function", function=function)


class ToolChoiceAuto(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["auto"]
    disable_parallel_tool_use: bool = False


class ToolChoiceAny(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["any"]
    disable_parallel_tool_use: bool = False


class ToolChoiceTool(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["tool"]
    name: FunctionName
    disable_parallel_tool_use: bool = False


class ToolChoiceNone(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["none"]


AnthropicToolChoice = Annotated[
    ToolChoiceAuto | ToolChoiceAny | ToolChoiceTool | ToolChoiceNone, Field(discriminator="type")
]


def _chat_choice(choice: AnthropicToolChoice) -> ToolChoice:
    if isinstance(choice, ToolChoiceTool):
        return NamedToolChoice(type="function", function=FunctionChoice(name=choice.name))
    if isinstance(choice, ToolChoiceAny):
        return "required"
    return "none" if isinstance(choice, ToolChoiceNone) else "auto"


class ThinkingEnabled(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["enabled"]
    budget_tokens: Annotated[int, Field(ge=1, le=MAX_TOKENS)]
    display: Literal["summarized", "omitted"] | None = None


class ThinkingAdaptive(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["adaptive"]
    display: Literal["summarized", "omitted"] | None = None


class ThinkingDisabled(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["disabled"]


Thinking = Annotated[
    ThinkingEnabled | ThinkingAdaptive | ThinkingDisabled, Field(discriminator="type")
]


class OutputFormat(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["json_schema"]
    schema_: Annotated[dict[str, Any], Field(alias="schema")]


class OutputConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    # Accepted: the models served have no reasoning effort to set.
    effort: Literal["low", "medium", "high", "xhigh", "max"] | None = None
    format: OutputFormat | None = None


class Metadata(BaseModel):
    model_config = ConfigDict(extra="forbid")
    user_id: Annotated[str, Field(max_length=256)] | None = None


class MessagesInput(BaseModel):
    """What a count_tokens request carries: the prompt of a message, without its sampling."""

    model_config = ConfigDict(extra="forbid")

    model: Annotated[str, Field(pattern=MODEL_NAME_PATTERN)]
    messages: Annotated[list[InputMessage], Field(min_length=1, max_length=MAX_MESSAGES)]
    system: Text | Annotated[list[TextBlock], Field(max_length=MAX_CONTENT_PARTS)] | None = None
    tools: Annotated[list[Tool], Field(max_length=MAX_TOOLS)] | None = None
    tool_choice: AnthropicToolChoice | None = None
    thinking: Thinking | None = None
    output_config: OutputConfig | None = None
    cache_control: CacheControl | None = None

    @model_validator(mode="after")
    def _check_prompt(self) -> MessagesInput:
        if self.messages[-1].role == "assistant":
            raise InvalidRequestError(
                "A last assistant message (prefill) is not supported: end with a user message.",
                param="messages",
            )
        self._check_tools()
        form = self.output_config.format if self.output_config else None
        if form is not None:
            grammar_for_schema(form.schema_, "output_config.format.schema")
            if isinstance(self.tool_choice, ToolChoiceAny | ToolChoiceTool):
                raise InvalidRequestError(
                    "A forced tool call cannot also follow output_config.format.",
                    param="tool_choice",
                )
        return self

    def _check_tools(self) -> None:
        names = {t.name for t in self.tools or []}
        if self.tools:
            check_tools([t.chat_tool() for t in self.tools])
        elif isinstance(self.tool_choice, ToolChoiceAny | ToolChoiceTool):
            raise InvalidRequestError("tool_choice requires tools", param="tool_choice")
        if isinstance(self.tool_choice, ToolChoiceTool) and self.tool_choice.name not in names:
            raise InvalidRequestError(
                f"tool_choice names '{self.tool_choice.name}', which is not in tools",
                param="tool_choice.name",
            )

    def chat_messages(self) -> list[ChatMessage]:
        chat = [m for message in self.messages for m in message.chat_messages()]
        if self.system is not None:
            text = self.system if isinstance(self.system, str) else _joined(self.system)
            chat.insert(0, ChatMessage(role="system", content=text))
        return chat

    def chat_fields(self) -> dict[str, Any]:
        """The chat request's fields that carry this prompt (messages, tools, output format)."""
        fields: dict[str, Any] = {"model": self.model, "messages": self.chat_messages()}
        if self.tools:
            fields["tools"] = [t.chat_tool() for t in self.tools]
            choice = self.tool_choice
            if choice is not None:
                fields["tool_choice"] = _chat_choice(choice)
                if not isinstance(choice, ToolChoiceNone) and choice.disable_parallel_tool_use:
                    fields["parallel_tool_calls"] = False
        form = self.output_config.format if self.output_config else None
        if form is not None:
            spec = JsonSchemaSpec(name="output", schema_=form.schema_)
            fields["response_format"] = JsonSchemaFormat(type="json_schema", json_schema=spec)
        return fields

    def chat_request(self) -> ChatCompletionRequest:
        """The prompt as a chat request, for counting its tokens as a job would."""
        return ChatCompletionRequest(**self.chat_fields())


StopSequence = Annotated[str, Field(min_length=1, max_length=MAX_STOP_CHARS)]


class MessagesRequest(MessagesInput):
    """POST /v1/messages."""

    max_tokens: Annotated[int, Field(ge=1, le=MAX_TOKENS)]
    stop_sequences: Annotated[list[StopSequence], Field(max_length=MAX_STOP)] | None = None
    stream: bool = False
    temperature: Annotated[float, Field(ge=0, le=1, allow_inf_nan=False)] = 1.0
    top_p: Annotated[float, Field(gt=0, le=1, allow_inf_nan=False)] = 1.0
    top_k: Annotated[int, Field(ge=0, le=MAX_TOKENS)] = 0
    metadata: Metadata | None = None
    service_tier: Literal["auto", "standard_only"] | None = None

    def chat_request(self) -> ChatCompletionRequest:
        return ChatCompletionRequest(
            **self.chat_fields(),
            max_tokens=self.max_tokens,
            stop=self.stop_sequences or None,
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            user=self.metadata.user_id if self.metadata else None,
            stream=self.stream,
        )


class TokenCount(BaseModel):
    """The answer of /v1/messages/count_tokens."""

    input_tokens: int
