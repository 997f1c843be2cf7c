"""Wire formats of /v1/responses (text only): the request, the response object, its stored record.

A response is one generation job; its state is derived from the job's events
(shared/wire/responses/response_state.py). Choices where OpenAI's documents leave room:
`instructions` become a system message before the input; `queue_position` (an mlxq extension,
present only while queued) counts the background jobs ahead of this one (0: it is next).

Reasoning: `reasoning.effort` becomes the job's `ReasoningControl`
(shared/wire/generation/reasoning.py); `reasoning.summary` is accepted, and no summary is written (a
reasoning item carries the reasoning itself); `include: ["reasoning.encrypted_content"]` asks for
the opaque value a client sends back (shared/wire/responses/reasoning_blob.py).
`prompt_cache_key` is a placement hint, scoped by the caller (api/queue/placement.py). Accepted
and changing nothing here: `prompt_cache_retention` (the worker's prefix cache reuses any
repeated prompt opening without it), `safety_identifier` (mlxq checks no policies per end user).
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

from shared.wire.chat.completions import (
    MAX_MESSAGES,
    MAX_METADATA,
    MODEL_NAME_PATTERN,
    ChatMessage,
    TokenCount,
    Usage,
)
from shared.wire.errors import InvalidRequestError, UnsupportedParameterError
from shared.wire.generation.grammar import (
    SCHEMA_NAME_PATTERN,
    JsonObjectFormat,
    SchemaGrammar,
    TextFormat,
)
from shared.wire.generation.reasoning import Effort, ReasoningControl
from shared.wire.generation.tools import (
    MAX_TOOLS,
    FunctionChoice,
    NamedToolChoice,
    ToolChoice,
    ToolUse,
    check_tools,
)
from shared.wire.images import ImageInput
from shared.wire.responses.response_items import (
    FunctionCallItem,
    FunctionCallOutput,
    FunctionTool,
    InputItem,
    InputMessage,
    NamedFunction,
    ReasoningItem,
    Text,
    add_call,
    add_reasoning,
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
    "prompt",
    "service_tier",
    "top_logprobs",
    "stream_options",
    "background_options",
    "context_management",
)


# What `include` may ask for: the one extra output mlxq makes.
INCLUDABLE = frozenset({"reasoning.encrypted_content"})


def check_include(include: list[str] | None) -> None:
    """Refuse, by name, an `include` value asking for output mlxq does not make."""
    for value in include or []:
        if value not in INCLUDABLE:
            raise UnsupportedParameterError(
                f"include '{value[:80]}' is not supported: only {', '.join(sorted(INCLUDABLE))} is",
                param="include",
            )


SummaryLevel = Literal["auto", "concise", "detailed"]


class ReasoningConfig(BaseModel):
    """The request's `reasoning` (and the response's, echoed)."""

    model_config = ConfigDict(extra="forbid")
    effort: Effort | None = None
    summary: SummaryLevel | None = None
    generate_summary: SummaryLevel | None = None  # `summary`'s deprecated name
    # Which turns' reasoning is rendered back: the model's chat template decides, as `auto` says.
    context: Literal["auto", "current_turn", "all_turns"] | None = None
    mode: Annotated[str, Field(max_length=64)] | None = None

    @model_validator(mode="after")
    def _refuse_unsupported(self) -> ReasoningConfig:
        if self.context not in (None, "auto"):
            raise UnsupportedParameterError(
                "reasoning.context is not supported: the chat template decides which turns' "
                "reasoning it renders",
                param="reasoning.context",
            )
        if self.mode not in (None, "standard"):
            raise UnsupportedParameterError(
                "reasoning.mode is not supported: one mode serves all", param="reasoning.mode"
            )
        return self

    def control(self) -> ReasoningControl | None:
        return None if self.effort is None else ReasoningControl.of_effort(self.effort)


class JsonSchemaTextFormat(SchemaGrammar):
    """The Responses API's `text.format` for a schema: chat's `json_schema` spec, flattened."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True, serialize_by_alias=True)
    type: Literal["json_schema"]
    name: Annotated[str, Field(pattern=SCHEMA_NAME_PATTERN)]
    description: str | None = None
    schema_: Annotated[dict[str, Any], Field(alias="schema")]
    strict: bool | None = None

    def grammar(self, param: str) -> str | None:
        return self._grammar_of(self.schema_, param)


TextFormatChoice = Annotated[
    TextFormat | JsonObjectFormat | JsonSchemaTextFormat, Field(discriminator="type")
]


class TextConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    format: TextFormatChoice = TextFormat(type="text")
    # Its default passes; the models served have no verbosity setting.
    verbosity: Literal["low", "medium", "high"] | None = None

    @model_validator(mode="after")
    def _refuse_verbosity(self) -> TextConfig:
        if self.verbosity not in (None, "medium"):
            raise UnsupportedParameterError(
                "text.verbosity is not supported: the models served have no verbosity setting",
                param="text.verbosity",
            )
        return self


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
    reasoning: ReasoningConfig | None = None
    include: Annotated[list[Annotated[str, Field(max_length=256)]], Field(max_length=32)] | None = (
        None
    )
    prompt: Any = None
    prompt_cache_key: Annotated[str, Field(max_length=1024)] | None = None
    prompt_cache_retention: Literal["in_memory", "24h"] | None = None
    safety_identifier: Annotated[str, Field(max_length=256)] | None = None
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
        check_include(self.include)
        self.images()  # refuse an image that cannot be taken (file_id), naming its part
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

    def reasoning_control(self) -> ReasoningControl | None:
        return self.reasoning.control() if self.reasoning is not None else None

    def images(self) -> list[ImageInput]:
        """The images the input carries, in order, each named by its parameter."""
        items = [] if isinstance(self.input, str) else self.input
        return [
            image
            for i, item in enumerate(items)
            if isinstance(item, InputMessage)
            for image in item.images(f"input.{i}")
        ]

    def chat_messages(self) -> list[ChatMessage]:
        messages = []
        if self.instructions:
            messages.append(ChatMessage(role="system", content=self.instructions))
        if isinstance(self.input, str):
            messages.append(ChatMessage(role="user", content=self.input))
            return messages
        reasoning: list[str] = []  # reasoning items waiting for the turn after them
        for item in self.input:
            if isinstance(item, ReasoningItem):
                text = item.reasoning()
                reasoning += [text] if text else []
                continue
            if isinstance(item, InputMessage):
                messages.append(item.chat_message())
            elif isinstance(item, FunctionCallOutput):
                messages.append(
                    ChatMessage(role="tool", tool_call_id=item.call_id, content=item.output)
                )
            else:
                add_call(messages, item)
            add_reasoning(messages, reasoning)
            reasoning = []
        return messages


class StoredResponse(BaseModel):
    """What the API stores when it creates a response; everything else is derived."""

    id: str
    created_at: int
    background: bool
    request: ResponsesRequest

    def item_id(self) -> str:
        return "msg_" + self.id.removeprefix("resp_")

    def reasoning_id(self) -> str:
        return "rs_" + self.id.removeprefix("resp_")


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
    output: list[ReasoningItem | OutputMessage | FunctionCallItem]
    parallel_tool_calls: bool = False
    previous_response_id: None = None
    reasoning: ReasoningConfig | None = None
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
        check_include(self.include)
        if self.include_obfuscation:
            raise UnsupportedParameterError(
                "stream obfuscation is not implemented", param="include_obfuscation"
            )
        return self
