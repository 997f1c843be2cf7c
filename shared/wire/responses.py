"""Wire formats of /v1/responses (text only): the request, the response object, its stored record.

A response is one generation job; its state is derived from the job's events
(shared/wire/response_state.py). Choices where OpenAI's documents leave room: `instructions` become
a system message before the input; `queue_position` (an mlxq extension, present only while queued)
counts the background jobs ahead of this one (0: it is next).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    model_serializer,
    model_validator,
)

from shared.wire.completions import (
    MAX_MESSAGES,
    MAX_METADATA,
    MODEL_NAME_PATTERN,
    ChatMessage,
    TokenCount,
    Usage,
)
from shared.wire.errors import InvalidRequestError, UnsupportedParameterError
from shared.wire.grammar import (
    SCHEMA_NAME_PATTERN,
    JsonObjectFormat,
    TextFormat,
    grammar_for_schema,
)
from shared.wire.response_items import (
    FunctionCallItem,
    FunctionCallOutput,
    FunctionTool,
    InputItem,
    InputMessage,
    NamedFunction,
    Text,
    add_call,
)
from shared.wire.tools import (
    MAX_TOOLS,
    FunctionChoice,
    NamedToolChoice,
    ToolChoice,
    ToolUse,
    check_tools,
)

Metadata = Annotated[
    dict[Annotated[str, Field(max_length=64)], Annotated[str, Field(max_length=512)]],
    Field(max_length=MAX_METADATA),
]
ResponseStatus = Literal["queued", "in_progress", "completed", "failed", "cancelled", "incomplete"]
FINAL_STATUSES = frozenset({"completed", "failed", "cancelled", "incomplete"})

# OpenAI request fields that mlxq does not implement: any value but the default is a 400 naming it.
UNSUPPORTED = (
    "max_tool_calls",
    "previous_response_id",
    "conversation",
    "reasoning",
    "include",
    "prompt",
    "prompt_cache_key",
    "prompt_cache_retention",
    "safety_identifier",
    "service_tier",
    "top_logprobs",
    "stream_options",
    "background_options",
    "context_management",
)


class JsonSchemaTextFormat(BaseModel):
    """The Responses API's `text.format` for a schema: chat's `json_schema` spec, flattened."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True, serialize_by_alias=True)
    type: Literal["json_schema"]
    name: Annotated[str, Field(pattern=SCHEMA_NAME_PATTERN)]
    description: str | None = None
    schema_: Annotated[dict[str, Any], Field(alias="schema")]
    strict: bool | None = None

    def grammar(self, param: str) -> str | None:
        return grammar_for_schema(self.schema_, param)


TextFormatChoice = Annotated[
    TextFormat | JsonObjectFormat | JsonSchemaTextFormat, Field(discriminator="type")
]


class TextConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    format: TextFormatChoice = TextFormat(type="text")


class ResponsesRequest(BaseModel):
    """The body of POST /v1/responses."""

    model_config = ConfigDict(extra="forbid")

    model: Annotated[str, Field(pattern=MODEL_NAME_PATTERN)]
    input: Text | Annotated[list[InputItem], Field(min_length=1, max_length=MAX_MESSAGES)]
    instructions: Text | None = None
    max_output_tokens: TokenCount | None = None
    temperature: Annotated[float, Field(ge=0, le=2, allow_inf_nan=False)] = 1.0
    top_p: Annotated[float, Field(gt=0, le=1, allow_inf_nan=False)] = 1.0
    stream: bool = False
    background: bool = False
    store: bool = True
    metadata: Metadata | None = None
    user: Annotated[str, Field(max_length=256)] | None = None
    text: TextConfig | None = None
    truncation: Literal["disabled"] | None = None
    tools: Annotated[list[FunctionTool], Field(max_length=MAX_TOOLS)] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedFunction | None = None
    parallel_tool_calls: bool | None = None
    max_tool_calls: int | None = None
    previous_response_id: str | None = None
    conversation: Any = None
    reasoning: Any = None
    include: list[str] | None = None
    prompt: Any = None
    prompt_cache_key: str | None = None
    prompt_cache_retention: str | None = None
    safety_identifier: str | None = None
    service_tier: str | None = None
    top_logprobs: int | None = None
    stream_options: Any = None
    background_options: Any = None
    context_management: Any = None

    @model_validator(mode="after")
    def _refuse_unsupported(self) -> ResponsesRequest:
        for name in UNSUPPORTED:
            value = getattr(self, name)
            if value is not None and value != []:
                raise UnsupportedParameterError(
                    f"'{name}' is not supported by this server", param=name
                )
        if self.background and not self.store:
            raise InvalidRequestError("background responses must be stored", param="store")
        self.grammar()  # refuse a schema that cannot be compiled, before anything is queued
        self.tool_use()  # and a tool choice that names no tool, or a tool that cannot compile
        return self

    def tool_use(self) -> ToolUse | None:
        if not self.tools:
            if self.tool_choice not in (None, "none"):
                raise InvalidRequestError("tool_choice requires tools", param="tool_choice")
            return None
        tools = [t.as_chat_tool() for t in self.tools]
        check_tools(tools)
        choice: ToolChoice = "auto"
        if isinstance(self.tool_choice, NamedFunction):
            if self.tool_choice.name not in {t.name for t in self.tools}:
                raise InvalidRequestError(
                    f"tool_choice names '{self.tool_choice.name}', which is not in tools",
                    param="tool_choice",
                )
            choice = NamedToolChoice(
                type="function", function=FunctionChoice(name=self.tool_choice.name)
            )
        elif self.tool_choice is not None:
            choice = self.tool_choice
        parallel = True if self.parallel_tool_calls is None else self.parallel_tool_calls
        return ToolUse(tools=tools, choice=choice, parallel=parallel)

    def grammar(self) -> str | None:
        return self.text.format.grammar("text.format") if self.text is not None else None

    def chat_messages(self) -> list[ChatMessage]:
        messages = []
        if self.instructions:
            messages.append(ChatMessage(role="system", content=self.instructions))
        if isinstance(self.input, str):
            messages.append(ChatMessage(role="user", content=self.input))
            return messages
        for item in self.input:
            if isinstance(item, InputMessage):
                messages.append(ChatMessage(role=item.role, content=item.text()))
            elif isinstance(item, FunctionCallOutput):
                messages.append(
                    ChatMessage(role="tool", tool_call_id=item.call_id, content=item.output)
                )
            else:
                add_call(messages, item)
        return messages


