"""Anthropic's Messages API requests (/v1/messages, /v1/messages/count_tokens), and their
translation onto the one request model inside: a chat completion request.

The Messages API is an edge: a request is validated here in Anthropic's terms (a 400 names the
field as Anthropic's API calls it), then `chat_request()` turns it into the
`ChatCompletionRequest` that becomes a job like any other (same lanes, fairness, metrics, logs).
Everything that could fail is checked on this side, so the translation itself cannot.

How Anthropic's shapes map:
- `system` (text or text blocks) -> a system message, less Claude Code's billing line
  (shared/wire/anthropic/billing_line.py); the messages' blocks as
  shared/wire/anthropic/message_blocks.py says (thinking blocks -> the turn's reasoning).
- `tool_choice` auto/any/tool/none -> auto/required/named/none, each `any` and `tool`
  constrained by grammar; `disable_parallel_tool_use` -> parallel_tool_calls false.
- `output_config.format` json_schema -> response_format json_schema (constrained by grammar).
- `metadata.user_id` -> `user`, the caller whose turn it is in fair sharing.
- `thinking` and `output_config.effort` -> the job's `ReasoningControl` (shared/queue/jobs.py
  sets it, with `max_tokens` as the ceiling Anthropic makes it): disabled -> no thinking;
  enabled -> thinking within `budget_tokens`; adaptive or between_tools -> thinking, unbounded.
Accepted and changing nothing here, as docs/api.md says: `cache_control` (the worker's
prefix cache reuses any repeated prompt opening without being asked), thinking's `display`,
`service_tier` (one tier serves all). Unknown fields are refused (400 naming them).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from shared.wire.anthropic.billing_line import system_text
from shared.wire.anthropic.message_blocks import CacheControl, InputMessage, Text, TextBlock
from shared.wire.chat.completions import (
    MAX_CONTENT_PARTS,
    MAX_MESSAGES,
    MAX_STOP,
    MAX_STOP_CHARS,
    MAX_TOKENS,
    ChatCompletionRequest,
    ChatMessage,
)
from shared.wire.errors import InvalidRequestError
from shared.wire.generation.grammar import JsonSchemaFormat, JsonSchemaSpec, grammar_for_schema
from shared.wire.generation.reasoning import ReasoningControl
from shared.wire.generation.tools import (
    MAX_TOOLS,
    ChatTool,
    FunctionChoice,
    FunctionDefinition,
    FunctionName,
    NamedToolChoice,
    ToolChoice,
    check_tools,
)
from shared.wire.ids import MODEL_NAME_PATTERN
from shared.wire.images import ImageInput

# The routes that speak Anthropic's API (and answer errors in its shape, api/http/errors.py).
MESSAGES_PATH = "/v1/messages"
# The `anthropic-version` header: a version date (the SDK sends its own, newer with each
# release). Every version gets the same answers, whose shape has not changed since 2023-06-01;
# a value that is not a date is refused.
ANTHROPIC_VERSION_PATTERN = r"^[0-9]{4}-[0-9]{2}-[0-9]{2}$"  # not \d: ASCII digits only


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


class ThinkingBetweenTools(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["between_tools"]


class ThinkingDisabled(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["disabled"]


Thinking = Annotated[
    ThinkingEnabled | ThinkingAdaptive | ThinkingBetweenTools | ThinkingDisabled,
    Field(discriminator="type"),
]


class OutputFormat(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["json_schema"]
    schema_: Annotated[dict[str, Any], Field(alias="schema")]


class OutputConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
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

    def reasoning_control(self) -> ReasoningControl | None:
        """Anthropic's thinking and effort as the job's control; None: neither was given."""
        effort = self.output_config.effort if self.output_config else None
        thinking = self.thinking
        if thinking is None:
            return None if effort is None else ReasoningControl(effort=effort)
        if isinstance(thinking, ThinkingDisabled):
            return ReasoningControl(enabled=False, effort=effort)
        budget = thinking.budget_tokens if isinstance(thinking, ThinkingEnabled) else None
        return ReasoningControl(enabled=True, effort=effort, budget_tokens=budget)

    def images(self) -> list[ImageInput]:
        """The images the messages carry, in order, each named by its parameter."""
        return [image for i, m in enumerate(self.messages) for image in m.images(f"messages.{i}")]

    def chat_messages(self) -> list[ChatMessage]:
        chat = [m for message in self.messages for m in message.chat_messages()]
        if self.system is not None:
            chat.insert(0, ChatMessage(role="system", content=system_text(self.system)))
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
