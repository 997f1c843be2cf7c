"""The bodies of chat and text completions, each built by one function from a job's events,
whatever the path: an interactive request, a batch line.

A `Transcript` gathers a job's token events (text and, when asked for, log probabilities);
`chat_completion` and `text_completion` turn it and the final event into OpenAI's body.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from shared.completions import (
    AssistantMessage,
    ChatChoice,
    ChatCompletion,
    ChatCompletionRequest,
    ChoiceLogprobs,
    Completion,
    CompletionRequest,
    TextChoice,
    TextLogprobs,
    TokenLogprob,
)
from shared.events import DoneEvent, TokenEvent
from shared.tools import ToolCall


@dataclass
class Transcript:
    """What a job has produced so far."""

    parts: list[str] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    tool_calls: list[ToolCall] = field(default_factory=list)

    def add(self, event: TokenEvent) -> None:
        self.parts.append(event.text)
        if event.logprobs:
            self.logprobs.extend(event.logprobs)
        if event.tool_calls:
            self.tool_calls.extend(event.tool_calls)

    def clear(self) -> None:
        self.parts.clear()
        self.logprobs.clear()
        self.tool_calls.clear()

    @property
    def text(self) -> str:
        return "".join(self.parts)


def chat_completion(
    req: ChatCompletionRequest, job_id: str, created: int, got: Transcript, done: DoneEvent
) -> ChatCompletion:
    logprobs = ChoiceLogprobs(content=got.logprobs) if req.logprobs else None
    text = got.text
    # A choice that calls tools has no content unless the model also wrote something.
    content = None if got.tool_calls and not text.strip() else text
    message = AssistantMessage(content=content, tool_calls=got.tool_calls or None)
    choice = ChatChoice(
        message=message,
        finish_reason=done.finish_reason,
        logprobs=logprobs,
    )
    return ChatCompletion(
        id=job_id,
        created=created,
        model=req.model,
        choices=[choice],
        usage=done.usage,
        service_tier=req.service_tier,
    )


def text_completion(
    req: CompletionRequest, job_id: str, created: int, got: Transcript, done: DoneEvent
) -> Completion:
    shown = req.prompt + got.text if req.echo else got.text
    logprobs = None
    if req.logprobs is not None:
        logprobs = TextLogprobs.of(got.logprobs, len(shown) - len(got.text))
    choice = TextChoice(text=shown, finish_reason=done.finish_reason, logprobs=logprobs)
    return Completion(
        id=job_id, created=created, model=req.model, choices=[choice], usage=done.usage
    )
