"""What SDKs and agents send about reasoning, on the in-process app and the session's real Redis:
each field is accepted and lands on the queued job (read back from the queue, where a stand-in
worker leaves it), a field mlxq cannot honour is a 400 naming it, and Anthropic's max_tokens is a
ceiling where chat's is a demand.

A queued request gives up after 3 s (`impatient_http`); the jobs are read while they wait.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from functools import partial
from typing import Any

import pytest
from anthropic.types import (
    CitationCharLocation,
    DirectCaller,
    RedactedThinkingBlock,
    TextBlock,
    ThinkingBlock,
    ToolUseBlock,
)
from flask.testing import FlaskClient
from openai.types.chat import ChatCompletionMessage, ChatCompletionMessageFunctionToolCall
from openai.types.chat.chat_completion_message_function_tool_call import Function
from openai.types.responses import (
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
    ResponseReasoningItem,
)
from openai.types.responses.response_reasoning_item import Content, Summary
from redis import Redis
from redis.client import PubSub
from werkzeug.test import TestResponse

from shared.queue.keys import Keys
from shared.wire.responses.reasoning_blob import encode_reasoning_blob
from tests.api.test_messages import assert_anthropic_error
from tests.shared.thinking_template import word_spec
from tests.support import CHAT, MODEL, assert_openai_error, chat, finish_queued, rq_job, rq_queue
from worker.ops.cluster import wait_until
from worker.runtime.tokenizer_spec import publish_spec

MESSAGES = "/v1/messages"
RESPONSES = "/v1/responses"
HI: list[Any] = [{"role": "user", "content": "hi"}]
WEATHER = {
    "type": "function",
    "function": {"name": "weather", "parameters": {"type": "object", "properties": {}}},
}


# A request, as its route and body; the jobs of requests, as `queued_jobs` reads them.
Ask = tuple[str, dict[str, Any]]
Queued = Callable[[list[Ask]], list[dict[str, Any]]]


def queued_jobs(
    http: FlaskClient, redis: Redis, keys: Keys, asks: list[Ask]
) -> list[dict[str, Any]]:
    """Each request's job as it waits in the model's queue, in the order asked."""
    queue = rq_queue(redis, keys.queue(MODEL))
    jobs: list[dict[str, Any]] = []
    threads = []
    for path, body in asks:
        replies: list[TestResponse] = []
        threads.append(
            threading.Thread(
                target=lambda p=path, b=body, r=replies: r.append(http.post(p, json=b))
            )
        )
        threads[-1].start()
        known = {job["job_id"] for job in jobs}

        def new_ids(known: set[str] = known) -> set[str]:
            return set(queue.get_job_ids()) - known

        wait_until(lambda r=replies: bool(r or new_ids()), 5, f"{path} to be queued")  # type: ignore[misc]
        fresh = new_ids()
        assert fresh, replies[0].get_data(as_text=True)
        jobs.append(rq_job(redis, fresh.pop()).args[0])
    finish_queued(redis, keys)
    for thread in threads:
        thread.join(timeout=10)
    return jobs


@pytest.fixture
def queued(impatient_http: FlaskClient, redis: Redis, stand_in: tuple[Keys, PubSub]) -> Queued:
    """`queued_jobs` on the app whose requests give up soon, reading the stand-in's queue."""
    keys, _ = stand_in
    return partial(queued_jobs, impatient_http, redis, keys)


