"""The Responses API's stream events, numbered deterministically from a job's events.

`ResponseStream` turns a response's job events (shared/wire/events.py) into OpenAI's stream events,
each with its `sequence_number`. The numbering depends only on the stored record and the job's
event log, so a stream resumed from any API process (`starting_after=N`) numbers every event
exactly as the original stream did:

    opening       response.created (+ response.queued for a background response)
    StartedEvent  response.in_progress, response.output_item.added, response.content_part.added;
                  for a model that reasons, first a reasoning item (output_index 0, the message
                  then at 1): response.output_item.added
    TokenEvent    response.reasoning_text.delta (its reasoning), closed when text, a call or
                  the end comes (response.reasoning_text.done, response.output_item.done);
                  response.output_text.delta (when it has text); for a tool call it began, a
                  function_call item (after the message): response.output_item.added; for
                  each piece of a call's arguments, response.function_call_arguments.delta; for
                  a call it completed, response.function_call_arguments.done and
                  response.output_item.done
    DoneEvent     response.output_text.done, response.content_part.done,
                  response.output_item.done, response.completed (or response.incomplete)
    ErrorEvent    response.failed
    RequeuedEvent response.queued (its worker was lost: the job runs again from scratch, and
                  the earlier attempt's text is dropped; the log starts over with this event,
                  so a stream resumed after it numbers from the new attempt)

A cancelled response's stream simply ends: OpenAI defines no event for it.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    Field,
    RootModel,
    SerializerFunctionWrapHandler,
    model_serializer,
)

from shared.wire.events import (
    DoneEvent,
    ErrorEvent,
    Event,
    RequeuedEvent,
    StartedEvent,
    TokenEvent,
)
from shared.wire.generation.tools import FunctionCall, ToolCall, ToolCallDelta
from shared.wire.responses.response_items import FunctionCallItem, ItemStatus, ReasoningItem
from shared.wire.responses.response_state import Progress, call_item, reasoning_item, render
from shared.wire.responses.responses import (
    OutputMessage,
    OutputText,
    ResponseObject,
    ResponseStatus,
    StoredResponse,
)


class LifecycleEvent(BaseModel):
    type: Literal[
        "response.created",
        "response.queued",
        "response.in_progress",
        "response.completed",
        "response.incomplete",
        "response.failed",
    ]
    response: ResponseObject
    sequence_number: int


class OutputItemEvent(BaseModel):
    type: Literal["response.output_item.added", "response.output_item.done"]
    output_index: int = 0
    item: ReasoningItem | OutputMessage | FunctionCallItem
    sequence_number: int


class PieceOrWhole(BaseModel):
    """An event that carries a piece of something as it is written (`delta`) or all of it once
    it is done: whichever of the two it does not carry is left out, as OpenAI does."""

    delta: str | None = None

    @model_serializer(mode="wrap")
    def _one_of_the_two(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        return {k: v for k, v in data.items() if v is not None or k not in _PIECE_OR_WHOLE}


_PIECE_OR_WHOLE = frozenset({"delta", "text", "arguments"})


class ReasoningTextEvent(PieceOrWhole):
    """A piece of the reasoning as it is written (`delta`), or all of it once it ends (`text`)."""

    type: Literal["response.reasoning_text.delta", "response.reasoning_text.done"]
    item_id: str
    output_index: int = 0
    content_index: int = 0
    text: str | None = None
    sequence_number: int


class ArgumentsEvent(PieceOrWhole):
    """A piece of a function call's arguments as they are written (`delta`), or all of them
    once the call is complete (`arguments`)."""

    type: Literal["response.function_call_arguments.delta", "response.function_call_arguments.done"]
    item_id: str
    output_index: int
    arguments: str | None = None
    sequence_number: int


class ContentPartEvent(BaseModel):
    type: Literal["response.content_part.added", "response.content_part.done"]
    item_id: str
    output_index: int = 0
    content_index: int = 0
    part: OutputText
    sequence_number: int


class TextDeltaEvent(BaseModel):
    type: Literal["response.output_text.delta"] = "response.output_text.delta"
    item_id: str
    output_index: int = 0
    content_index: int = 0
    delta: str
    logprobs: list[Any] = []
    sequence_number: int


class TextDoneEvent(BaseModel):
    type: Literal["response.output_text.done"] = "response.output_text.done"
    item_id: str
    output_index: int = 0
    content_index: int = 0
    text: str
    logprobs: list[Any] = []
    sequence_number: int


StreamEvent = Annotated[
    LifecycleEvent
    | OutputItemEvent
    | ReasoningTextEvent
    | ArgumentsEvent
    | ContentPartEvent
    | TextDeltaEvent
    | TextDoneEvent,
    Field(discriminator="type"),
]


class ResponseStreamEvent(RootModel[StreamEvent]):
    """Any one of the stream's events (the `data:` of each frame, for /openapi.json)."""


