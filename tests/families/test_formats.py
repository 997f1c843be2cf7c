"""Each family's output format through the whole stack: scripted models on the families' real
vocabularies (tests/families/scripted.py), served by real workers, read through the OpenAI,
Anthropic and Agents SDKs, streamed and not. Reasoning and content come apart exactly, tool
calls are parsed, `finish_reason` is the family's, and no end token or marker is ever shown.

One scripted model says one reply, so each scenario is a worker of its own; they start together
once for the module.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest
from agents import Agent, OpenAIResponsesModel, Runner, set_tracing_disabled

from tests.families.examples import REPLIES, TOOL_ARGUMENTS
from tests.families.scripted import scripted_model, worker_env
from tests.families.vocab import family_dir
from worker.ops.cluster import Cluster, Worker

# Scenario name: (family, reply kind).
SCENARIOS = {
    "qwen3-tool": ("qwen3", "think-then-tool-call"),
    "gpt-oss-final": ("gpt-oss", "analysis-then-final"),
    "gpt-oss-tool": ("gpt-oss", "analysis-then-tool-call"),
    "deepseek-r1": ("deepseek-r1", "inside-think-then-answer"),
    "llama3-eot": ("llama3", "answer"),
    "llama3-eom": ("llama3", "builtin-tool-call"),
    "llama3-tool": ("llama3", "tool-call"),
    "gemma": ("gemma", "answer"),
    "mistral": ("mistral", "answer"),
}
# What each scenario's answer shows: (reasoning, content, finish_reason).
EXPECTED: dict[str, tuple[str | None, str | None, str]] = {
    "qwen3-tool": (
        "The user wants the weather in Paris. I should call the tool.",
        None,
        "tool_calls",
    ),
    "gpt-oss-final": ("A greeting; answer briefly", "Hello! How can I help?", "stop"),
    "gpt-oss-tool": ("Need the weather; call get_weather", None, "tool_calls"),
    "deepseek-r1": ("The user greets me in two languages.", "Hello! 你好 😀", "stop"),
    "llama3-eot": (None, "Hello! How can I help you today?", "stop"),
    "llama3-eom": (None, '<|python_tag|>brave_search.call(query="weather in Paris")', "stop"),
    "llama3-tool": (None, None, "tool_calls"),
    "gemma": (None, "Hello! How can I help? Ça va? 😀", "stop"),
    "mistral": (None, "Hello! How can I help?", "stop"),
}
# Markers and end tokens that must never reach a client.
NEVER_SHOWN = (
    "<think>",
    "</think>",
    "<|im_end|>",
    "<|channel|>",
    "<|message|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|eot_id|>",
    "<|eom_id|>",
    "<end_of_turn>",
    "</s>",
    "<tool_call>",
)
ASK: list[Any] = [{"role": "user", "content": "Hello! What is the weather in Paris?"}]
WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string"}},
    "required": ["city"],
}
CHAT_TOOLS: list[Any] = [
    {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}}
]
CLAUDE_TOOLS: list[Any] = [{"name": "get_weather", "input_schema": WEATHER}]
RESPONSE_TOOLS: list[Any] = [{"type": "function", "name": "get_weather", "parameters": WEATHER}]


@pytest.fixture(scope="module")
def served(stack: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """Each scenario's model name, its worker started and ready."""
    root = tmp_path_factory.mktemp("scripted")
    models: dict[str, Path] = {}
    for scenario, (family, kind) in SCENARIOS.items():
        models[scenario] = scripted_model(
            family_dir(family), REPLIES[(family, kind)], root, name=scenario
        )
    workers: list[Worker] = [
        stack.start_worker(wait=False, **worker_env(m), MLXQ_BATCH_SIZE="2")
        for m in models.values()
    ]
    for worker in workers:
        stack.wait_for_worker(worker)
    yield {scenario: model.name for scenario, model in models.items()}
    for worker in workers:
        if worker in stack.workers:
            stack.kill_worker(worker)


@pytest.fixture(scope="module")
def sdk(api_url: str) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{api_url}/v1", api_key="unused", max_retries=0) as client:
        yield client


@pytest.fixture(scope="module")
def claude(api_url: str) -> Iterator[anthropic.Anthropic]:
    with anthropic.Anthropic(base_url=api_url, api_key="unused", max_retries=0) as client:
        yield client


def never_shown(*texts: str | None) -> None:
    for text in texts:
        for marker in NEVER_SHOWN:
            assert marker not in (text or ""), f"{marker!r} reached the client"


