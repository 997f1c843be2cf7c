"""The message of a chat request: what clients send (their history included), and what a chat
job carries to the chat template (shared/queue/prompt/prompt_tokens.py renders it).

An assistant message sent back in history may carry what the answer carried: its reasoning
(`reasoning_content`, DeepSeek's and llama.cpp's name, or `reasoning`, vLLM's and OpenRouter's),
a `refusal`, and `annotations` (URL citations, which change nothing here), so the OpenAI SDK's
`message.model_dump()` goes back as it came. Unknown fields are refused (400 naming them).

A user message may carry images: `image_url` parts (OpenAI's chat reference has no
`input_image` part: that is the Responses API's), each a data URL or a link, with its `detail`.
What an image may be is shared/wire/images.py's rule, checked before anything is queued; a job
with images runs only on a model that reads them (shared/queue/model_kinds.py). Its text is the
text parts' alone.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator
from pydantic_core import PydanticCustomError

from shared.wire.generation.tools import MAX_TOOLS, ToolCall
from shared.wire.images import Detail, ImageInput

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


class ImageUrl(BaseModel):
    """Where an image part's image is: a data URL (base64) or a link, and how closely to look
    (`detail`: accepted; the engine that reads images decides its resolution)."""

    model_config = ConfigDict(extra="forbid")
    url: Annotated[str, Field(min_length=1)]
    detail: Detail | None = None


class ImagePart(BaseModel):
    """An image in a user message."""

    model_config = ConfigDict(extra="forbid")
    type: Literal["image_url"]
    image_url: ImageUrl


ContentPart = Annotated[TextPart | RefusalPart | ImagePart, Field(discriminator="type")]
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
            length = sum(len(part.text) for part in value if not isinstance(part, ImagePart))
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
        if self.role != "user" and any(isinstance(p, ImagePart) for p in parts):
            raise PydanticCustomError("user_only", "only user messages carry images")
        if self.content is None and not self.tool_calls and all(v is None for v in answer):
            raise PydanticCustomError("missing", "an assistant message needs content or tool_calls")
        return self

    def text(self) -> str:
        """What the message said: its content, or an assistant's refusal when it has none."""
        if self.content is None:
            return self.refusal or ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content if not isinstance(part, ImagePart))

    def image_parts(self) -> list[tuple[int, ImagePart]]:
        """The message's image parts, each with its index in the content."""
        parts = self.content if isinstance(self.content, list) else []
        return [(i, part) for i, part in enumerate(parts) if isinstance(part, ImagePart)]

    def images(self, param: str) -> list[ImageInput]:
        """The message's images as given, named under `param` (the message's own name)."""
        return [
            ImageInput.of_url(f"{param}.content.{i}.image_url.url", part.image_url.url)
            for i, part in self.image_parts()
        ]

    def reasoning_text(self) -> str | None:
        """The reasoning an earlier assistant turn carried, whichever name it came under."""
        return self.reasoning_content if self.reasoning_content is not None else self.reasoning
