"""The parameters modern OpenAI clients send: checked as strictly as OpenAI checks them.

Run in-process against the session's real Redis, with no worker: a request that passes
validation is answered 404 `model_not_found` (model "m" is served nowhere), one that does not
gets a 400 naming its parameter before anything is queued.
"""

from __future__ import annotations

from typing import Any

import pytest
from flask.testing import FlaskClient

from tests.support import MESSAGES, assert_openai_error, chat

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}


def passes_validation(http: FlaskClient, **body: Any) -> bool:
    response = chat(http, **body)
    assert response.status_code in (400, 404), response.get_data(as_text=True)
    return response.status_code == 404


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("stream", "yes"),
        ("stream", 1),
        ("max_tokens", "5"),
        ("max_tokens", 5.0),
        ("temperature", "0.5"),
        ("logprobs", 1),
        ("seed", "7"),
        ("top_logprobs", 2.0),
    ],
)
def test_types_are_strict_and_a_wrong_one_is_named(
    http: FlaskClient, field: str, value: object
) -> None:
    extra = {"logprobs": True} if field == "top_logprobs" else {}
    response = chat(http, **{field: value}, **extra)
    assert_openai_error(response, 400, field)


@pytest.mark.parametrize(
    "body",
    [
        {"store": True},
        {"store": False},
        {"service_tier": "auto"},
        {"service_tier": "default"},
        {"user": "u1", "metadata": {"k": "v"}},
        {"presence_penalty": -2, "frequency_penalty": 2},
        {"logit_bias": {str(i): 1.5 for i in range(300)}},
        {"logit_bias": {"42": -100, "7": 100}},
        {"top_k": 40, "min_p": 0.05, "repetition_penalty": 1.1},
        {"top_k": -1},
        {"logprobs": True, "top_logprobs": 20},
        {"logprobs": True},
        {"response_format": {"type": "text"}},
        {"response_format": {"type": "json_object"}},
        {
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "x", "schema": SCHEMA},
            }
        },
        {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "strict": True}}},
        {"temperature": 1},  # an integer is a number
    ],
)
def test_supported_parameters_pass_validation(http: FlaskClient, body: dict[str, Any]) -> None:
    assert passes_validation(http, **body)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("presence_penalty", 2.5),
        ("frequency_penalty", -2.01),
        ("logit_bias", {str(i): 1.0 for i in range(301)}),
        ("logit_bias", {"42": 101}),
        ("logit_bias", {"token": 1}),
        ("logit_bias", {"-1": 1}),
        ("top_logprobs", 21),
        ("top_k", -2),
        ("min_p", 1.5),
        ("repetition_penalty", 0),
        ("service_tier", "priority"),
    ],
)
def test_out_of_range_values_are_named(http: FlaskClient, field: str, value: object) -> None:
    extra = {"logprobs": True} if field == "top_logprobs" else {}
    response = chat(http, **{field: value}, **extra)
    assert_openai_error(response, 400)
    assert response.get_json()["error"]["param"].startswith(field)


def test_top_logprobs_without_logprobs_is_refused(http: FlaskClient) -> None:
    assert_openai_error(chat(http, top_logprobs=3), 400, "top_logprobs")


def test_a_schema_the_grammar_engine_cannot_honour_is_a_400_naming_response_format(
    http: FlaskClient,
) -> None:
    broken = {"type": "object", "properties": {"a": {"$ref": "#/definitions/missing"}}}
    response_format = {"type": "json_schema", "json_schema": {"name": "x", "schema": broken}}
    response = chat(http, response_format=response_format)
    assert_openai_error(response, 400, "response_format")
    assert response.get_json()["error"]["code"] == "invalid_json_schema"
    assert "missing" in response.get_json()["error"]["message"]


@pytest.mark.parametrize(
    "response_format",
    [
        {"type": "json_schema"},
        {"type": "json_schema", "json_schema": {"name": "has space", "schema": SCHEMA}},
        {"type": "xml"},
    ],
)
def test_malformed_response_formats_are_named(
    http: FlaskClient, response_format: dict[str, Any]
) -> None:
    response = chat(http, response_format=response_format)
    assert_openai_error(response, 400)
    assert response.get_json()["error"]["param"].startswith("response_format")


def test_responses_text_format_with_a_bad_schema_is_a_400_naming_text_format(
    http: FlaskClient,
) -> None:
    broken = {"type": "string", "format": "no-such-format"}
    text = {"format": {"type": "json_schema", "name": "x", "schema": broken}}
    response = http.post("/v1/responses", json={"model": "m", "input": "hi", "text": text})
    assert_openai_error(response, 400, "text.format")


def test_completions_prompts_logprobs_and_echo(http: FlaskClient) -> None:
    def complete(**body: Any) -> Any:
        return http.post("/v1/completions", json={"model": "m", **body})

    for ok in (
        {"prompt": "x", "logprobs": 5},
        {"prompt": "x", "logprobs": 1, "echo": True, "max_tokens": 0},
        {"prompt": ["a", "b"], "n": 64},
        {"prompt": [1, 2, 3]},
        {"prompt": [[1, 2], "text"]},
    ):
        assert complete(**ok).status_code == 404, ok
    assert_openai_error(complete(prompt="x", logprobs=6), 400, "logprobs")
    assert_openai_error(complete(prompt="x", echo="true"), 400, "echo")
    assert_openai_error(complete(prompt=[1, 2], echo=True), 400, "echo")
    assert_openai_error(complete(prompt="x", max_tokens=0), 400, "max_tokens")
    assert_openai_error(complete(prompt=["a", "b", "c"], n=43), 400, "n")
    assert_openai_error(complete(prompt=[]), 400)
    assert_openai_error(complete(prompt=[-1]), 400)


def test_messages_are_strict_too(http: FlaskClient) -> None:
    response = http.post(
        "/v1/chat/completions",
        json={"model": "m", "messages": [*MESSAGES, {"role": "user", "content": 5}]},
    )
    assert_openai_error(response, 400)


WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": SCHEMA}}


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (
            {"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "x"}}},
            "tool_choice",
        ),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tools": [{"type": "function", "function": {"name": "bad name"}}]}, "tools"),
        (
            {
                "tools": [
                    {"type": "function", "function": {"name": "f", "parameters": {"$ref": "#/x"}}}
                ]
            },
            "tools",
        ),
        ({"tools": [WEATHER], "tool_choice": "sometimes"}, "tool_choice"),
        ({"functions": [{"name": "f"}]}, "functions"),
    ],
)
def test_bad_tool_requests_are_named(http: FlaskClient, body: dict[str, Any], param: str) -> None:
    response = chat(http, **body)
    assert_openai_error(response, 400)
    assert response.get_json()["error"]["param"].startswith(param)


def test_tool_messages_need_their_call_id(http: FlaskClient) -> None:
    messages = [*MESSAGES, {"role": "tool", "content": "result"}]
    response = http.post("/v1/chat/completions", json={"model": "m", "messages": messages})
    assert_openai_error(response, 400)
    assert response.get_json()["error"]["param"].startswith("messages.1")


def test_tool_requests_and_tool_history_pass_validation(http: FlaskClient) -> None:
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "get_weather", "arguments": "{}"},
    }
    messages = [
        *MESSAGES,
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    ]
    for choice in (
        "auto",
        "none",
        "required",
        {"type": "function", "function": {"name": "get_weather"}},
    ):
        response = http.post(
            "/v1/chat/completions",
            json={"model": "m", "messages": messages, "tools": [WEATHER], "tool_choice": choice},
        )
        assert response.status_code == 404, response.get_data(as_text=True)