def chat_body(**extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": HI, **extra}


def message_body(**extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "max_tokens": 64, "messages": HI, **extra}


def test_chat_reasoning_controls_and_history_reasoning_are_queued_on_the_job(
    queued: Queued,
) -> None:
    history = [
        {"role": "user", "content": "Say hi"},
        {"role": "assistant", "content": "Hi!", "reasoning_content": "DeepSeek's name."},
        {"role": "user", "content": "Again"},
        {"role": "assistant", "content": "Hi again!", "reasoning": "vLLM's name."},
        {"role": "user", "content": "Once more"},
    ]
    controls, quiet = queued(
        [
            (
                CHAT,
                chat_body(
                    messages=history,
                    reasoning_effort="low",
                    thinking_token_budget=64,
                    chat_template_kwargs={"enable_thinking": True, "style": ["terse", 1]},
                    prompt_cache_key="conversation-1",
                    prompt_cache_retention="24h",
                    safety_identifier="user-1",
                    verbosity="medium",
                    modalities=["text"],
                ),
            ),
            (CHAT, chat_body(reasoning_effort="none")),
        ],
    )
    assert controls["reasoning"] == {"enabled": None, "effort": "low", "budget_tokens": 64}
    assert controls["chat_template_kwargs"] == {"enable_thinking": True, "style": ["terse", 1]}
    assert controls["messages"][1]["reasoning_content"] == "DeepSeek's name."
    assert controls["messages"][3]["reasoning"] == "vLLM's name."
    assert quiet["reasoning"] == {"enabled": False, "effort": "none", "budget_tokens": None}
    assert quiet["chat_template_kwargs"] is None


def test_the_openai_sdks_own_message_sent_back_is_queued_with_its_reasoning(
    queued: Queued,
) -> None:
    call = ChatCompletionMessageFunctionToolCall(
        id="call_1", type="function", function=Function(name="weather", arguments="{}")
    )
    answer = ChatCompletionMessage(
        role="assistant", content=None, tool_calls=[call], reasoning_content="Look it up."
    )
    result = {"role": "tool", "tool_call_id": "call_1", "content": "Sunny"}
    (job,) = queued(
        [(CHAT, chat_body(messages=[*HI, answer.model_dump(), result], tools=[WEATHER]))],
    )
    sent_back = job["messages"][1]
    assert sent_back["reasoning_content"] == "Look it up."
    assert sent_back["tool_calls"][0]["function"]["name"] == "weather"


@pytest.mark.parametrize(
    "extra",
    [
        {"reasoning_effort": effort}
        for effort in ("none", "minimal", "low", "medium", "high", "xhigh", "max")
    ]
    + [
        {"prompt_cache_options": {"mode": "explicit", "ttl": "30m"}},
        {"prediction": {"type": "content", "content": "Hello"}},
        {
            "messages": [
                {"role": "user", "content": "hi"},
                {"role": "assistant", "content": None, "refusal": "I can't."},
                {
                    "role": "assistant",
                    "content": [{"type": "refusal", "refusal": "No."}],
                    "annotations": [],
                },
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "text",
                            "text": "hi",
                            "prompt_cache_breakpoint": {"mode": "explicit"},
                        }
                    ],
                },
            ]
        },
    ],
)
def test_documented_chat_fields_pass_validation(http: FlaskClient, extra: dict[str, Any]) -> None:
    response = chat(http, **extra)
    assert response.status_code == 404, response.get_data(as_text=True)  # model "m" is nowhere


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"verbosity": "low"}, "verbosity"),
        ({"modalities": ["text", "audio"]}, "modalities"),
        ({"audio": {"voice": "alloy", "format": "mp3"}}, "audio"),
        ({"web_search_options": {}}, "web_search_options"),
        ({"moderation": {"model": "omni-moderation-latest"}}, "moderation"),
        ({"reasoning_effort": "extreme"}, "reasoning_effort"),
        (
            {"chat_template_kwargs": {"add_generation_prompt": False}},
            "chat_template_kwargs.add_generation_prompt",
        ),
        ({"chat_template_kwargs": {"not a name": 1}}, "chat_template_kwargs.not a name"),
        (
            {"messages": [*HI, {"role": "assistant", "content": "x", "audio": {"id": "a"}}]},
            "messages.1.audio",
        ),
        (
            {
                "messages": [
                    *HI,
                    {"role": "assistant", "function_call": {"name": "f", "arguments": "{}"}},
                ]
            },
            "messages.1.function_call",
        ),
        ({"messages": [{"role": "user", "content": "hi", "reasoning_content": "x"}]}, "messages.0"),
    ],
)
def test_chat_fields_mlxq_cannot_honour_are_refused_by_name(
    http: FlaskClient, extra: dict[str, Any], param: str
) -> None:
    response = chat(http, **extra)
    assert_openai_error(response, 400)
    assert response.get_json()["error"]["param"].startswith(param)