def tools_for(scenario: str) -> dict[str, Any]:
    return {"tools": CHAT_TOOLS} if scenario.endswith("-tool") else {}


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_chat_splits_reasoning_content_and_calls(
    sdk: openai.OpenAI, served: dict[str, str], scenario: str
) -> None:
    reply = sdk.chat.completions.create(model=served[scenario], messages=ASK, **tools_for(scenario))
    reasoning, content, finish = EXPECTED[scenario]
    message = reply.choices[0].message
    extra = message.model_extra or {}
    assert (extra.get("reasoning_content"), extra.get("reasoning")) == (reasoning, reasoning)
    assert message.content == content
    assert reply.choices[0].finish_reason == finish
    if finish == "tool_calls":
        assert message.tool_calls is not None
        call = message.tool_calls[0]
        assert call.type == "function"
        assert (call.function.name, call.function.arguments) == ("get_weather", TOOL_ARGUMENTS)
    never_shown(message.content, reasoning)
    assert reply.usage is not None and reply.usage.completion_tokens_details is not None
    assert (reply.usage.completion_tokens_details.reasoning_tokens > 0) == (reasoning is not None)


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_a_chat_stream_splits_the_same_way(
    sdk: openai.OpenAI, served: dict[str, str], scenario: str
) -> None:
    stream = sdk.chat.completions.create(
        model=served[scenario], messages=ASK, stream=True, **tools_for(scenario)
    )
    thought, shown, arguments, finishes = [], [], [], []
    for chunk in stream:
        for choice in chunk.choices:
            extra = choice.delta.model_extra or {}
            thought.append(extra.get("reasoning_content") or "")
            assert extra.get("reasoning") == extra.get("reasoning_content")
            shown.append(choice.delta.content or "")
            arguments += [c.function.arguments or "" for c in choice.delta.tool_calls or []]
            finishes.append(choice.finish_reason)
    reasoning, content, finish = EXPECTED[scenario]
    assert "".join(thought) == (reasoning or "")
    assert "".join(shown) == (content or "")
    assert [f for f in finishes if f] == [finish]
    if finish == "tool_calls":
        assert json.loads("".join(arguments)) == json.loads(TOOL_ARGUMENTS)
    never_shown(*shown, *thought)


@pytest.mark.parametrize("scenario", ["qwen3-tool", "gpt-oss-final", "deepseek-r1"])
def test_anthropic_answers_with_a_signed_thinking_block_first(
    claude: anthropic.Anthropic, served: dict[str, str], scenario: str
) -> None:
    reasoning, content, finish = EXPECTED[scenario]
    tools = {"tools": CLAUDE_TOOLS} if finish == "tool_calls" else {}
    reply = claude.messages.create(model=served[scenario], max_tokens=200, messages=ASK, **tools)
    first = reply.content[0]
    assert first.type == "thinking" and first.thinking == reasoning and first.signature
    kinds = [block.type for block in reply.content[1:]]
    if finish == "tool_calls":
        assert kinds == ["tool_use"] and reply.stop_reason == "tool_use"
        assert reply.content[1].input == json.loads(TOOL_ARGUMENTS)  # type: ignore[union-attr]
    else:
        assert kinds == ["text"] and reply.stop_reason == "end_turn"
        assert reply.content[1].text == content  # type: ignore[union-attr]


@pytest.mark.parametrize("scenario", ["qwen3-tool", "gpt-oss-final"])
def test_an_anthropic_stream_gives_the_same_blocks(
    claude: anthropic.Anthropic, served: dict[str, str], scenario: str
) -> None:
    tools = {"tools": CLAUDE_TOOLS} if scenario.endswith("-tool") else {}
    with claude.messages.stream(
        model=served[scenario], max_tokens=200, messages=ASK, **tools
    ) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_message()
    reasoning, _, _ = EXPECTED[scenario]
    assert "thinking" in kinds and "signature" in kinds
    first = final.content[0]
    assert first.type == "thinking" and first.thinking == reasoning and first.signature


@pytest.mark.parametrize("scenario", ["qwen3-tool", "gpt-oss-final"])
def test_responses_put_a_reasoning_item_before_the_answer(
    sdk: openai.OpenAI, served: dict[str, str], scenario: str
) -> None:
    reasoning, content, finish = EXPECTED[scenario]
    tools = {"tools": RESPONSE_TOOLS} if finish == "tool_calls" else {}
    response = sdk.responses.create(
        model=served[scenario],
        input="Hello! What is the weather in Paris?",
        include=["reasoning.encrypted_content"],
        **tools,
    )
    item = response.output[0]
    assert item.type == "reasoning" and item.encrypted_content
    assert [part.text for part in item.content or []] == [reasoning]
    assert response.output_text == (content or "")
    calls = [i for i in response.output if i.type == "function_call"]
    assert len(calls) == (finish == "tool_calls")
    assert response.usage is not None and response.usage.output_tokens_details.reasoning_tokens


