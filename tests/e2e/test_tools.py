"""Tool calling through the OpenAI SDK on the real model (whose template knows no tools, so
the fallback rendering is used): forced calls always parse and validate, and streamed calls
arrive as `delta.tool_calls`."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field

from tests.support import MODEL, chat_line, lines_of, start_batch, wait_batch

WEATHER_PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 24}},
    "required": ["city"],
    "additionalProperties": False,
}
ADD_PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
    "required": ["a", "b"],
    "additionalProperties": False,
}
TOOLS: list[Any] = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The current weather in a city",
            "parameters": WEATHER_PARAMETERS,
        },
    },
    {"type": "function", "function": {"name": "add", "parameters": ADD_PARAMETERS}},
]
PARAMETERS = {"get_weather": WEATHER_PARAMETERS, "add": ADD_PARAMETERS}
ASK: list[Any] = [{"role": "user", "content": "What is the weather in Paris?"}]


def assert_valid_calls(calls: list[Any]) -> None:
    assert calls
    for call in calls:
        assert call.id.startswith("call_") and call.type == "function"
        jsonschema.validate(json.loads(call.function.arguments), PARAMETERS[call.function.name])


def test_required_tool_choice_always_gives_a_valid_call(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(
        model=MODEL, messages=ASK, tools=TOOLS, tool_choice="required", temperature=0, max_tokens=80
    )
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    assert_valid_calls(choice.message.tool_calls or [])


def streamed_calls(stream: Any) -> dict[int, list[Any]]:
    """A chat stream's `delta.tool_calls`, by call index; it must end with finish "tool_calls"."""
    chunks = [c for c in stream if c.choices]
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    by_call: dict[int, list[Any]] = {}
    for chunk in chunks:
        for delta in chunk.choices[0].delta.tool_calls or []:
            by_call.setdefault(delta.index, []).append(delta)
    return by_call


@pytest.mark.parametrize(
    "tool_choice", ["required", {"type": "function", "function": {"name": "add"}}]
)
def test_forced_call_arguments_stream_as_written_and_join_to_the_whole_call(
    client: openai.OpenAI, tool_choice: Any
) -> None:
    asked: dict[str, Any] = {
        "model": MODEL,
        "messages": ASK,
        "tools": TOOLS,
        "tool_choice": tool_choice,
        "parallel_tool_calls": False,
        "temperature": 0,
        "max_tokens": 80,
    }
    whole = (client.chat.completions.create(**asked).choices[0].message.tool_calls or [])[0]
    pieces = streamed_calls(client.chat.completions.create(**asked, stream=True))[0]
    first, rest = pieces[0], pieces[1:]
    assert first.id.startswith("call_") and first.type == "function"
    assert first.function.name == whole.function.name
    assert all(p.id is None and p.function.name is None for p in rest)
    arguments = [p.function.arguments for p in pieces]
    assert len([a for a in arguments if a]) > 1
    assert "".join(arguments) == whole.function.arguments
    jsonschema.validate(json.loads("".join(arguments)), PARAMETERS[whole.function.name])


