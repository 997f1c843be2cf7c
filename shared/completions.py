"""Wire formats of /v1/chat/completions and /v1/completions: OpenAI's requests and responses.

Requests forbid unknown fields (OpenAI answers those with 400 too). Fields OpenAI defines that
mlxq does not implement are declared so that their default value passes and any other value
is refused with a 400 naming the parameter, never silently ignored.

Every size a request can choose is bounded here (the limits below, in the OpenAPI document too),
each refused with OpenAI's code: `array_above_max_length`, `string_above_max_length`,
`integer_above_max_value` (api/errors.py). The body as a whole is bounded by MLXQ_MAX_BODY_BYTES.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    field_validator,
    model_serializer,
    model_validator,
)
from pydantic_core import PydanticCustomError

from shared.errors import UnsupportedParameterError
from shared.keys import MODEL_NAME_PATTERN as MODEL_NAME_PATTERN

FinishReason = Literal["stop", "length"]

# Limits on what a request may ask for.
MAX_MESSAGES = 2048  # messages in one chat request (OpenAI's limit)
MAX_CONTENT_CHARS = 1_048_576  # characters in one message (all its parts) or one prompt
MAX_CONTENT_PARTS = 1024  # text parts in one message
MAX_STOP = 4  # stop strings (OpenAI's limit)
MAX_STOP_CHARS = 256  # characters in one stop string
MAX_N = 128  # OpenAI's cap on n (mlxq implements n=1 only)
MAX_TOKENS = 131_072  # max_tokens / max_completion_tokens; the context window bounds it too
MAX_METADATA = 16  # metadata pairs, keys up to 64 and values up to 512 characters (OpenAI's)
SEED_RANGE = (-(2**63), 2**63 - 1)  # a 64-bit integer, as OpenAI takes

StopString = Annotated[str, Field(min_length=1, max_length=MAX_STOP_CHARS)]
TokenCount = Annotated[int, Field(ge=1, le=MAX_TOKENS)]


def _stop_list(value: str | list[str] | None) -> list[str]:
    if value is None:
        return []
    return [value] if isinstance(value, str) else value


def _refuse(param: str, why: str) -> None:
    raise UnsupportedParameterError(f"'{param}' is not supported: {why}", param=param)


class PromptTokensDetails(BaseModel):
    # Prompt tokens whose KV state came from the worker's prefix cache (worker/prefix_cache.py).
    cached_tokens: int = 0


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails = PromptTokensDetails()


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    include_usage: bool = False


class SamplingRequest(BaseModel):
    """The fields both endpoints share."""

    model_config = ConfigDict(extra="forbid")

    model: Annotated[str, Field(pattern=MODEL_NAME_PATTERN)]
    temperature: Annotated[float, Field(ge=0, le=2, allow_inf_nan=False)] = 1.0
    top_p: Annotated[float, Field(gt=0, le=1, allow_inf_nan=False)] = 1.0
    stop: StopString | Annotated[list[StopString], Field(max_length=MAX_STOP)] | None = None
    seed: Annotated[int, Field(ge=SEED_RANGE[0], le=SEED_RANGE[1])] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: Annotated[int, Field(ge=1, le=MAX_N)] = 1
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[str, float] | None = None
    user: str | None = None
    metadata: (
        Annotated[
            dict[Annotated[str, Field(max_length=64)], Annotated[str, Field(max_length=512)]],
            Field(max_length=MAX_METADATA),
        ]
        | None
    ) = None

    @field_validator("stop")
    @classmethod
    def _no_empty_stop(cls, value: str | list[str] | None) -> str | list[str] | None:
        if any(s == "" for s in _stop_list(value)):
            raise ValueError("stop strings must not be empty")
        return value

    @model_validator(mode="after")
    def _refuse_unsupported(self) -> SamplingRequest:
        if self.n != 1:
            _refuse("n", "only n=1 is implemented")
        if self.presence_penalty or self.frequency_penalty:
            which = "presence_penalty" if self.presence_penalty else "frequency_penalty"
            _refuse(which, "only 0 is implemented")
        if self.logit_bias:
            _refuse("logit_bias", "logit bias is not implemented")
        if self.stream_options is not None and not self.stream:
            raise ValueError("stream_options is only allowed when stream is true")
        return self

    def stop_strings(self) -> list[str]:
        return _stop_list(self.stop)

    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


class TextPart(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["text"]
    text: Annotated[str, Field(max_length=MAX_CONTENT_CHARS)]


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="forbid")

    role: Literal["system", "developer", "user", "assistant"]
    content: (
        Annotated[str, Field(max_length=MAX_CONTENT_CHARS)]
        | Annotated[list[TextPart], Field(max_length=MAX_CONTENT_PARTS)]
    )
    name: Annotated[str, Field(max_length=256)] | None = None

    @field_validator("content")
    @classmethod
    def _bounded_text(cls, value: str | list[TextPart]) -> Any:
        if isinstance(value, list):
            length = sum(len(part.text) for part in value)
            if length > MAX_CONTENT_CHARS:
                raise PydanticCustomError(
                    "string_too_long",
                    "the text parts of one message have at most {max_length} characters together",
                    {"max_length": MAX_CONTENT_CHARS, "actual_length": length},
                )
        return value

    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class ResponseFormat(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: str


class ChatCompletionRequest(SamplingRequest):
    messages: Annotated[list[ChatMessage], Field(min_length=1, max_length=MAX_MESSAGES)]
    max_tokens: TokenCount | None = None
    max_completion_tokens: TokenCount | None = None
    logprobs: bool = False
    top_logprobs: int | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    functions: list[dict[str, Any]] | None = None
    function_call: str | dict[str, Any] | None = None
    response_format: ResponseFormat | None = None

    @model_validator(mode="after")
    def _refuse_unsupported_chat(self) -> ChatCompletionRequest:
        if self.logprobs or self.top_logprobs is not None:
            _refuse("logprobs" if self.logprobs else "top_logprobs", "logprobs are not returned")
        for name in ("tools", "tool_choice", "parallel_tool_calls", "functions", "function_call"):
            if getattr(self, name) is not None:
                _refuse(name, "tool and function calling is not implemented")
        if self.response_format is not None and self.response_format.type != "text":
            _refuse("response_format", "only the 'text' format is implemented")
        return self

    def token_limit(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens


class CompletionRequest(SamplingRequest):
    prompt: Annotated[str, Field(max_length=MAX_CONTENT_CHARS)]
    max_tokens: TokenCount = 16
    echo: bool = False
    logprobs: int | None = None
    best_of: int | None = None
    suffix: str | None = None

    @model_validator(mode="after")
    def _refuse_unsupported_text(self) -> CompletionRequest:
        if self.logprobs is not None:
            _refuse("logprobs", "logprobs are not returned")
        if self.best_of not in (None, 1):
            _refuse("best_of", "only best_of=1 is implemented")
        if self.suffix:
            _refuse("suffix", "insertion is not implemented")
        return self


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str
    refusal: None = None


class ChatChoice(BaseModel):
    index: int = 0
    message: AssistantMessage
    finish_reason: FinishReason
    logprobs: None = None


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    system_fingerprint: str | None = None


class ChunkDelta(BaseModel):
    """A stream chunk's delta; fields left None are omitted, as OpenAI does."""

    role: Literal["assistant"] | None = None
    content: str | None = None

    @model_serializer(mode="wrap")
    def _omit_none(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        return {k: v for k, v in handler(self).items() if v is not None}


class ChatChunkChoice(BaseModel):
    index: int = 0
    delta: ChunkDelta
    finish_reason: FinishReason | None = None
    logprobs: None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None
    system_fingerprint: str | None = None


class TextChoice(BaseModel):
    index: int = 0
    text: str
    finish_reason: FinishReason | None = None
    logprobs: None = None


class Completion(BaseModel):
    """A text completion body, and (with `usage` None and one partial choice) a stream chunk."""

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[TextChoice]
    usage: Usage | None = None
    system_fingerprint: str | None = None
