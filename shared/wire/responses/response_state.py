"""A response's state, derived without I/O from its job's events: nothing about it is stored.

The inputs: the job's event log (shared/wire/events.py: StartedEvent, TokenEvent..., DoneEvent or
ErrorEvent), the record the API stores at creation (`StoredResponse`), its cancelled flag and,
while the log holds no final event, what the queue says of the job (`JobView`). The text so far
is the joined TokenEvents; usage comes from the DoneEvent. `Progress` folds the events; `derive`
picks the status (cancelled stays final; then the events; then the queue); `render` turns it
into the OpenAI response object. `finish_reason` "length" (max_output_tokens or the context
window) makes a response `incomplete` with reason `max_output_tokens`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from shared.wire.chat.answers import Transcript
from shared.wire.errors import ErrorDetail
from shared.wire.events import (
    DoneEvent,
    ErrorEvent,
    Event,
    RequeuedEvent,
    StartedEvent,
    TokenEvent,
)
from shared.wire.generation.tools import ToolCall
from shared.wire.responses.reasoning_blob import encode_reasoning_blob
from shared.wire.responses.response_items import (
    FunctionCallItem,
    ItemStatus,
    ReasoningItem,
    ReasoningText,
)
from shared.wire.responses.responses import (
    IncompleteDetails,
    OutputMessage,
    OutputText,
    ResponseError,
    ResponseObject,
    ResponseStatus,
    ResponseUsage,
    StoredResponse,
    TextConfig,
)


@dataclass
class Progress:
    """A response's job events folded: whether it started, its text so far, how it ended."""

    started: bool = False
    parts: list[str] = field(default_factory=list)
    calls: list[ToolCall] = field(default_factory=list)
    done: DoneEvent | None = None
    error: ErrorDetail | None = None
    # The reasoning so far, for a job whose model keeps it apart (None: no reasoning item).
    reasoning: list[str] | None = None

    @classmethod
    def finished(cls, got: Transcript, done: DoneEvent) -> Progress:
        """A job that ran to its end, from what it produced (a response's one choice)."""
        reasoning = None if got.reasoning is None else [got.reasoning]
        return cls(True, [got.text], list(got.tool_calls), done, reasoning=reasoning)

    @classmethod
    def of(cls, events: list[Event]) -> Progress:
        progress = cls()
        for event in events:
            progress.feed(event)
        return progress

    def feed(self, event: Event) -> None:
        match event:
            case StartedEvent(reasoning=reasoning):
                self.started = True
                if reasoning:
                    self.reasoning = []
            case TokenEvent(text=text, tool_calls=calls, reasoning=reasoning):
                self.parts.append(text)
                self.calls.extend(calls or [])
                if reasoning:
                    if self.reasoning is None:
                        self.reasoning = []
                    self.reasoning.append(reasoning)
            case DoneEvent():
                self.done = event
            case ErrorEvent(error=error):
                self.error = error
            case RequeuedEvent():
                # The worker was lost and the job runs again from scratch: the earlier
                # attempt's partial text is dropped.
                self.started = False
                self.parts.clear()
                self.calls.clear()
                self.done = None
                self.error = None
                self.reasoning = None

    @property
    def final(self) -> bool:
        return self.done is not None or self.error is not None

    def text(self) -> str:
        return "".join(self.parts)

    @property
    def first_index(self) -> int:
        """The message's place among the output items: after the reasoning item, if any."""
        return 0 if self.reasoning is None else 1

    def status(self) -> ResponseStatus:
        """The status the events alone give (queued: no event yet)."""
        if self.done is not None:
            return "incomplete" if self.done.finish_reason == "length" else "completed"
        if self.error is not None:
            return "failed"
        return "in_progress" if self.started else "queued"


@dataclass(frozen=True)
class JobView:
    """What the queue says of a job whose events hold no final event yet.

    `state`: queued, started, ended (RQ finished it: `outcome` is its finish_reason), failed,
    or gone (no RQ record: expired or lost).
    """

    state: Literal["queued", "started", "ended", "failed", "gone"]
    position: int | None = None
    outcome: str | None = None


def lost_error() -> ErrorDetail:
    return ErrorDetail(
        message="The job ended without a result (its worker was lost).",
        type="server_error",
        code="server_error",
    )


def derive(
    stored: StoredResponse, progress: Progress, cancelled: bool, job: JobView | None
) -> ResponseObject:
    """The response object now: cancelled stays final; else the events; else the queue."""
    status = progress.status()
    position = None
    if cancelled:
        status = "cancelled"
    elif status in ("queued", "in_progress") and job is not None:
        if job.state == "ended" and job.outcome == "cancelled":
            status = "cancelled"
        elif job.state in ("ended", "failed", "gone"):
            progress.error = progress.error or lost_error()
            status = "failed"
        elif job.state == "started":
            status = "in_progress"
        elif status == "queued":
            position = job.position
    return render(stored, progress, status, position)


def call_item(call: ToolCall, status: Literal["in_progress", "completed"]) -> FunctionCallItem:
    """A call the model made (or is making), as the Responses API's function_call output item."""
    return FunctionCallItem(
        id="fc_" + call.id.removeprefix("call_"),
        call_id=call.id,
        name=call.function.name,
        arguments=call.function.arguments,
        status=status,
    )


def reasoning_item(stored: StoredResponse, text: str, status: ItemStatus) -> ReasoningItem:
    """The reasoning as the Responses API's reasoning item. With `include:
    ["reasoning.encrypted_content"]`, its `encrypted_content` carries the text back when a client
    passes the item in again (shared/wire/responses/reasoning_blob.py), as Codex does with `store:
    false`."""
    wanted = "reasoning.encrypted_content" in (stored.request.include or [])
    return ReasoningItem(
        id=stored.reasoning_id(),
        content=[ReasoningText(text=text)],
        encrypted_content=encode_reasoning_blob(text) if wanted else None,
        status=status,
    )


def render(
    stored: StoredResponse,
    progress: Progress,
    status: ResponseStatus,
    queue_position: int | None = None,
) -> ResponseObject:
    req = stored.request
    output: list[ReasoningItem | OutputMessage | FunctionCallItem] = []
    if progress.started:
        item_status: ItemStatus = (
            "completed"
            if status == "completed"
            else ("in_progress" if status == "in_progress" else "incomplete")
        )
        if progress.reasoning is not None:
            thought = "".join(progress.reasoning)
            output.append(reasoning_item(stored, thought, item_status))
        content = [OutputText(text=progress.text())]
        output.append(OutputMessage(id=stored.item_id(), status=item_status, content=content))
        output.extend(call_item(call, "completed") for call in progress.calls)
    error = progress.error if status == "failed" else None
    return ResponseObject(
        id=stored.id,
        created_at=stored.created_at,
        status=status,
        background=stored.background,
        error=ResponseError(code=error.code or "server_error", message=error.message)
        if error
        else None,
        incomplete_details=IncompleteDetails(reason="max_output_tokens")
        if status == "incomplete"
        else None,
        instructions=req.instructions,
        max_output_tokens=req.max_output_tokens,
        model=req.model,
        output=output,
        store=req.store,
        temperature=req.temperature,
        text=req.text or TextConfig(),
        tools=req.tools or [],
        tool_choice=req.tool_choice or "auto",
        parallel_tool_calls=req.parallel_tool_calls is not False and bool(req.tools),
        top_p=req.top_p,
        reasoning=req.reasoning,
        usage=ResponseUsage.of(progress.done.usage) if progress.done else None,
        user=req.user,
        metadata=req.metadata or {},
        queue_position=queue_position,
    )
