"""The events a worker publishes on a job's channel, and their encoding.

A job's channel carries, in order: one `StartedEvent` (the prompt is tokenized and admitted),
`TokenEvent`s (and, for a job with several choices, a `ChoiceEndEvent` as each ends), then
exactly one final event, `DoneEvent` or `ErrorEvent`; between them, on the channel only (never
in the replay log), an `AliveEvent` whenever the job has been silent a while (a long prompt's
prefill). An embedding job carries `EmbeddingEvent`s
(one vector each, any order) where a generation job carries tokens. A job refused before
it starts sends only an `ErrorEvent`. A bulk job whose worker died is retried from scratch: its
replay log is reset to one `RequeuedEvent` and the sequence above starts over (readers drop what
they had of the lost attempt). `encode_event` and `decode_event` are the only places
that turn events into bytes and back.

A channel message is a frame: the events of one worker step for every job that channel serves,
one line each, `job_id SP event` (`encode_frame`, `decode_frame`). Event JSON holds no raw
newline, so a line is always one event. One message per step and API process, instead of one
per token, is what lets one API process relay a fleet.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Annotated, Literal

from pydantic import BaseModel, Field, TypeAdapter, ValidationError

from shared.wire.chat.completions import FinishReason, Usage
from shared.wire.errors import ErrorDetail, GenerationError, MLXQError
from shared.wire.generation.logprobs import TokenLogprob
from shared.wire.generation.tools import ToolCall, ToolCallDelta


class StartedEvent(BaseModel):
    type: Literal["started"] = "started"
    prompt_tokens: int
    worker: str | None = None  # the worker running the job, for the API's request log line
    # True when the job's model keeps reasoning apart (its tokens may carry `reasoning`): the
    # Responses stream opens a reasoning item before the message.
    reasoning: bool | None = None


class TokenEvent(BaseModel):
    """Text the job may show now; with `logprobs`, an entry per token generated since the last
    event (only jobs that asked for them carry any); with `call_deltas`, the pieces of tool
    calls written since the last event (a call's first piece names it, the next ones carry its
    arguments as written); with `tool_calls`, the calls completed, whole (their pieces came
    first)."""

    type: Literal["token"] = "token"
    text: str
    # Reasoning written since the last event (a reasoning model's thinking, split from `text`).
    reasoning: str | None = None
    logprobs: list[TokenLogprob] | None = None
    call_deltas: list[ToolCallDelta] | None = None
    tool_calls: list[ToolCall] | None = None  # calls completed since the last event
    index: int | None = None  # the choice (n > 1); None is choice 0


class ChoiceEndEvent(BaseModel):
    """One choice of a job with several (n > 1) has ended; the job's DoneEvent follows the last."""

    type: Literal["choice_end"] = "choice_end"
    index: int
    finish_reason: FinishReason


class EmbeddingEvent(BaseModel):
    """The vector of an embedding job's input number `index`: base64 of little-endian float32."""

    type: Literal["embedding"] = "embedding"
    index: int
    data: str


class DoneEvent(BaseModel):
    type: Literal["done"] = "done"
    finish_reason: FinishReason
    usage: Usage
    # The stop string that ended the job (finish_reason "stop"), for Anthropic's `stop_sequence`.
    stop_sequence: str | None = None


class ErrorEvent(BaseModel):
    type: Literal["error"] = "error"
    status: int
    error: ErrorDetail

    @classmethod
    def from_error(cls, err: MLXQError) -> ErrorEvent:
        return cls(status=err.status, error=err.detail())


class RequeuedEvent(BaseModel):
    """The job's worker was lost; the job is back on its queue for attempt number `attempt`."""

    type: Literal["requeued"] = "requeued"
    attempt: int


class AliveEvent(BaseModel):
    """The job is still in its worker's batch: sent every ALIVE_S to each running job, so the
    API's wait between two events (MLXQ_EVENT_TIMEOUT_S) measures a worker's silence, not how
    long a prompt takes to prefill (minutes, for a 30,000-token prompt on a CPU)."""

    type: Literal["alive"] = "alive"


ALIVE_S = 20.0

Event = Annotated[
    StartedEvent
    | TokenEvent
    | ChoiceEndEvent
    | EmbeddingEvent
    | DoneEvent
    | ErrorEvent
    | RequeuedEvent
    | AliveEvent,
    Field(discriminator="type"),
]
_EVENT = TypeAdapter[Event](Event)


class EventDecodeError(GenerationError):
    """Bytes on a job channel that are not an mlxq event: a stream ends with an error frame."""

    def __init__(self, message: str):
        super().__init__(f"the worker sent an event this server cannot read: {message}")


def encode_event(event: Event) -> bytes:
    # Fields left None are left out: a plain token event stays `{"type","text"}`.
    return event.__pydantic_serializer__.to_json(event, exclude_none=True)


def decode_event(data: bytes | str) -> Event:
    try:
        return _EVENT.validate_json(data)
    except ValidationError as err:
        raise EventDecodeError(str(err)) from err


def encode_frame(lines: Iterable[tuple[str, bytes]]) -> bytes:
    """One channel message: each (job id, encoded event) on its own line, in order."""
    return b"\n".join(b"%s %s" % (job_id.encode(), data) for job_id, data in lines)


def decode_frame(message: bytes) -> Iterator[tuple[str, bytes]]:
    """The (job id, encoded event) lines of a channel message, in order."""
    for line in message.split(b"\n"):
        job_id, _, data = line.partition(b" ")
        yield job_id.decode(), data
