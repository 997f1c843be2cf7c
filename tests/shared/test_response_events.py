"""Responses stream events are numbered from the job's events alone, so a resumed stream numbers
every event as the original did; the derived response object follows the same events."""

from __future__ import annotations

from shared.wire.chat.completions import Usage
from shared.wire.errors import ErrorDetail
from shared.wire.events import DoneEvent, ErrorEvent, Event, StartedEvent, TokenEvent
from shared.wire.generation.tools import FunctionCall, FunctionCallDelta, ToolCall, ToolCallDelta
from shared.wire.responses.response_events import ResponseStream
from shared.wire.responses.response_state import JobView, Progress, derive
from shared.wire.responses.responses import ResponsesRequest, StoredResponse

USAGE = Usage(prompt_tokens=5, completion_tokens=3, total_tokens=8)
EVENTS: list[Event] = [
    StartedEvent(prompt_tokens=5),
    TokenEvent(text="Hello"),
    TokenEvent(text=" there"),
    DoneEvent(finish_reason="stop", usage=USAGE),
]


def stored(background: bool) -> StoredResponse:
    request = ResponsesRequest(model="m", input="hi", background=background)
    return StoredResponse(id="resp_1", created_at=1, background=background, request=request)


def all_events(record: StoredResponse, events: list[Event]) -> list[dict[str, object]]:
    stream = ResponseStream(record)
    out = stream.opening()
    for event in events:
        out.extend(stream.feed(event))
    return [e.model_dump(mode="json") for e in out]


def test_events_are_numbered_from_zero_without_gaps_in_openai_order() -> None:
    events = all_events(stored(background=False), EVENTS)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert [e["type"] for e in events] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    completed = events[-1]["response"]
    assert isinstance(completed, dict)
    assert completed["output"][0]["content"][0]["text"] == "Hello there"
    assert completed["usage"]["output_tokens"] == 3


def test_a_background_stream_opens_queued_and_numbers_the_rest_the_same_way() -> None:
    events = all_events(stored(background=True), EVENTS)
    assert [e["type"] for e in events[:2]] == ["response.created", "response.queued"]
    assert events[0]["response"]["status"] == "queued"  # type: ignore[index]
    # Numbering is a function of the log: any process, any time, gives the same events.
    assert all_events(stored(background=True), EVENTS) == events


def test_length_makes_the_response_incomplete() -> None:
    done = DoneEvent(finish_reason="length", usage=USAGE)
    events = all_events(stored(background=False), [*EVENTS[:3], done])
    assert events[-1]["type"] == "response.incomplete"
    assert events[-1]["response"]["incomplete_details"] == {"reason": "max_output_tokens"}  # type: ignore[index]


def test_derive_prefers_cancelled_then_events_then_the_queue() -> None:
    record = stored(background=True)
    queued = derive(record, Progress(), False, JobView("queued", position=3))
    assert (queued.status, queued.queue_position) == ("queued", 3)
    assert "queue_position" not in derive(record, Progress.of(EVENTS), False, None).model_dump()
    running = derive(record, Progress.of(EVENTS[:2]), False, JobView("started"))
    assert (running.status, running.output_text()) == ("in_progress", "Hello")
    assert derive(record, Progress.of(EVENTS[:2]), True, None).status == "cancelled"
    assert derive(record, Progress(), False, JobView("gone")).status == "failed"
    error = ErrorEvent(status=400, error=ErrorDetail(message="too long", type="x", code="c"))
    failed = derive(record, Progress.of([error]), False, None)
    assert failed.status == "failed" and failed.error is not None and failed.error.code == "c"


def test_a_call_streams_as_an_item_whose_arguments_arrive_in_pieces() -> None:
    call = ToolCall(id="call_7", function=FunctionCall(name="add", arguments='{"a": 1}'))
    named = FunctionCallDelta(name="add", arguments="")
    pieces = [
        TokenEvent(text="", call_deltas=[ToolCallDelta(index=0, id="call_7", function=named)]),
        *(
            TokenEvent(text="", call_deltas=[ToolCallDelta(index=0, function=more)])
            for more in (FunctionCallDelta(arguments='{"a"'), FunctionCallDelta(arguments=": 1}"))
        ),
        TokenEvent(text="", tool_calls=[call]),
    ]
    done = DoneEvent(finish_reason="tool_calls", usage=USAGE)
    events = all_events(stored(background=False), [StartedEvent(prompt_tokens=5), *pieces, done])
    calls = [e for e in events if e.get("output_index") == 1]
    assert [e["type"] for e in calls] == [
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
    ]
    assert {e["item_id"] for e in calls[1:4]} == {calls[0]["item"]["id"]}  # type: ignore[index]
    assert "".join(str(e["delta"]) for e in calls[1:3]) == calls[3]["arguments"] == '{"a": 1}'
    assert calls[-1]["item"]["arguments"] == '{"a": 1}'  # type: ignore[index]
    assert not any(e["type"] == "response.output_text.delta" for e in events)