class StoredResponse(BaseModel):
    """What the API stores when it creates a response; everything else is derived."""

    id: str
    created_at: int
    background: bool
    request: ResponsesRequest

    def item_id(self) -> str:
        return "msg_" + self.id.removeprefix("resp_")


class OutputText(BaseModel):
    type: Literal["output_text"] = "output_text"
    text: str
    annotations: list[Any] = []
    logprobs: list[Any] = []


class OutputMessage(BaseModel):
    type: Literal["message"] = "message"
    id: str
    status: Literal["in_progress", "completed", "incomplete"]
    role: Literal["assistant"] = "assistant"
    content: list[OutputText]


class InputTokensDetails(BaseModel):
    cached_tokens: int = 0


class OutputTokensDetails(BaseModel):
    reasoning_tokens: int = 0


class ResponseUsage(BaseModel):
    input_tokens: int
    input_tokens_details: InputTokensDetails = InputTokensDetails()
    output_tokens: int
    output_tokens_details: OutputTokensDetails = OutputTokensDetails()
    total_tokens: int

    @classmethod
    def of(cls, usage: Usage) -> ResponseUsage:
        return cls(
            input_tokens=usage.prompt_tokens,
            input_tokens_details=InputTokensDetails(
                cached_tokens=usage.prompt_tokens_details.cached_tokens
            ),
            output_tokens=usage.completion_tokens,
            output_tokens_details=OutputTokensDetails(
                reasoning_tokens=usage.completion_tokens_details.reasoning_tokens
            ),
            total_tokens=usage.total_tokens,
        )


class ResponseError(BaseModel):
    code: str
    message: str


class IncompleteDetails(BaseModel):
    reason: Literal["max_output_tokens"]


class ResponseObject(BaseModel):
    """OpenAI's response object; `queue_position` (our extension) only while queued."""

    id: str
    object: Literal["response"] = "response"
    created_at: int
    status: ResponseStatus
    background: bool
    error: ResponseError | None = None
    incomplete_details: IncompleteDetails | None = None
    instructions: str | None
    max_output_tokens: int | None
    model: str
    output: list[OutputMessage | FunctionCallItem]
    parallel_tool_calls: bool = False
    previous_response_id: None = None
    reasoning: None = None
    store: bool
    temperature: float
    text: TextConfig = TextConfig()
    tool_choice: Literal["none", "auto", "required"] | NamedFunction = "auto"
    tools: list[FunctionTool] = []
    top_p: float
    truncation: Literal["disabled"] = "disabled"
    usage: ResponseUsage | None = None
    user: str | None = None
    metadata: dict[str, str] = {}
    queue_position: int | None = None  # an mlxq extension

    @model_serializer(mode="wrap")
    def _queue_position_only_when_queued(
        self, handler: SerializerFunctionWrapHandler
    ) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        if data.get("queue_position") is None:
            data.pop("queue_position", None)
        return data

    def output_text(self) -> str:
        messages = [item for item in self.output if isinstance(item, OutputMessage)]
        return "".join(part.text for item in messages for part in item.content)


class ResponseDeleted(BaseModel):
    id: str
    object: Literal["response"] = "response"
    deleted: bool = True


class RetrieveQuery(BaseModel):
    """The query of GET /v1/responses/{id}."""

    model_config = ConfigDict(extra="forbid")

    stream: bool = False
    starting_after: Annotated[int, Field(ge=-1)] | None = None
    include: list[str] | None = None
    include_obfuscation: bool | None = None

    @model_validator(mode="after")
    def _refuse_unsupported(self) -> RetrieveQuery:
        if self.include:
            raise UnsupportedParameterError("'include' is not supported", param="include")
        if self.include_obfuscation:
            raise UnsupportedParameterError(
                "stream obfuscation is not implemented", param="include_obfuscation"
            )
        return self
