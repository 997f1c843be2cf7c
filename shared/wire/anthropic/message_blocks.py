"""The content blocks of Anthropic's input messages, and an input message's translation into chat
messages (shared/wire/anthropic/messages.py puts them together into the chat request).

An agent sends the assistant's blocks back as it received them (the `anthropic` SDK's
`block.model_dump()`), so every field Anthropic's reference documents on them is accepted:
`citations` on text, `caller` and `toolset_name` on a tool call (they describe the earlier turn;
nothing here changes with them), and `thinking` / `redacted_thinking` blocks, whose text becomes
the turn's reasoning for the chat template. A signature is not checked: mlxq's own sign nothing,
and any other server's cannot be checked here. A redacted block's `data` gives text only when
mlxq made it (shared/wire/responses/reasoning_blob.py); other data is accepted and left out.

How the blocks map: `tool_result` blocks -> tool messages; an assistant's `tool_use` blocks ->
its tool_calls (arguments as JSON text); its thinking -> the message's `reasoning_content`; a
user's `image` blocks -> image parts of its chat message, in place among its text (a `base64`
source as a data URL; a `url` source as its link, which shared/wire/images.py refuses unless
fetching is allowed and built). An image inside a `tool_result` is not taken (400).
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from shared.wire.chat.chat_messages import (
    MAX_CONTENT_CHARS,
    MAX_CONTENT_PARTS,
    ChatMessage,
    ImagePart,
    ImageUrl,
    TextPart,
)
from shared.wire.generation.tools import FunctionCall, FunctionName, ToolCall
from shared.wire.images import ImageInput, MediaType
from shared.wire.responses.reasoning_blob import decode_reasoning_blob

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
    # Where an earlier answer's text came from (documents, search results): metadata only.
    citations: Annotated[list[dict[str, Any]], Field(max_length=MAX_CONTENT_PARTS)] | None = None


class Base64Source(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["base64"]
    media_type: MediaType
    data: Annotated[str, Field(min_length=1)]


class UrlSource(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["url"]
    url: Annotated[str, Field(min_length=1)]


class ImageBlock(BaseModel):
    """An image in a user message."""

    model_config = ConfigDict(extra="forbid")
    type: Literal["image"]
    source: Annotated[Base64Source | UrlSource, Field(discriminator="type")]
    cache_control: CacheControl | None = None

    def image(self, param: str) -> ImageInput:
        """The image as given, named under `param` (the block's own name)."""
        source = self.source
        if isinstance(source, UrlSource):
            return ImageInput(param=f"{param}.source.url", url=source.url)
        return ImageInput(
            param=f"{param}.source.data", data=source.data, media_type=source.media_type
        )

    def chat_part(self) -> ImagePart:
        source = self.source
        if isinstance(source, UrlSource):
            url = source.url
        else:
            url = f"data:{source.media_type};base64,{source.data}"
        return ImagePart(type="image_url", image_url=ImageUrl(url=url))


class Caller(BaseModel):
    """Who made a tool call: the model itself (`direct`) or a server tool running code."""

    model_config = ConfigDict(extra="forbid")
    type: Annotated[str, Field(max_length=64)]
    tool_id: Annotated[str, Field(max_length=128)] | None = None


class ToolUseBlock(BaseModel):
    """A call the assistant made earlier in the conversation."""

    model_config = ConfigDict(extra="forbid")
    type: Literal["tool_use"]
    id: ToolUseId
    name: FunctionName
    input: dict[str, Any]
    cache_control: CacheControl | None = None
    caller: Caller | None = None
    toolset_name: Annotated[str, Field(max_length=256)] | None = None


class ToolResultBlock(BaseModel):
    """What a call returned, sent back in a user message."""

    model_config = ConfigDict(extra="forbid")
    type: Literal["tool_result"]
    tool_use_id: ToolUseId
    content: Text | Annotated[list[TextBlock], Field(max_length=MAX_CONTENT_PARTS)] = ""
    is_error: bool = False
    cache_control: CacheControl | None = None

    def text(self) -> str:
        text = self.content if isinstance(self.content, str) else joined(self.content)
        # The model is told that the call failed, in words, as no chat template has a flag.
        return f"Error: {text}" if self.is_error else text


class ThinkingBlock(BaseModel):
    """An earlier turn's thinking, sent back with its signature."""

    model_config = ConfigDict(extra="forbid")
    type: Literal["thinking"]
    thinking: Text
    signature: Text = ""

    def reasoning(self) -> str | None:
        return self.thinking


class RedactedThinkingBlock(BaseModel):
    """An earlier turn's thinking, sent back as the opaque data it came as."""

    model_config = ConfigDict(extra="forbid")
    type: Literal["redacted_thinking"]
    data: Text

    def reasoning(self) -> str | None:
        return decode_reasoning_blob(self.data)


AnyBlock = (
    TextBlock | ImageBlock | ToolUseBlock | ToolResultBlock | ThinkingBlock | RedactedThinkingBlock
)
ContentBlock = Annotated[AnyBlock, Field(discriminator="type")]
# The blocks only an assistant writes, and those only a user sends.
ASSISTANT_BLOCKS = (ToolUseBlock, ThinkingBlock, RedactedThinkingBlock)
USER_BLOCKS = (ToolResultBlock, ImageBlock)


class InputMessage(BaseModel):
    model_config = ConfigDict(extra="forbid")
    role: Literal["user", "assistant"]
    content: Text | Annotated[list[ContentBlock], Field(max_length=MAX_CONTENT_PARTS)]

    @model_validator(mode="after")
    def _blocks_of_the_role(self) -> InputMessage:
        wrong = USER_BLOCKS if self.role == "assistant" else ASSISTANT_BLOCKS
        misplaced = [b for b in self.blocks() if isinstance(b, wrong)]
        if misplaced:
            raise ValueError(f"a {self.role} message cannot carry {misplaced[0].type} blocks")
        return self

    def blocks(self) -> list[AnyBlock]:
        if isinstance(self.content, str):
            return [TextBlock(type="text", text=self.content)]
        return list(self.content)

    def images(self, param: str) -> list[ImageInput]:
        """Its images as given, named under `param` (the message's own name)."""
        blocks = self.content if isinstance(self.content, list) else []
        return [
            b.image(f"{param}.content.{i}")
            for i, b in enumerate(blocks)
            if isinstance(b, ImageBlock)
        ]

    def chat_messages(self) -> list[ChatMessage]:
        """This message as chat messages: one per tool result, then the rest of its text (with
        the turn's reasoning, its thinking blocks in order; its images in place)."""
        blocks = self.blocks()
        results = [b for b in blocks if isinstance(b, ToolResultBlock)]
        if any(isinstance(b, ImageBlock) for b in blocks):
            chat = [
                ChatMessage(role="tool", content=r.text(), tool_call_id=r.tool_use_id)
                for r in results
            ]
            parts = [
                b.chat_part() if isinstance(b, ImageBlock) else TextPart(type="text", text=b.text)
                for b in blocks
                if isinstance(b, ImageBlock | TextBlock)
            ]
            return [*chat, ChatMessage(role="user", content=parts)]
        texts = [b for b in blocks if isinstance(b, TextBlock)]
        calls = [_tool_call(b) for b in blocks if isinstance(b, ToolUseBlock)]
        thoughts = [
            b.reasoning() for b in blocks if isinstance(b, ThinkingBlock | RedactedThinkingBlock)
        ]
        reasoning = "\n".join(t for t in thoughts if t) or None
        chat = [
            ChatMessage(role="tool", content=r.text(), tool_call_id=r.tool_use_id) for r in results
        ]
        if texts or calls or not results:
            text = joined(texts)
            content = None if calls and not text else text
            chat.append(
                ChatMessage(
                    role=self.role,
                    content=content,
                    tool_calls=calls or None,
                    reasoning_content=reasoning,
                )
            )
        return chat


def joined(blocks: list[TextBlock]) -> str:
    return "".join(block.text for block in blocks)


def _tool_call(block: ToolUseBlock) -> ToolCall:
    return ToolCall(
        id=block.id, function=FunctionCall(name=block.name, arguments=json.dumps(block.input))
    )