def test_a_responses_stream_streams_the_reasoning_first(
    sdk: openai.OpenAI, served: dict[str, str]
) -> None:
    events = list(sdk.responses.create(model=served["gpt-oss-final"], input="Hello!", stream=True))
    deltas = [e for e in events if e.type == "response.reasoning_text.delta"]
    texts = [e for e in events if e.type == "response.output_text.delta"]
    assert "".join(e.delta for e in deltas) == EXPECTED["gpt-oss-final"][0]
    assert deltas[-1].sequence_number < texts[0].sequence_number
    assert events[-1].type == "response.completed"


def test_each_sdks_own_objects_go_back_as_the_next_turn(
    sdk: openai.OpenAI, claude: anthropic.Anthropic, served: dict[str, str]
) -> None:
    """Chat's message, Anthropic's thinking and tool_use blocks and the Responses output items,
    dumped as the SDKs give them, are accepted as history on the next request."""
    model = served["qwen3-tool"]
    first = sdk.chat.completions.create(model=model, messages=ASK, tools=CHAT_TOOLS)
    said = first.choices[0].message
    assert said.tool_calls is not None
    result = {"role": "tool", "tool_call_id": said.tool_calls[0].id, "content": "Sunny"}
    chat = [*ASK, said.model_dump(exclude_none=True), result]
    again = sdk.chat.completions.create(model=model, messages=chat, tools=CHAT_TOOLS)
    assert again.choices[0].finish_reason == "tool_calls"

    reply = claude.messages.create(model=model, max_tokens=200, messages=ASK, tools=CLAUDE_TOOLS)
    use = reply.content[-1]
    assert use.type == "tool_use"
    turns: list[Any] = [
        *ASK,
        {"role": "assistant", "content": [block.model_dump() for block in reply.content]},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "Sunny"}],
        },
    ]
    assert (
        claude.messages.create(
            model=model, max_tokens=200, messages=turns, tools=CLAUDE_TOOLS
        ).stop_reason
        == "tool_use"
    )

    response = sdk.responses.create(
        model=model, input=ASK, tools=RESPONSE_TOOLS, include=["reasoning.encrypted_content"]
    )
    call = next(i for i in response.output if i.type == "function_call")
    items: list[Any] = [*ASK, *(i.model_dump(exclude_none=True) for i in response.output)]
    items.append({"type": "function_call_output", "call_id": call.call_id, "output": "Sunny"})
    assert (
        sdk.responses.create(model=model, input=items, tools=RESPONSE_TOOLS).status == "completed"
    )


def test_an_agent_run_keeps_the_reasoning_out_of_its_final_output(
    api_url: str, served: dict[str, str]
) -> None:
    set_tracing_disabled(True)  # the SDK would send its traces to OpenAI

    async def run() -> tuple[str, list[str]]:
        async with openai.AsyncOpenAI(base_url=f"{api_url}/v1", api_key="unused") as client:
            model = OpenAIResponsesModel(model=served["gpt-oss-final"], openai_client=client)
            result = await Runner.run(Agent(name="greeter", model=model), "Hello!")
            return str(result.final_output), [item.type for item in result.new_items]

    final, kinds = asyncio.run(run())
    assert final == "Hello! How can I help?"
    assert kinds[0] == "reasoning_item"


def test_a_thinking_budget_ends_the_reasoning_when_it_runs_out(
    claude: anthropic.Anthropic, served: dict[str, str]
) -> None:
    reasoning = EXPECTED["qwen3-tool"][0]
    assert reasoning is not None
    reply = claude.messages.create(
        model=served["qwen3-tool"],
        max_tokens=12,
        messages=ASK,
        thinking={"type": "enabled", "budget_tokens": 4},
    )
    first = reply.content[0]
    assert first.type == "thinking"
    assert first.thinking and reasoning.startswith(first.thinking)
    assert len(first.thinking) < len(reasoning)
    never_shown(*(getattr(block, "text", "") for block in reply.content))


def test_claude_codes_thinking_budget_on_gpt_oss_is_answered_not_refused(
    claude: anthropic.Anthropic, served: dict[str, str]
) -> None:
    """Harmony sets its reasoning length by effort: the budget reaches the template as one
    (tests/families/test_budget_effort.py), and the analysis is not cut short."""
    reasoning, content, _ = EXPECTED["gpt-oss-final"]
    reply = claude.messages.create(
        model=served["gpt-oss-final"],
        max_tokens=200,
        messages=ASK,
        thinking={"type": "enabled", "budget_tokens": 1024},
    )
    first, answer = reply.content
    assert first.type == "thinking" and first.thinking == reasoning
    assert answer.type == "text" and answer.text == content
    assert reply.stop_reason == "end_turn"
