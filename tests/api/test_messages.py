"""Anthropic's Messages API on the in-process app (the session's real Redis, a stand-in worker
that takes nothing): refusals in Anthropic's error shape naming the field, 529 where the queue
is too busy, and a message queued as the same chat job (metadata.user_id takes turns as `user`
does)."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient
from redis import Redis
from redis.client import PubSub
from werkzeug.test import TestResponse

from api import create_app
from api.http.sse import named_frame
from api.routes.anthropic.messages import frames_of
from shared.queue.config import Settings
from shared.queue.keys import Keys
from shared.wire.anthropic.message_answers import (
    ContentBlockDelta,
    ContentBlockStart,
    MessageDelta,
    MessageStream,
)
from shared.wire.chat.completions import Usage
from shared.wire.events import DoneEvent, TokenEvent
from shared.wire.generation.tools import FunctionCall, FunctionCallDelta, ToolCall, ToolCallDelta
from tests.support import CHAT, MODEL, finish_queued, rq_job, rq_queue, taken_in
from worker.ops.cluster import wait_until

MESSAGES = "/v1/messages"
HI: list[Any] = [{"role": "user", "content": "hi"}]


def message_body(**extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "max_tokens": 8, "messages": HI, **extra}


def assert_anthropic_error(
    response: TestResponse, status: int, kind: str, naming: str | None = None
) -> str:
    assert response.status_code == status, response.get_data(as_text=True)
    body = response.get_json()
    assert set(body) == {"type", "error"} and body["type"] == "error"
    assert set(body["error"]) == {"type", "message"}
    assert body["error"]["type"] == kind
    message: str = body["error"]["message"]
    if naming is not None:
        assert naming in message, message
    return message


@pytest.mark.parametrize(
    ("extra", "naming"),
    [
        ({"frobnicate": 1}, "frobnicate"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"temperature": 1.5}, "temperature"),
        ({"stop_sequences": ["a", "b", "c", "d", "e"]}, "stop_sequences"),
        ({"messages": [{"role": "user", "content": [{"type": "image"}]}]}, "messages.0.content"),
        ({"messages": [{"role": "system", "content": "x"}]}, "messages.0.role"),
        ({"messages": [*HI, {"role": "assistant", "content": "Sure"}]}, "prefill"),
        ({"tool_choice": {"type": "any"}}, "tool_choice"),
        ({"tools": [{"name": "t", "input_schema": {}, "type": "bash_20250124"}]}, "tools.0"),
        (
            {
                "tools": [{"name": "t", "input_schema": {"type": "object"}}],
                "tool_choice": {"type": "tool", "name": "u"},
            },
            "tool_choice",
        ),
        ({"output_config": {"format": {"type": "json_schema"}}}, "output_config.format"),
        ({"thinking": {"type": "enabled"}}, "thinking"),
        ({"metadata": {"user_id": "u", "other": 1}}, "metadata.other"),
        ({"container": "c"}, "container"),
    ],
)
def test_bad_input_is_a_400_in_anthropics_shape_naming_the_field(
    http: FlaskClient, extra: dict[str, Any], naming: str
) -> None:
    response = http.post(MESSAGES, json=message_body(**extra))
    assert_anthropic_error(response, 400, "invalid_request_error", naming)


def test_count_tokens_refuses_sampling_fields_by_name(http: FlaskClient) -> None:
    response = http.post(f"{MESSAGES}/count_tokens", json=message_body())
    assert_anthropic_error(response, 400, "invalid_request_error", "max_tokens")


def test_an_anthropic_version_that_is_not_a_date_is_refused(http: FlaskClient) -> None:
    response = http.post(MESSAGES, json=message_body(), headers={"anthropic-version": "latest"})
    assert_anthropic_error(response, 400, "invalid_request_error", "anthropic-version")


def test_unknown_model_and_route_are_404_not_found_errors(http: FlaskClient) -> None:
    response = http.post(MESSAGES, json=message_body(model="no-such-model"))
    assert_anthropic_error(response, 404, "not_found_error", "no-such-model")
    assert_anthropic_error(http.get(f"{MESSAGES}/nowhere"), 404, "not_found_error")


def test_the_openai_routes_keep_openais_error_shape(http: FlaskClient) -> None:
    body = http.post(CHAT, json={"model": MODEL, "messages": HI, "frobnicate": 1}).get_json()
    assert set(body) == {"error"} and body["error"]["param"] == "frobnicate"


def test_a_full_queue_and_a_queue_timeout_are_529_overloaded(
    app_settings: Settings, stand_in: tuple[Keys, PubSub]
) -> None:
    settings = app_settings.model_copy(update={"queue_cap": 1, "queue_timeout_s": 2.0})
    app: Flask = create_app(settings)
    waiting: list[TestResponse] = []
    first = threading.Thread(
        target=lambda: waiting.append(app.test_client().post(MESSAGES, json=message_body()))
    )
    first.start()
    keys, _ = stand_in
    redis = app.extensions["mlxq.broker"].redis
    wait_until(lambda: rq_queue(redis, keys.queue(MODEL)).count == 1, 5, "the first to queue")
    refused = app.test_client().post(MESSAGES, json=message_body())
    first.join(timeout=10)
    assert_anthropic_error(refused, 529, "overloaded_error")
    assert refused.headers["Retry-After"]
    assert_anthropic_error(waiting[0], 529, "overloaded_error")


def test_a_message_is_queued_as_a_chat_job_sharing_turns_by_metadata_user_id(
    impatient_http: FlaskClient, redis: Redis, stand_in: tuple[Keys, PubSub]
) -> None:
    keys, _ = stand_in
    queue = rq_queue(redis, keys.queue(MODEL))
    asks = [
        (MESSAGES, message_body(metadata={"user_id": "alice"}, stop_sequences=["\n\n"])),
        (CHAT, {"model": MODEL, "messages": HI, "user": "alice"}),
    ]
    threads = []
    for n, (path, body) in enumerate(asks, start=1):
        threads.append(
            threading.Thread(target=impatient_http.post, args=(path,), kwargs={"json": body})
        )
        threads[-1].start()
        wait_until(lambda n=n: queue.count == n, 5, "the request to be queued")  # type: ignore[misc]
    message, chat = (rq_job(redis, job_id).args[0] for job_id in queue.get_job_ids())
    finish_queued(redis, keys)
    for thread in threads:
        thread.join(timeout=10)
    assert message["job_id"].startswith("msg_")
    assert message["share"] == chat["share"] != "anonymous"
    assert message["messages"] == chat["messages"]
    assert (message["max_tokens"], message["stop"]) == (8, ["\n\n"])


def test_a_text_token_framed_fast_is_byte_for_byte_its_full_frame() -> None:
    stream = MessageStream("msg_x", MODEL)
    stream.feed(TokenEvent(text="Hello"))
    for text in (' wo"rld\n', "é\u2028", "</s>"):
        event = TokenEvent(text=text)
        assert stream.continues_text(event)
        fast = frames_of(stream, event)
        assert fast == b"".join(named_frame(e.type, e) for e in stream.feed(event))


def test_blank_text_around_a_call_opens_no_block_and_the_call_is_one_tool_use_block() -> None:
    stream = MessageStream("msg_x", MODEL)
    call = ToolCall(id="call_1", function=FunctionCall(name="add", arguments='{"a": 1}'))
    events = stream.feed(TokenEvent(text=" \n")) + stream.feed(
        TokenEvent(text="", tool_calls=[call])
    )
    usage = Usage(prompt_tokens=7, completion_tokens=3, total_tokens=10)
    events += stream.closing(DoneEvent(finish_reason="tool_calls", usage=usage))
    assert [e.type for e in events] == [
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    start, delta, _, end, _ = events
    assert isinstance(start, ContentBlockStart) and start.content_block.type == "tool_use"
    assert isinstance(delta, ContentBlockDelta) and delta.delta.type == "input_json_delta"
    assert delta.delta.partial_json == '{"a": 1}'
    assert isinstance(end, MessageDelta) and end.delta.stop_reason == "tool_use"


def test_a_call_written_in_pieces_streams_its_input_as_it_is_written() -> None:
    stream = MessageStream("msg_x", MODEL)
    pieces = [
        ToolCallDelta(
            index=0, id="call_1", type="function", function=FunctionCallDelta(name="add")
        ),
        ToolCallDelta(index=0, function=FunctionCallDelta(arguments='{"a": ')),
        ToolCallDelta(index=0, function=FunctionCallDelta(arguments="1}")),
    ]
    events = [e for piece in pieces for e in stream.feed(TokenEvent(text="", call_deltas=[piece]))]
    call = ToolCall(id="call_1", function=FunctionCall(name="add", arguments='{"a": 1}'))
    events += stream.feed(TokenEvent(text="", tool_calls=[call]))
    assert [e.type for e in events] == [
        "content_block_start",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
    ]
    start, first, second, stop = events
    assert isinstance(start, ContentBlockStart) and start.content_block.type == "tool_use"
    assert isinstance(first, ContentBlockDelta) and isinstance(second, ContentBlockDelta)
    written = [d.delta.partial_json for d in (first, second) if d.delta.type == "input_json_delta"]
    assert written == ['{"a": ', "1}"]
    assert {start.index, first.index, second.index, stop.index} == {0}


def test_a_message_batch_is_listed_apart_from_openai_batches_and_has_no_results_yet(
    http: FlaskClient, redis: Redis, stand_in: tuple[Keys, PubSub]
) -> None:
    requests = [{"custom_id": f"r{i}", "params": message_body()} for i in range(3)]
    created = http.post(f"{MESSAGES}/batches", json={"requests": requests}).get_json()
    assert created["processing_status"] == "in_progress"
    taken_in(redis, stand_in[0], created["id"])
    batch = http.get(f"{MESSAGES}/batches/{created['id']}").get_json()
    assert batch["request_counts"]["processing"] == 3
    listed = http.get(f"{MESSAGES}/batches").get_json()["data"]
    assert [b["id"] for b in listed] == [created["id"]]
    assert http.get("/v1/batches").get_json()["data"] == []
    results = http.get(f"{MESSAGES}/batches/{created['id']}/results")
    assert_anthropic_error(results, 404, "not_found_error", "not ended")
    paging = http.get(f"{MESSAGES}/batches?before_id={created['id']}")
    assert_anthropic_error(paging, 400, "invalid_request_error", "before_id")
    assert_anthropic_error(http.delete(f"{MESSAGES}/batches/msgbatch_x"), 404, "not_found_error")