def test_parallel_tool_calls_false_gives_exactly_one_call(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(
        model=MODEL,
        messages=ASK,
        tools=TOOLS,
        tool_choice="required",
        parallel_tool_calls=False,
        temperature=1.0,
        seed=11,
        max_tokens=120,
    )
    assert len(reply.choices[0].message.tool_calls or []) == 1


def test_tool_choice_none_answers_in_text(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(
        model=MODEL, messages=ASK, tools=TOOLS, tool_choice="none", temperature=0, max_tokens=16
    )
    assert reply.choices[0].message.tool_calls is None
    assert reply.choices[0].message.content
    assert reply.choices[0].finish_reason in ("stop", "length")


def test_earlier_calls_and_tool_results_are_accepted_as_input(client: openai.OpenAI) -> None:
    first = client.chat.completions.create(
        model=MODEL, messages=ASK, tools=TOOLS, tool_choice="required", temperature=0, max_tokens=80
    )
    call = (first.choices[0].message.tool_calls or [])[0]
    history: list[Any] = [
        *ASK,
        first.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "Sunny, 21 C"},
    ]
    reply = client.chat.completions.create(
        model=MODEL, messages=history, tools=TOOLS, temperature=0, max_tokens=24
    )
    assert reply.choices[0].finish_reason in ("stop", "length", "tool_calls")
    assert reply.usage is not None and reply.usage.prompt_tokens > first.usage.prompt_tokens  # type: ignore[union-attr]


def test_a_batch_line_with_tools_answers_with_tool_calls(client: openai.OpenAI) -> None:
    line = chat_line(
        "t", ASK[0]["content"], tools=TOOLS, tool_choice="required", temperature=0, max_tokens=80
    )
    batch = wait_batch(client, start_batch(client, [line]).id)
    body = lines_of(client, batch.output_file_id)[0]["response"]["body"]
    assert body["choices"][0]["finish_reason"] == "tool_calls"
    call = body["choices"][0]["message"]["tool_calls"][0]
    jsonschema.validate(
        json.loads(call["function"]["arguments"]), PARAMETERS[call["function"]["name"]]
    )


RESPONSE_TOOLS: list[Any] = [
    {
        "type": "function",
        "name": "get_weather",
        "description": "The current weather in a city",
        "parameters": WEATHER_PARAMETERS,
    }
]


def test_responses_function_tools_give_function_call_items(client: openai.OpenAI) -> None:
    response = client.responses.create(
        model=MODEL,
        input="What is the weather in Paris?",
        tools=RESPONSE_TOOLS,
        tool_choice="required",
        temperature=0,
        max_output_tokens=80,
    )
    calls = [item for item in response.output if item.type == "function_call"]
    assert len(calls) >= 1
    call = calls[0]
    assert call.name == "get_weather" and call.call_id.startswith("call_")  # type: ignore[union-attr]
    jsonschema.validate(json.loads(call.arguments), WEATHER_PARAMETERS)  # type: ignore[union-attr]
    follow = client.responses.create(
        model=MODEL,
        input=[
            {"role": "user", "content": "What is the weather in Paris?"},
            call.model_dump(exclude_none=True),  # type: ignore[list-item]
            {"type": "function_call_output", "call_id": call.call_id, "output": "Sunny, 21 C"},  # type: ignore[union-attr]
        ],
        tools=RESPONSE_TOOLS,
        temperature=0,
        max_output_tokens=16,
    )
    assert follow.status in ("completed", "incomplete")


def test_responses_stream_sends_function_call_arguments(client: openai.OpenAI) -> None:
    stream = client.responses.create(
        model=MODEL,
        input="What is the weather in Paris?",
        tools=RESPONSE_TOOLS,
        tool_choice={"type": "function", "name": "get_weather"},
        temperature=0,
        max_output_tokens=80,
        stream=True,
    )
    events = list(stream)
    kinds = [e.type for e in events]
    assert "response.function_call_arguments.done" in kinds
    done = next(e for e in events if e.type == "response.function_call_arguments.done")
    jsonschema.validate(json.loads(done.arguments), WEATHER_PARAMETERS)  # type: ignore[union-attr]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    final = events[-1].response  # type: ignore[union-attr]
    assert any(item.type == "function_call" for item in final.output)


def test_responses_stream_function_call_arguments_as_they_are_written(
    client: openai.OpenAI,
) -> None:
    asked: dict[str, Any] = {
        "model": MODEL,
        "input": "What is the weather in Paris?",
        "tools": RESPONSE_TOOLS,
        "tool_choice": "required",
        "parallel_tool_calls": False,
        "temperature": 0,
        "max_output_tokens": 80,
    }
    whole = next(i for i in client.responses.create(**asked).output if i.type == "function_call")
    events = list(client.responses.create(**asked, stream=True))
    added = next(e for e in events if e.type == "response.output_item.added" and e.output_index)
    assert added.item.type == "function_call" and added.item.name == "get_weather"  # type: ignore[union-attr]
    kinds = [e.type for e in events if e.type.startswith("response.function_call_arguments")]
    assert kinds[-1] == "response.function_call_arguments.done" and len(kinds) > 2
    deltas = [e for e in events if e.type == "response.function_call_arguments.delta"]
    assert {e.item_id for e in deltas} == {added.item.id}  # type: ignore[union-attr]
    done = next(e for e in events if e.type == "response.function_call_arguments.done")
    joined = "".join(e.delta for e in deltas)  # type: ignore[union-attr]
    assert joined == done.arguments == whole.arguments  # type: ignore[union-attr]
    jsonschema.validate(json.loads(joined), WEATHER_PARAMETERS)
    assert events.index(added) < events.index(deltas[0])


def test_every_output_item_replayed_as_input_is_accepted_and_changes_nothing(
    client: openai.OpenAI,
) -> None:
    ask: list[Any] = [{"role": "user", "content": "What is the weather in Paris?"}]
    # Greedy, so the text the model writes before its call (which `minimal` leaves out) is
    # the same on every run; sampled, it was sometimes not empty.
    calling = client.responses.create(
        model=MODEL,
        input=ask,
        tools=RESPONSE_TOOLS,
        tool_choice="required",
        temperature=0,
        max_output_tokens=80,
    )
    kinds = [item.type for item in calling.output]
    assert kinds[0] == "message" and "function_call" in kinds
    call = next(item for item in calling.output if item.type == "function_call")
    result = {"type": "function_call_output", "call_id": call.call_id, "output": "Sunny, 21 C"}
    answered = client.responses.create(
        model=MODEL,
        input=[*ask, *calling.output, result],  # the output items as the SDK parsed them
        tools=RESPONSE_TOOLS,
        max_output_tokens=24,
        temperature=0,  # sampled, it may call the tool again: its first item must be a message
    )
    bare = {"type": "function_call", "call_id": call.call_id, "name": call.name}  # type: ignore[union-attr]
    minimal = client.responses.create(
        model=MODEL,
        input=[*ask, {**bare, "arguments": call.arguments}, result],  # type: ignore[union-attr]
        tools=RESPONSE_TOOLS,
        max_output_tokens=1,
    )
    assert answered.usage is not None and minimal.usage is not None
    assert answered.usage.input_tokens == minimal.usage.input_tokens
    message = answered.output[0]
    assert message.type == "message" and message.content[0].logprobs == []  # type: ignore[union-attr]
    going_on = client.responses.create(
        model=MODEL,
        input=[*ask, *calling.output, result, *answered.output, {"role": "user", "content": "Ok"}],
        max_output_tokens=4,
    )
    assert going_on.status in ("completed", "incomplete")


def test_a_field_no_input_item_has_is_refused_by_name(client: openai.OpenAI) -> None:
    part = {"type": "output_text", "text": "Hi", "annotations": [], "logprobs": [], "score": 1}
    replayed = {"type": "message", "role": "assistant", "id": "msg_1", "content": [part]}
    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.create(model=MODEL, input=[*ASK, replayed], max_output_tokens=4)  # type: ignore[list-item]
    assert "input.1.message.content.0.score" in str(caught.value)


class Weather(BaseModel):
    """The current weather in a city."""

    city: str = Field(max_length=24)
    celsius: int


def test_the_sdk_parses_a_streamed_call_partially_as_it_is_written(client: openai.OpenAI) -> None:
    """What instructor's create_partial and UIs that show a call being written rely on: the
    OpenAI SDK's stream helper parses the arguments so far after each delta (jiter's partial
    mode), then validates the whole call into the tool's model."""
    with client.chat.completions.stream(
        model=MODEL,
        messages=[{"role": "user", "content": "What is the weather in Paris?"}],
        tools=[openai.pydantic_function_tool(Weather)],
        tool_choice={"type": "function", "function": {"name": "Weather"}},
        temperature=0,
        max_tokens=80,
    ) as stream:
        events = list(stream)
    partial = [
        e.parsed_arguments for e in events if e.type == "tool_calls.function.arguments.delta"
    ]
    distinct = [p for i, p in enumerate(partial) if p and p not in partial[:i]]
    assert len(distinct) > 2, partial
    done = next(e for e in events if e.type == "tool_calls.function.arguments.done")
    assert isinstance(done.parsed_arguments, Weather)
    assert distinct[-1] == done.parsed_arguments.model_dump()