def test_anthropic_thinking_and_effort_are_queued_as_the_jobs_control(
    queued: Queued,
) -> None:
    asks = [
        message_body(
            thinking={"type": "enabled", "budget_tokens": 2048, "display": "omitted"},
            output_config={"effort": "max"},
        ),
        message_body(thinking={"type": "disabled"}),
        message_body(thinking={"type": "adaptive"}),
        message_body(),
    ]
    jobs = queued([(MESSAGES, body) for body in asks])
    assert [job["reasoning"] for job in jobs] == [
        {"enabled": True, "effort": "max", "budget_tokens": 2048},
        {"enabled": False, "effort": None, "budget_tokens": None},
        {"enabled": True, "effort": None, "budget_tokens": None},
        None,
    ]
    assert all(job["max_tokens_ceiling"] for job in jobs)


def test_the_anthropic_sdks_own_blocks_sent_back_are_queued_with_their_thinking(
    queued: Queued,
) -> None:
    cited = CitationCharLocation(
        cited_text="Paris",
        document_index=0,
        document_title=None,
        end_char_index=5,
        start_char_index=0,
        type="char_location",
    )
    blocks = [
        ThinkingBlock(type="thinking", thinking="Check the weather.", signature="any"),
        RedactedThinkingBlock(type="redacted_thinking", data=encode_reasoning_blob("Then ask.")),
        RedactedThinkingBlock(type="redacted_thinking", data="EmwKAhgBEgy3va3pzix/another"),
        TextBlock(type="text", text="Let me look.", citations=[cited]),
        ToolUseBlock(
            type="tool_use",
            id="toolu_1",
            name="weather",
            input={"city": "Paris"},
            caller=DirectCaller(type="direct"),
        ),
    ]
    result = {"type": "tool_result", "tool_use_id": "toolu_1", "content": "Sunny"}
    messages = [
        *HI,
        {"role": "assistant", "content": [block.model_dump() for block in blocks]},
        {"role": "user", "content": [result]},
    ]
    tools = [{"name": "weather", "input_schema": {"type": "object"}}]
    (job,) = queued([(MESSAGES, message_body(messages=messages, tools=tools))])
    turn = job["messages"][1]
    assert turn["reasoning_content"] == "Check the weather.\nThen ask."
    assert turn["content"] == "Let me look."
    assert turn["tool_calls"][0]["function"]["name"] == "weather"


@pytest.mark.parametrize(
    ("extra", "naming"),
    [
        (
            {"messages": [{"role": "user", "content": [{"type": "thinking", "thinking": "x"}]}]},
            "thinking blocks",
        ),
        ({"thinking": {"type": "enabled", "budget_tokens": 0}}, "thinking"),
        ({"thinking": {"type": "sometimes"}}, "thinking"),
        ({"output_config": {"effort": "extreme"}}, "output_config.effort"),
    ],
)
def test_anthropic_reasoning_fields_mlxq_cannot_honour_are_refused(
    http: FlaskClient, extra: dict[str, Any], naming: str
) -> None:
    response = http.post(MESSAGES, json=message_body(**extra))
    assert_anthropic_error(response, 400, "invalid_request_error", naming)


def codex_body(**extra: Any) -> dict[str, Any]:
    """A request shaped like Codex CLI's: instructions, message items, function tools, stored
    nothing, streamed, asking for the opaque reasoning it sends back on the next turn."""
    return {
        "model": MODEL,
        "instructions": "You are a coding agent.",
        "input": [
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "ls"}]}
        ],
        "tools": [
            {
                "type": "function",
                "name": "shell",
                "description": "Runs a command",
                "strict": False,
                "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}},
            }
        ],
        "tool_choice": "auto",
        "parallel_tool_calls": False,
        "reasoning": {"effort": "high", "summary": "auto"},
        "store": False,
        "stream": True,
        "include": ["reasoning.encrypted_content"],
        "prompt_cache_key": "0199a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b",
        **extra,
    }


