"""The OpenAI Agents SDK's Responses model against mlxq on the real default model: a run that
calls a function tool and goes on after it (`run_llm_again`), then a conversation continued with
`result.to_input_list()`, both of which send mlxq's own output items back as input; and a
streamed run, whose raw events carry the call's arguments as they are written."""

from __future__ import annotations

import asyncio
from typing import Any

import openai
import pytest
from agents import (
    Agent,
    ModelSettings,
    OpenAIResponsesModel,
    Runner,
    RunResult,
    function_tool,
    set_tracing_disabled,
)
from openai.types.responses import ResponseFunctionToolCall

from tests.support import MODEL

weather_calls: list[str] = []


@function_tool
def get_weather(city: str) -> str:
    """The current weather in a city."""
    weather_calls.append(city)
    return "Sunny, 21 C"


@pytest.fixture
def sdk_client(api_url: str, client: openai.OpenAI) -> openai.AsyncOpenAI:
    """The agent's client. Its connections belong to the event loop that opened them: a test
    runs in one loop and closes the client there (`async with`)."""
    return openai.AsyncOpenAI(base_url=f"{api_url}/v1", api_key="unused", timeout=120)


@pytest.fixture
def agent(sdk_client: openai.AsyncOpenAI) -> Agent[Any]:
    set_tracing_disabled(True)  # the SDK would send its traces to OpenAI
    model = OpenAIResponsesModel(model=MODEL, openai_client=sdk_client)
    return Agent(
        name="weather",
        instructions="Answer briefly.",
        model=model,
        tools=[get_weather],
        tool_use_behavior="run_llm_again",
        # The small default model rarely calls a tool by itself: the first turn is forced (the
        # SDK resets the choice once the tool ran, so the turn after it answers in text).
        model_settings=ModelSettings(tool_choice="get_weather", max_tokens=48, temperature=0),
    )


def test_a_tool_run_and_its_continuation_send_mlxqs_output_back(
    agent: Agent[Any], sdk_client: openai.AsyncOpenAI
) -> None:
    weather_calls.clear()

    async def first_then_second() -> RunResult:
        async with sdk_client:
            first = await Runner.run(agent, "What is the weather in Paris?", max_turns=4)
            assert len(weather_calls) == 1
            calls = [i.raw_item for i in first.new_items if i.type == "tool_call_item"]
            assert isinstance(calls[0], ResponseFunctionToolCall)
            assert calls[0].name == "get_weather"
            assert len(first.raw_responses) == 2  # the call, then the answer after the tool's
            assert isinstance(first.final_output, str)
            history = first.to_input_list()
            assert any(item.get("type") == "function_call_output" for item in history)
            then = [*history, {"role": "user", "content": "And in Rome?"}]
            return await Runner.run(agent, then, max_turns=4)  # type: ignore[arg-type]

    second = asyncio.run(first_then_second())
    assert len(weather_calls) == 2
    assert isinstance(second.final_output, str)
    assert len(second.raw_responses) == 2


def test_a_streamed_run_sees_the_call_arguments_as_they_are_written(
    agent: Agent[Any], sdk_client: openai.AsyncOpenAI
) -> None:
    async def run() -> list[Any]:
        async with sdk_client:
            result = Runner.run_streamed(agent, "What is the weather in Paris?", max_turns=4)
            return [e async for e in result.stream_events()]

    events = asyncio.run(run())
    raw = [e.data for e in events if e.type == "raw_response_event"]
    deltas = [d.delta for d in raw if d.type == "response.function_call_arguments.delta"]
    done = next(d for d in raw if d.type == "response.function_call_arguments.done")
    assert len(deltas) > 1 and "".join(deltas) == done.arguments
    called = [e for e in events if e.type == "run_item_stream_event" and e.name == "tool_called"]
    assert len(called) == 1
