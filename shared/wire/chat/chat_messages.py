"""The message of a chat request: what clients send (their history included), and what a chat
job carries to the chat template (shared/queue/prompt/prompt_tokens.py renders it).

An assistant message sent back in history may carry what the answer carried: its reasoning
(`reasoning_content`, DeepSeek's and llama.cpp's name, or `reasoning`, vLLM's and OpenRouter's),
a `refusal`, and `annotations` (URL citations, which change nothing here), so the OpenAI SDK's
`message.model_dump()` goes back as it came. Unknown fields are refused (400 naming them).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator
from pydantic_core import PydanticCustomError

from shared.wire.generation.tools import MAX_TOOLS, ToolCall

MAX_CONTENT_CHARS = 1_048_576  # characters in one message (all its parts) or one prompt
MAX_CONTENT_PARTS = 1024  # text parts in one message


class CacheBreakpoint(BaseModel):
    """OpenAI's explicit prompt-cache breakpoint on a text part: accepted; the worker's prefix
    cache reuses any repeated prompt opening without being asked."""

    model_config = ConfigDict(extra="forbid")
    mode: Literal["explicit"]
    ttl: Literal["30m", "12h"] | None = None


class TextPart(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["text"]
    text: Annotated[str, Field(max_length=MAX_CONTENT_CHARS)]
    prompt_cache_breakpoint: CacheBreakpoint | None = None


class RefusalPart(BaseModel):
    """An earlier assistant turn's refusal, sent back as a content part: its text is the turn's."""

    model_config = ConfigDict(extra="forbid")
    type: Literal["refusal"]
    refusal: Annotated[str, Field(max_length=MAX_CONTENT_CHARS)]

    @property
    def text(self) -> str:
        return self.refusal


ContentPart = Annotated[TextPart | RefusalPart, Field(discriminator="type")]
HistoryText = Annotated[str, Field(max_length=MAX_CONTENT_CHARS)]


def _not_supported(why: str) -> PydanticCustomError:
    return PydanticCustomError("unsupported_parameter", why)


class ChatMessage(BaseModel):
    """A chat message as clients send it, and as the job carries it to the chat template."""

    model_config = ConfigDict(extra="forbid")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    # Only an assistant message that calls tools (or refused, or only reasoned) may leave it out.
    content: (
        HistoryText | Annotated[list[ContentPart], Field(max_length=MAX_CONTENT_PARTS)] | None
    ) = Field(default=None, validate_default=True)
    name: Annotated[str, Field(max_length=256)] | None = None
    tool_calls: Annotated[list[ToolCall], Field(max_length=MAX_TOOLS)] | None = None
    tool_call_id: Annotated[str, Field(max_length=128)] | None = None
    reasoning_content: HistoryText | None = None
    reasoning: HistoryText | None = None
    refusal: HistoryText | None = None
    annotations: Annotated[list[dict[str, Any]], Field(max_length=MAX_CONTENT_PARTS)] | None = None
    # Refused when set: mlxq makes no audio, and the deprecated functions API gave way to tools.
    audio: dict[str, Any] | None = None
    function_call: dict[str, Any] | None = None

    @field_validator("audio")
    @classmethod
    def _no_audio(cls, value: dict[str, Any] | None) -> None:
        if value is not None:
            raise _not_supported("audio is not supported: the models served write text only")

    @field_validator("function_call")
    @classmethod
    def _no_function_call(cls, value: dict[str, Any] | None) -> None:
        if value is not None:
            raise _not_supported("the deprecated functions API is replaced by tool_calls")

    @field_validator("content")
    @classmethod
    def _bounded_text(cls, value: str | list[ContentPart] | None, info: ValidationInfo) -> Any:
        if value is None and info.data.get("role") != "assistant":
            raise PydanticCustomError("missing", "Field required")
        if isinstance(value, list):
            length = sum(len(part.text) for part in value)
            if length > MAX_CONTENT_CHARS:
                raise PydanticCustomError(
                    "string_too_long",
                    "the text parts of one message have at most {max_length} characters together",
                    {"max_length": MAX_CONTENT_CHARS, "actual_length": length},
                )
        return value

    @model_validator(mode="after")
    def _tool_fields(self) -> ChatMessage:
        if self.role == "tool" and not self.tool_call_id:
            raise PydanticCustomError("missing", "a tool message needs its tool_call_id")
        if self.tool_calls and self.role != "assistant":
            raise PydanticCustomError("tool_calls", "only assistant messages carry tool_calls")
        answer = (self.reasoning_content, self.reasoning, self.refusal)
        if self.role != "assistant" and any(v is not None for v in answer):
            raise PydanticCustomError(
                "assistant_only", "only assistant messages carry reasoning or a refusal"
            )
        parts = self.content if isinstance(self.content, list) else []
        if self.role != "assistant" and any(isinstance(p, RefusalPart) for p in parts):
            raise PydanticCustomError("assistant_only", "only assistant messages carry refusals")
        if self.content is None and not self.tool_calls and all(v is None for v in answer):
            raise PydanticCustomError("missing", "an assistant message needs content or tool_calls")
        return self

    def text(self) -> str:
        """What the message said: its content, or an assistant's refusal when it has none."""
        if self.content is None:
            return self.refusal or ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)

    def reasoning_text(self) -> str | None:
        """The reasoning an earlier assistant turn carried, whichever name it came under."""
        return self.reasoning_content if self.reasoning_content is not None else self.reasoning