class ResponseStream:
    """One response's stream events, from its opening through each of its job's events."""

    def __init__(self, stored: StoredResponse):
        self._stored = stored
        self._item_id = stored.item_id()
        self.progress = Progress()
        self._seq = -1
        self._call_item_ids: dict[int, str] = {}  # by call index: the items of calls begun
        self._reasoning_open = False  # the reasoning item is open (its model reasons)

    def _next(self) -> int:
        self._seq += 1
        return self._seq

    def _lifecycle(self, kind: Any, status: ResponseStatus) -> LifecycleEvent:
        snapshot = render(self._stored, self.progress, status)
        return LifecycleEvent(type=kind, response=snapshot, sequence_number=self._next())

    def opening(self) -> list[StreamEvent]:
        if not self._stored.background:
            return [self._lifecycle("response.created", "in_progress")]
        return [
            self._lifecycle("response.created", "queued"),
            self._lifecycle("response.queued", "queued"),
        ]

    def feed(self, event: Event) -> list[StreamEvent]:
        self.progress.feed(event)
        match event:
            case StartedEvent():
                return self._started()
            case TokenEvent(text=text, call_deltas=deltas, tool_calls=calls, reasoning=reasoning):
                found = self._reasoning(reasoning) if reasoning else []
                if text or deltas or calls:
                    found += self._close_reasoning()
                if text:
                    found.append(
                        TextDeltaEvent(
                            item_id=self._item_id,
                            output_index=self.progress.first_index,
                            delta=text,
                            sequence_number=self._next(),
                        )
                    )
                found += [e for piece in deltas or [] for e in self._call_piece(piece)]
                return found + self._calls(calls or [])
            case DoneEvent():
                return self._done()
            case ErrorEvent():
                return [self._lifecycle("response.failed", "failed")]
            case RequeuedEvent():
                # Its worker was lost: queued again, the text so far dropped; it starts over.
                return [self._lifecycle("response.queued", "queued")]
        return []

    def _call_piece(self, piece: ToolCallDelta) -> list[StreamEvent]:
        """A piece of a call being written: a call's first one opens its function_call item
        (after the message, at output_index 0), and each piece's arguments are a delta."""
        index = self.progress.first_index + 1 + piece.index
        found: list[StreamEvent] = []
        if piece.id is not None:
            begun = FunctionCall(name=piece.function.name or "", arguments="")
            call = ToolCall(id=piece.id, function=begun)
            item = call_item(call, "in_progress")
            self._call_item_ids[piece.index] = item.id or ""
            found.append(
                OutputItemEvent(
                    type="response.output_item.added",
                    output_index=index,
                    item=item,
                    sequence_number=self._next(),
                )
            )
        if piece.function.arguments:
            found.append(
                ArgumentsEvent(
                    type="response.function_call_arguments.delta",
                    item_id=self._call_item_ids[piece.index],
                    output_index=index,
                    delta=piece.function.arguments,
                    sequence_number=self._next(),
                )
            )
        return found

    def _calls(self, calls: list[ToolCall]) -> list[StreamEvent]:
        """Each call the model completed (its item and arguments were sent as it was written)."""
        found: list[StreamEvent] = []
        earlier = len(self.progress.calls) - len(calls)  # progress has taken these in already
        for j, call in enumerate(calls):
            index = self.progress.first_index + 1 + earlier + j
            item = call_item(call, "completed")
            found += [
                ArgumentsEvent(
                    type="response.function_call_arguments.done",
                    item_id=item.id or "",
                    output_index=index,
                    arguments=call.function.arguments,
                    sequence_number=self._next(),
                ),
                OutputItemEvent(
                    type="response.output_item.done",
                    output_index=index,
                    item=item,
                    sequence_number=self._next(),
                ),
            ]
        return found

    def _started(self) -> list[StreamEvent]:
        item = OutputMessage(id=self._item_id, status="in_progress", content=[])
        index = self.progress.first_index
        found: list[StreamEvent] = [self._lifecycle("response.in_progress", "in_progress")]
        if self.progress.reasoning is not None:
            self._reasoning_open = True
            thought = ReasoningItem(id=self._stored.reasoning_id(), status="in_progress")
            found.append(
                OutputItemEvent(
                    type="response.output_item.added", item=thought, sequence_number=self._next()
                )
            )
        return [
            *found,
            OutputItemEvent(
                type="response.output_item.added",
                output_index=index,
                item=item,
                sequence_number=self._next(),
            ),
            ContentPartEvent(
                type="response.content_part.added",
                item_id=self._item_id,
                output_index=index,
                part=OutputText(text=""),
                sequence_number=self._next(),
            ),
        ]

    def _reasoning(self, reasoning: str) -> list[StreamEvent]:
        if not self._reasoning_open:
            return []  # reasoning after the answer began: kept in the item, not streamed
        delta = ReasoningTextEvent(
            type="response.reasoning_text.delta",
            item_id=self._stored.reasoning_id(),
            delta=reasoning,
            sequence_number=self._next(),
        )
        return [delta]

    def _close_reasoning(self, status: ItemStatus = "completed") -> list[StreamEvent]:
        if not self._reasoning_open:
            return []
        self._reasoning_open = False
        text = "".join(self.progress.reasoning or [])
        item = reasoning_item(self._stored, text, status)
        return [
            ReasoningTextEvent(
                type="response.reasoning_text.done",
                item_id=item.id or "",
                text=text,
                sequence_number=self._next(),
            ),
            OutputItemEvent(
                type="response.output_item.done", item=item, sequence_number=self._next()
            ),
        ]

    def _done(self) -> list[StreamEvent]:
        status = self.progress.status()
        text = self.progress.text()
        item_status: Literal["completed", "incomplete"] = (
            "completed" if status == "completed" else "incomplete"
        )
        item = OutputMessage(id=self._item_id, status=item_status, content=[OutputText(text=text)])
        kind = "response.completed" if status == "completed" else "response.incomplete"
        index = self.progress.first_index
        return [
            *self._close_reasoning(item_status),
            TextDoneEvent(
                item_id=self._item_id,
                output_index=index,
                text=text,
                sequence_number=self._next(),
            ),
            ContentPartEvent(
                type="response.content_part.done",
                item_id=self._item_id,
                output_index=index,
                part=OutputText(text=text),
                sequence_number=self._next(),
            ),
            OutputItemEvent(
                type="response.output_item.done",
                output_index=index,
                item=item,
                sequence_number=self._next(),
            ),
            self._lifecycle(kind, status),
        ]