def test_a_codex_shaped_request_is_queued_with_its_effort_and_sent_back_reasoning(
    queued: Queued,
) -> None:
    turn = [
        ResponseReasoningItem(
            id="rs_1",
            type="reasoning",
            summary=[Summary(type="summary_text", text="Listing files")],
            encrypted_content=encode_reasoning_blob("The user wants a listing."),
        ).model_dump(),
        ResponseFunctionToolCall(
            type="function_call", id="fc_1", call_id="call_1", name="shell", arguments="{}"
        ).model_dump(),
        {"type": "function_call_output", "call_id": "call_1", "output": "README.md"},
        ResponseReasoningItem(
            id="rs_2",
            type="reasoning",
            summary=[],
            content=[Content(type="reasoning_text", text="One file.")],
        ).model_dump(),
        ResponseOutputMessage(
            id="msg_1",
            type="message",
            role="assistant",
            status="completed",
            content=[ResponseOutputText(type="output_text", text="README.md", annotations=[])],
        ).model_dump(),
        {"role": "user", "content": "thanks"},
    ]
    first, second = queued(
        [(RESPONSES, codex_body()), (RESPONSES, codex_body(input=[*codex_body()["input"], *turn]))],
    )
    assert first["reasoning"] == {"enabled": None, "effort": "high", "budget_tokens": None}
    assert first["tools"]["parallel"] is False
    call, _, answer = second["messages"][2:5]
    assert call["reasoning_content"] == "The user wants a listing."
    assert call["tool_calls"][0]["function"]["name"] == "shell"
    assert (answer["content"], answer["reasoning_content"]) == ("README.md", "One file.")


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"include": ["file_search_call.results"]}, "include"),
        ({"reasoning": {"effort": "extreme"}}, "reasoning.effort"),
        ({"reasoning": {"context": "all_turns"}}, "reasoning.context"),
        ({"reasoning": {"mode": "pro"}}, "reasoning.mode"),
        ({"text": {"verbosity": "low"}}, "text.verbosity"),
        ({"prompt_cache_retention": "forever"}, "prompt_cache_retention"),
    ],
)
def test_responses_fields_mlxq_cannot_honour_are_refused_by_name(
    http: FlaskClient, extra: dict[str, Any], param: str
) -> None:
    response = http.post(RESPONSES, json=codex_body(model="m", **extra))
    assert_openai_error(response, 400)
    assert response.get_json()["error"]["param"].startswith(param)


def test_an_opaque_reasoning_value_from_elsewhere_is_accepted_and_left_out(
    http: FlaskClient,
) -> None:
    reasoning = {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "gAAAA"}
    body = codex_body(model="m", input=[reasoning, {"role": "user", "content": "hi"}])
    assert http.post(RESPONSES, json=body).status_code == 404  # valid: model "m" is nowhere


def test_anthropics_max_tokens_is_a_ceiling_on_the_window_where_chats_is_refused(
    impatient_http: FlaskClient, redis: Redis, keys: Keys, queued: Queued
) -> None:
    publish_spec(redis, keys, MODEL, word_spec(context_length=64))
    refused = impatient_http.post(CHAT, json=chat_body(max_tokens=32_000))
    assert_openai_error(refused, 400, "messages")
    assert refused.get_json()["error"]["code"] == "context_length_exceeded"
    (job,) = queued([(MESSAGES, message_body(max_tokens=32_000))])
    assert (job["max_tokens"], job["max_tokens_ceiling"]) == (32_000, True)
    too_long = [{"role": "user", "content": "word " * 80}]
    response = impatient_http.post(MESSAGES, json=message_body(messages=too_long))
    assert_anthropic_error(response, 400, "invalid_request_error", "maximum context length")
