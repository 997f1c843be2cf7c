"""The bodies of chat and text completions (and their stream chunks): their models, and the one
function that builds each from a job's events, whatever the path: an interactive request, a
batch line.

A `Transcript` gathers what one choice produced (text, log probabilities when asked for, tool
calls, how it ended); `Transcripts` keeps one per choice of a job (n of them).
`chat_completion` and `text_completion` turn them and the job's final event into OpenAI's body.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, SerializerFunctionWrapHandler, model_serializer

from shared.wire.chat.completions import (
    ChatCompletionRequest,
    CompletionRequest,
    FinishReason,
    Usage,
)
from shared.wire.events import ChoiceEndEvent, DoneEvent, TokenEvent
from shared.wire.generation.logprobs import ChoiceLogprobs, TextLogprobs, TokenLogprob
from shared.wire.generation.tools import ToolCall, ToolCallDelta


class AssistantMessage(BaseModel):
    """The answer's message. A reasoning model's reasoning goes out under both names clients
    read: `reasoning_content` (DeepSeek's API, llama.cpp) and `reasoning` (vLLM, OpenRouter,
    Ollama, mlx_lm.server); each is left out when the model did not reason."""

    role: Literal["assistant"] = "assistant"
    content: str | None
    refusal: None = None
    tool_calls: list[ToolCall] | None = None
    reasoning_content: str | None = None
    reasoning: str | None = None

    @model_serializer(mode="wrap")
    def _extras_only_when_made(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        for name in ("tool_calls", "reasoning_content", "reasoning"):
            if data.get(name) is None:
                data.pop(name, None)
        return data


class ChatChoice(BaseModel):
    index: int = 0
    message: AssistantMessage
    finish_reason: FinishReason
    logprobs: ChoiceLogprobs | None = None


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    service_tier: str | None = None
    system_fingerprint: str | None = None


class ChunkDelta(BaseModel):
    """A stream chunk's delta; fields left None are omitted, as OpenAI does."""

    role: Literal["assistant"] | None = None
    content: str | None = None
    reasoning_content: str | None = None  # the reasoning under both names (AssistantMessage)
    reasoning: str | None = None
    tool_calls: list[ToolCallDelta] | None = None

    @model_serializer(mode="wrap")
    def _omit_none(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        return {k: v for k, v in handler(self).items() if v is not None}


class ChatChunkChoice(BaseModel):
    index: int = 0
    delta: ChunkDelta
    finish_reason: FinishReason | None = None
    logprobs: ChoiceLogprobs | None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None
    service_tier: str | None = None
    system_fingerprint: str | None = None


class TextChoice(BaseModel):
    index: int = 0
    text: str
    finish_reason: FinishReason | None = None
    logprobs: TextLogprobs | None = None


class Completion(BaseModel):
    """A text completion body, and (with `usage` None and one partial choice) a stream chunk."""

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[TextChoice]
    usage: Usage | None = None
    system_fingerprint: str | None = None


@dataclass
class Transcript:
    """What one choice has produced so far."""

    parts: list[str] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    tool_calls: list[ToolCall] = field(default_factory=list)
    finish_reason: FinishReason | None = None
    reasoning_parts: list[str] | None = None  # set once the model reasons

    def add(self, event: TokenEvent) -> None:
        self.parts.append(event.text)
        if event.reasoning:
            if self.reasoning_parts is None:
                self.reasoning_parts = []
            self.reasoning_parts.append(event.reasoning)
        if event.logprobs:
            self.logprobs.extend(event.logprobs)
        if event.tool_calls:
            self.tool_calls.extend(event.tool_calls)

    @property
    def text(self) -> str:
        return "".join(self.parts)

    @property
    def reasoning(self) -> str | None:
        return None if self.reasoning_parts is None else "".join(self.reasoning_parts)


@dataclass
class Transcripts:
    """One transcript per choice of a job, by index."""

    by_index: dict[int, Transcript] = field(default_factory=dict)

    def add(self, event: TokenEvent | ChoiceEndEvent) -> None:
        if isinstance(event, TokenEvent):
            self.choice(event.index or 0).add(event)
        else:
            self.choice(event.index).finish_reason = event.finish_reason

    def choice(self, index: int) -> Transcript:
        return self.by_index.setdefault(index, Transcript())

    def clear(self) -> None:
        self.by_index.clear()

    def ordered(self, n: int, done: DoneEvent) -> list[Transcript]:
        """All n choices in index order; one that never said how it ended ended with the job."""
        choices = [self.choice(i) for i in range(n)]
        for choice in choices:
            choice.finish_reason = choice.finish_reason or done.finish_reason
        return choices


def chat_completion(
    req: ChatCompletionRequest, job_id: str, created: int, got: Transcripts, done: DoneEvent
) -> ChatCompletion:
    choices = [_chat_choice(req, i, t) for i, t in enumerate(got.ordered(req.n, done))]
    return ChatCompletion(
        id=job_id,
        created=created,
        model=req.model,
        choices=choices,
        usage=done.usage,
        service_tier=req.service_tier,
    )


def _chat_choice(req: ChatCompletionRequest, index: int, got: Transcript) -> ChatChoice:
    text = got.text
    # A choice that calls tools has no content unless the model also wrote something.
    content = None if got.tool_calls and not text.strip() else text
    reasoning = got.reasoning
    message = AssistantMessage(
        content=content,
        tool_calls=got.tool_calls or None,
        reasoning_content=reasoning,
        reasoning=reasoning,
    )
    return ChatChoice(
        index=index,
        message=message,
        finish_reason=got.finish_reason or "stop",
        logprobs=ChoiceLogprobs(content=got.logprobs) if req.logprobs else None,
    )


def text_completion(
    req: CompletionRequest, job_id: str, created: int, got: Transcripts, done: DoneEvent
) -> Completion:
    prompts = req.prompts()
    got_all = got.ordered(req.n * len(prompts), done)
    choices = [_text_choice(req, i, prompts[i // req.n], t) for i, t in enumerate(got_all)]
    return Completion(
        id=job_id, created=created, model=req.model, choices=choices, usage=done.usage
    )


def _text_choice(
    req: CompletionRequest, index: int, prompt: str | list[int], got: Transcript
) -> TextChoice:
    # An echo is of a text prompt (token-id prompts cannot ask for one); with logprobs, the
    # prompt's tokens come first in the entries, so offsets start at 0 either way.
    shown = prompt + got.text if req.echo and isinstance(prompt, str) else got.text
    logprobs = TextLogprobs.of(got.logprobs, 0) if req.logprobs is not None else None
    return TextChoice(index=index, text=shown, finish_reason=got.finish_reason, logprobs=logprobs)
