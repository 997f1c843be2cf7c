"""Anthropic's SDK, unchanged but for base_url, against the whole stack on the real model: the
Messages API (create, stream, stop reasons, tools, count_tokens, structured output, errors)."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import jsonschema
import pytest
from httpx_sse import connect_sse
from pydantic import BaseModel

from tests.support import MODEL

FRANCE: list[Any] = [{"role": "user", "content": "What is the capital of France?"}]
HAIKU: list[Any] = [{"role": "user", "content": "Write a haiku about the sea."}]
COUNT: list[Any] = [{"role": "user", "content": "Count from 1 to 20, separated by commas."}]
GREEDY = {"temperature": 0}  # the current SDK has no temperature argument; older ones send it
WEATHER_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 24}},
    "required": ["city"],
    "additionalProperties": False,
}
ADD_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
    "required": ["a", "b"],
    "additionalProperties": False,
}
TOOLS: list[Any] = [
    {
        "name": "get_weather",
        "description": "The current weather in a city",
        "input_schema": WEATHER_SCHEMA,
    },
    {"name": "add", "description": "Add two integers", "input_schema": ADD_SCHEMA},
]
SCHEMAS = {"get_weather": WEATHER_SCHEMA, "add": ADD_SCHEMA}
ASK: list[Any] = [{"role": "user", "content": "What is the weather in Paris?"}]
# A request that must call get_weather.
FORCED_WEATHER: dict[str, Any] = {
    "model": MODEL,
    "max_tokens": 64,
    "messages": ASK,
    "tools": TOOLS,
    "tool_choice": {"type": "tool", "name": "get_weather"},
    "extra_body": GREEDY,  # sampled, a 24-character city can run past max_tokens
}


@pytest.fixture(scope="module")
def claude(api_url: str, worker_process: subprocess.Popen[bytes]) -> Iterator[anthropic.Anthropic]:
    # Closed with the module: a pooled socket left to the collector raises its ResourceWarning
    # in whichever later test the collection happens to run.
    with anthropic.Anthropic(base_url=api_url, api_key="unused", max_retries=0, timeout=120) as c:
        yield c


def text_of(reply: anthropic.types.Message) -> str:
    return "".join(block.text for block in reply.content if block.type == "text")


def test_a_message_answers_and_ends_its_turn(claude: anthropic.Anthropic) -> None:
    reply = claude.messages.create(model=MODEL, max_tokens=64, messages=FRANCE, extra_body=GREEDY)
    assert reply.type == "message" and reply.role == "assistant"
    assert reply.id.startswith("msg_")
    assert reply.model == MODEL
    assert "Paris" in text_of(reply)
    assert reply.stop_reason == "end_turn" and reply.stop_sequence is None
    assert reply.usage.input_tokens + (reply.usage.cache_read_input_tokens or 0) > 0
    assert reply.usage.output_tokens > 0


def test_a_system_prompt_as_text_blocks_is_the_same_as_a_string(
    claude: anthropic.Anthropic,
) -> None:
    system = "You answer in one word."
    as_text = claude.messages.create(
        model=MODEL, max_tokens=16, system=system, messages=FRANCE, extra_body=GREEDY
    )
    as_blocks = claude.messages.create(
        model=MODEL,
        max_tokens=16,
        system=[{"type": "text", "text": system, "cache_control": {"type": "ephemeral"}}],
        messages=FRANCE,
        extra_body=GREEDY,
    )
    assert text_of(as_text) == text_of(as_blocks)


def test_the_stream_helpers_give_the_text_and_the_final_message(
    claude: anthropic.Anthropic,
) -> None:
    whole = claude.messages.create(model=MODEL, max_tokens=48, messages=HAIKU, extra_body=GREEDY)
    with claude.messages.stream(
        model=MODEL, max_tokens=48, messages=HAIKU, extra_body=GREEDY
    ) as stream:
        pieces = list(stream.text_stream)
        final = stream.get_final_message()
    assert len(pieces) > 1
    assert "".join(pieces) == text_of(whole) == text_of(final)
    assert final.stop_reason == whole.stop_reason
    assert final.usage.output_tokens == whole.usage.output_tokens
    assert final.id.startswith("msg_")


def test_the_stream_sends_anthropics_events_in_order(api_url: str, claude: object) -> None:
    body = {"model": MODEL, "max_tokens": 8, "messages": HAIKU, "stream": True, **GREEDY}
    with (
        httpx.Client(base_url=api_url, timeout=60) as http,
        connect_sse(http, "POST", "/v1/messages", json=body) as source,
    ):
        events = [(event.event, event.json()) for event in source.iter_sse()]
    names = [name for name, _ in events]
    assert all(name == data["type"] for name, data in events)
    assert names[:3] == ["message_start", "ping", "content_block_start"]
    assert set(names[3:-3]) == {"content_block_delta"}
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    delta = events[-2][1]
    assert delta["delta"] == {"stop_reason": "max_tokens", "stop_sequence": None}
    assert delta["usage"]["output_tokens"] == 8


def test_max_tokens_ends_with_the_max_tokens_stop_reason(claude: anthropic.Anthropic) -> None:
    reply = claude.messages.create(model=MODEL, max_tokens=5, messages=HAIKU, extra_body=GREEDY)
    assert reply.stop_reason == "max_tokens"
    assert reply.usage.output_tokens == 5


def test_a_stop_sequence_ends_the_message_and_is_named(claude: anthropic.Anthropic) -> None:
    free = text_of(
        claude.messages.create(model=MODEL, max_tokens=80, messages=COUNT, extra_body=GREEDY)
    )
    assert "5" in free
    reply = claude.messages.create(
        model=MODEL,
        max_tokens=80,
        messages=COUNT,
        stop_sequences=["never-written", "5"],
        extra_body=GREEDY,
    )
    assert reply.stop_reason == "stop_sequence"
    assert reply.stop_sequence == "5"
    assert text_of(reply) == free[: free.index("5")]
    with claude.messages.stream(
        model=MODEL, max_tokens=80, messages=COUNT, stop_sequences=["5"], extra_body=GREEDY
    ) as stream:
        final = stream.get_final_message()
    assert (final.stop_reason, final.stop_sequence) == ("stop_sequence", "5")


def assert_valid_uses(reply: anthropic.types.Message, name: str | None = None) -> None:
    uses = [block for block in reply.content if block.type == "tool_use"]
    assert uses, reply.content
    for use in uses:
        assert use.name == (name or use.name)
        jsonschema.validate(use.input, SCHEMAS[use.name])
    assert reply.stop_reason == "tool_use"


def test_tool_choice_any_forces_a_call_whose_input_follows_the_schema(
    claude: anthropic.Anthropic,
) -> None:
    reply = claude.messages.create(
        model=MODEL,
        max_tokens=64,
        messages=ASK,
        tools=TOOLS,
        tool_choice={"type": "any"},
        extra_body=GREEDY,  # sampled, an unbounded integer can run past max_tokens
    )
    assert_valid_uses(reply)
    assert [block.type for block in reply.content] == ["tool_use"] * len(reply.content)


def test_tool_choice_tool_forces_that_tool_once(claude: anthropic.Anthropic) -> None:
    reply = claude.messages.create(
        model=MODEL,
        max_tokens=64,
        messages=ASK,
        tools=TOOLS,
        tool_choice={"type": "tool", "name": "add", "disable_parallel_tool_use": True},
        extra_body=GREEDY,
    )
    assert_valid_uses(reply, "add")
    assert len(reply.content) == 1


def test_a_forced_call_streams_as_a_tool_use_block(claude: anthropic.Anthropic) -> None:
    with claude.messages.stream(**FORCED_WEATHER) as stream:
        pieces = [e for e in stream if e.type == "input_json"]
        final = stream.get_final_message()
    assert_valid_uses(final, "get_weather")
    assert len(pieces) > 1, "the input arrived in one piece, not as the model wrote it"


def test_a_tool_result_round_trip_is_answered(claude: anthropic.Anthropic) -> None:
    first = claude.messages.create(**FORCED_WEATHER)
    use = next(block for block in first.content if block.type == "tool_use")
    reply = claude.messages.create(
        model=MODEL,
        max_tokens=32,
        tools=TOOLS,
        messages=[
            *ASK,
            {"role": "assistant", "content": first.content},
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": use.id, "content": "Sunny, 24 C"}
                ],
            },
        ],
        extra_body=GREEDY,
    )
    assert reply.stop_reason in ("end_turn", "max_tokens", "tool_use")
    assert reply.content


def test_count_tokens_equals_the_prompt_tokens_of_the_same_request(
    claude: anthropic.Anthropic,
) -> None:
    request: dict[str, Any] = {"model": MODEL, "messages": ASK, "system": "Be brief."}
    for extra in ({}, {"tools": TOOLS}):
        counted = claude.messages.count_tokens(**request, **extra)
        reply = claude.messages.create(max_tokens=4, **request, **extra)
        usage = reply.usage
        assert counted.input_tokens == usage.input_tokens + (usage.cache_read_input_tokens or 0)
    with_tools = claude.messages.count_tokens(**request, tools=TOOLS)
    assert with_tools.input_tokens > claude.messages.count_tokens(**request).input_tokens


class City(BaseModel):
    name: str
    country: str


def test_parse_with_an_output_format_returns_the_model(claude: anthropic.Anthropic) -> None:
    reply = claude.messages.parse(
        model=MODEL,
        max_tokens=64,
        messages=[{"role": "user", "content": "Name the capital of France and its country."}],
        output_format=City,
        extra_body=GREEDY,  # sampled, the small model can run its string past max_tokens
    )
    assert isinstance(reply.parsed_output, City)


def test_thinking_and_effort_are_accepted_and_no_thinking_block_comes_back(
    claude: anthropic.Anthropic,
) -> None:
    reply = claude.messages.create(
        model=MODEL,
        max_tokens=2048,
        messages=FRANCE,
        thinking={"type": "enabled", "budget_tokens": 1024},
        output_config={"effort": "low"},
        metadata={"user_id": "someone"},
        extra_body={**GREEDY, "top_k": 1, "top_p": 0.9},
    )
    assert {block.type for block in reply.content} == {"text"}


def test_an_unknown_field_is_a_400_in_anthropics_shape_naming_it(
    claude: anthropic.Anthropic,
) -> None:
    with pytest.raises(anthropic.BadRequestError) as caught:
        claude.messages.create(
            model=MODEL, max_tokens=8, messages=FRANCE, extra_body={"frobnicate": 1}
        )
    body = caught.value.body
    assert isinstance(body, dict) and body["type"] == "error"
    assert body["error"]["type"] == "invalid_request_error"
    assert "frobnicate" in body["error"]["message"]


def test_a_bad_value_is_a_400_naming_the_field(claude: anthropic.Anthropic) -> None:
    with pytest.raises(anthropic.BadRequestError) as caught:
        claude.messages.create(model=MODEL, max_tokens=0, messages=FRANCE)
    assert "max_tokens" in caught.value.message


def test_an_unknown_model_is_a_404_not_found_error(claude: anthropic.Anthropic) -> None:
    with pytest.raises(anthropic.NotFoundError) as caught:
        claude.messages.create(model="no-such-model", max_tokens=8, messages=FRANCE)
    body = caught.value.body
    assert isinstance(body, dict)
    assert body["error"]["type"] == "not_found_error"
    with pytest.raises(anthropic.NotFoundError):
        claude.messages.count_tokens(model="no-such-model", messages=FRANCE)
