"""Anthropic's Messages API answers: the message body, its stream events and its error body,
each translated from what the chat side already has (the chat completion built by
shared/wire/chat/answers.py, a job's events, an mlxq error).

The stream (`MessageStream`) turns a job's events into Anthropic's sequence: `message_start`,
then per content block `content_block_start`, its deltas (`thinking_delta`, `text_delta`,
`input_json_delta`) and `content_block_stop`, then `message_delta` (stop reason and usage) and
`message_stop`. A text block is opened only for text with something visible in it, so a forced
tool call, whose text is empty, is one `tool_use` block, as Anthropic sends it.

A reasoning model's reasoning is a `thinking` block before the others; it closes with a
`signature_delta` whose signature is opaque and never empty
(shared/wire/responses/reasoning_blob.py: it carries the thinking itself, so a block sent back on
the next turn gives it to the template).

Usage follows Anthropic's accounting: `input_tokens` are the prompt tokens computed for this
request, `cache_read_input_tokens` those the worker's prefix cache already held; the prompt is
their sum (what count_tokens gives).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, RootModel

from shared.wire.chat.answers import ChatCompletion
from shared.wire.chat.completions import FinishReason, Usage
from shared.wire.errors import ErrorDetail
from shared.wire.events import DoneEvent, TokenEvent
from shared.wire.generation.tools import ToolCall, ToolCallDelta
from shared.wire.responses.reasoning_blob import encode_reasoning_blob

StopReason = Literal["end_turn", "max_tokens", "stop_sequence", "tool_use"]


class TextContent(BaseModel):
    type: Literal["text"] = "text"
    text: str
    citations: None = None


class ThinkingContent(BaseModel):
    type: Literal["thinking"] = "thinking"
    thinking: str
    signature: str


class ToolUseContent(BaseModel):
    type: Literal["tool_use"] = "tool_use"
    id: str
    name: str
    input: dict[str, Any]


Content = Annotated[ThinkingContent | TextContent | ToolUseContent, Field(discriminator="type")]


class MessageUsage(BaseModel):
    input_tokens: int
    output_tokens: int
    cache_creation_input_tokens: int = 0
    cache_read_input_tokens: int = 0


class Message(BaseModel):
    """The body of a created message (and, empty, the message of `message_start`)."""

    id: str
    type: Literal["message"] = "message"
    role: Literal["assistant"] = "assistant"
    model: str
    content: list[Content]
    stop_reason: StopReason | None = None
    stop_sequence: str | None = None
    usage: MessageUsage


def stop_reason(finish_reason: FinishReason, stop_sequence: str | None) -> StopReason:
    if finish_reason == "tool_calls":
        return "tool_use"
    if finish_reason == "length":
        return "max_tokens"
    return "stop_sequence" if stop_sequence is not None else "end_turn"


def message_usage(usage: Usage) -> MessageUsage:
    cached = usage.prompt_tokens_details.cached_tokens
    return MessageUsage(
        input_tokens=usage.prompt_tokens - cached,
        output_tokens=usage.completion_tokens,
        cache_read_input_tokens=cached,
    )


def tool_input(call: ToolCall) -> dict[str, Any]:
    """A call's arguments as Anthropic's `input` object; arguments that are not a JSON object
    (a model's free-form call) are kept whole under "arguments"."""
    try:
        parsed = json.loads(call.function.arguments)
    except ValueError:
        return {"arguments": call.function.arguments}
    return parsed if isinstance(parsed, dict) else {"arguments": parsed}


def tool_use(call: ToolCall) -> ToolUseContent:
    return ToolUseContent(id=call.id, name=call.function.name, input=tool_input(call))


def message(completion: ChatCompletion, done: DoneEvent) -> Message:
    """The message of a finished job, from the chat completion built of its events."""
    answer = completion.choices[0].message
    content: list[ThinkingContent | TextContent | ToolUseContent] = []
    if answer.reasoning is not None:
        signature = encode_reasoning_blob(answer.reasoning)
        content.append(ThinkingContent(thinking=answer.reasoning, signature=signature))
    if answer.content and answer.content.strip():  # as the stream: no block of blank text
        content.append(TextContent(text=answer.content))
    content.extend(tool_use(call) for call in answer.tool_calls or [])
    return Message(
        id=completion.id,
        model=completion.model,
        content=content,
        stop_reason=stop_reason(done.finish_reason, done.stop_sequence),
        stop_sequence=done.stop_sequence,
        usage=message_usage(completion.usage),
    )


# The stream's events


class MessageStart(BaseModel):
    type: Literal["message_start"] = "message_start"
    message: Message


class ContentBlockStart(BaseModel):
    type: Literal["content_block_start"] = "content_block_start"
    index: int
    content_block: Content


class TextDelta(BaseModel):
    type: Literal["text_delta"] = "text_delta"
    text: str


class InputJsonDelta(BaseModel):
    type: Literal["input_json_delta"] = "input_json_delta"
    partial_json: str


class ThinkingDelta(BaseModel):
    type: Literal["thinking_delta"] = "thinking_delta"
    thinking: str


class SignatureDelta(BaseModel):
    type: Literal["signature_delta"] = "signature_delta"
    signature: str


class ContentBlockDelta(BaseModel):
    type: Literal["content_block_delta"] = "content_block_delta"
    index: int
    delta: Annotated[
        TextDelta | InputJsonDelta | ThinkingDelta | SignatureDelta, Field(discriminator="type")
    ]


class ContentBlockStop(BaseModel):
    type: Literal["content_block_stop"] = "content_block_stop"
    index: int


class StopDelta(BaseModel):
    stop_reason: StopReason
    stop_sequence: str | None = None


class MessageDelta(BaseModel):
    type: Literal["message_delta"] = "message_delta"
    delta: StopDelta
    usage: MessageUsage


class MessageStop(BaseModel):
    type: Literal["message_stop"] = "message_stop"


class Ping(BaseModel):
    type: Literal["ping"] = "ping"


StreamEvent = (
    MessageStart
    | ContentBlockStart
    | ContentBlockDelta
    | ContentBlockStop
    | MessageDelta
    | MessageStop
    | Ping
)


class MessageStreamEvent(RootModel[Annotated[StreamEvent, Field(discriminator="type")]]):
    """Any one of the stream's events (the `data:` of each frame, for /openapi.json)."""


@dataclass
class MessageStream:
    """A job's events as Anthropic's stream events, block by block."""

    message_id: str
    model: str
    blocks: int = 0  # content blocks opened so far
    text_open: bool = False  # whether the last block is a text block still open
    held: str = field(default="")  # text with nothing visible, kept until something follows
    # Calls streamed piece by piece: a call's id, and its index among the choice's calls (what
    # later pieces carry), to the content block it writes.
    streamed: dict[str, int] = field(default_factory=dict)
    call_blocks: dict[int, int] = field(default_factory=dict)
    thinking: list[str] | None = None  # the open thinking block's text so far

    def opening(self, prompt_tokens: int) -> list[StreamEvent]:
        usage = MessageUsage(input_tokens=prompt_tokens, output_tokens=0)
        start = Message(id=self.message_id, model=self.model, content=[], usage=usage)
        return [MessageStart(message=start), Ping()]

    def feed(self, event: TokenEvent) -> list[StreamEvent]:
        events = self._think(event.reasoning) if event.reasoning else []
        if event.text or event.call_deltas or event.tool_calls:
            events += self._close_thinking()
        events += self._text(event.text) if event.text else []
        for piece in event.call_deltas or []:
            events.extend(self._piece(piece))
        for call in event.tool_calls or []:
            events.extend(self._ended(call))
        return events

    def continues_text(self, event: TokenEvent) -> bool:
        """Whether the token only adds text to the open text block: one `text_delta` of the
        block `blocks - 1` (the per-token case, which the route frames fast)."""
        return (
            self.text_open
            and bool(event.text)
            and not (event.tool_calls or event.call_deltas or event.reasoning)
        )

    def closing(self, done: DoneEvent) -> list[StreamEvent]:
        events = self._close_thinking() + self._close_text()
        reason = stop_reason(done.finish_reason, done.stop_sequence)
        delta = StopDelta(stop_reason=reason, stop_sequence=done.stop_sequence)
        events += [MessageDelta(delta=delta, usage=message_usage(done.usage)), MessageStop()]
        return events

    def _think(self, reasoning: str) -> list[StreamEvent]:
        events: list[StreamEvent] = []
        if self.thinking is None:
            self.thinking = []
            block = ThinkingContent(thinking="", signature="")
            events.append(ContentBlockStart(index=self.blocks, content_block=block))
            self.blocks += 1
        self.thinking.append(reasoning)
        delta = ThinkingDelta(thinking=reasoning)
        return [*events, ContentBlockDelta(index=self.blocks - 1, delta=delta)]

    def _close_thinking(self) -> list[StreamEvent]:
        """The thinking block ends when anything else begins: its signature, then its stop."""
        if self.thinking is None:
            return []
        signature = SignatureDelta(signature=encode_reasoning_blob("".join(self.thinking)))
        self.thinking = None
        index = self.blocks - 1
        return [ContentBlockDelta(index=index, delta=signature), ContentBlockStop(index=index)]

    def _text(self, text: str) -> list[StreamEvent]:
        events: list[StreamEvent] = []
        if not self.text_open:
            if not (self.held + text).strip():
                self.held += text
                return []
            text, self.held = self.held + text, ""
            events.append(ContentBlockStart(index=self.blocks, content_block=TextContent(text="")))
            self.blocks, self.text_open = self.blocks + 1, True
        events.append(ContentBlockDelta(index=self.blocks - 1, delta=TextDelta(text=text)))
        return events

    def _close_text(self) -> list[StreamEvent]:
        if not self.text_open:
            return []
        self.text_open = False
        return [ContentBlockStop(index=self.blocks - 1)]

    def _open_call(self, call_id: str, name: str) -> list[StreamEvent]:
        events = self._close_text()
        self.held = ""  # blank text around a call is not a block of its own
        index, self.blocks = self.blocks, self.blocks + 1
        block = ToolUseContent(id=call_id, name=name, input={})
        return [*events, ContentBlockStart(index=index, content_block=block)]

    def _piece(self, piece: ToolCallDelta) -> list[StreamEvent]:
        """A piece of a call as the model writes it: the first opens its `tool_use` block, the
        next ones are its input's JSON text (`input_json_delta`), as Anthropic streams it."""
        events: list[StreamEvent] = []
        if piece.id is not None:
            events = self._open_call(piece.id, piece.function.name or "")
            self.call_blocks[piece.index] = self.streamed[piece.id] = self.blocks - 1
        block = self.call_blocks.get(piece.index)
        if piece.function.arguments and block is not None:
            delta = InputJsonDelta(partial_json=piece.function.arguments)
            events.append(ContentBlockDelta(index=block, delta=delta))
        return events

    def _ended(self, call: ToolCall) -> list[StreamEvent]:
        """A completed call: its streamed block closes; a call that came whole (a family whose
        calls are parsed only once written) is one block of start, input and stop."""
        if call.id in self.streamed:
            return [ContentBlockStop(index=self.streamed[call.id])]
        events = self._open_call(call.id, call.function.name)
        delta = InputJsonDelta(partial_json=json.dumps(tool_input(call)))
        index = self.blocks - 1
        return [*events, ContentBlockDelta(index=index, delta=delta), ContentBlockStop(index=index)]


# Errors

AnthropicErrorType = Literal[
    "invalid_request_error",
    "authentication_error",
    "permission_error",
    "not_found_error",
    "request_too_large",
    "rate_limit_error",
    "api_error",
    "overloaded_error",
    "timeout_error",
]


class AnthropicErrorDetail(BaseModel):
    type: AnthropicErrorType
    message: str


class AnthropicErrorBody(BaseModel):
    """Anthropic's error body: `{"type": "error", "error": {"type", "message"}}`."""

    type: Literal["error"] = "error"
    error: AnthropicErrorDetail


OVERLOADED = 529  # Anthropic's status for "overloaded, retry later"
# mlxq's codes that mean the service is too busy now: Anthropic answers those 529.
_OVERLOADED_CODES = frozenset({"queue_full", "queue_timeout"})
_TYPE_OF_STATUS: dict[int, AnthropicErrorType] = {
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    504: "timeout_error",
}


def anthropic_error(status: int, detail: ErrorDetail) -> tuple[int, AnthropicErrorBody]:
    """An mlxq error (its status and OpenAI detail) as Anthropic's status and body."""
    if detail.code in _OVERLOADED_CODES:
        status, kind = OVERLOADED, "overloaded_error"
    elif status in _TYPE_OF_STATUS:
        kind = _TYPE_OF_STATUS[status]
    else:
        kind = "api_error" if status >= 500 else "invalid_request_error"
    return status, AnthropicErrorBody(error=AnthropicErrorDetail(type=kind, message=detail.message))
