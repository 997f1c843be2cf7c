"""Malformed and oversized input of every kind: a 4xx with OpenAI's error body, nothing logged at
ERROR, nothing queued. Runs the Flask app in-process on the real Redis with a stand-in worker
for the real model (tests/support.py): the API counts that model as served, and the bodies name
it, so a request that got past validation would be queued in one of its lanes.
"""

from __future__ import annotations

import json
import logging
import threading
from typing import Any

import pytest
from flask.testing import FlaskClient
from redis import Redis
from redis.client import PubSub
from werkzeug.test import TestResponse

from shared.queue.keys import Keys
from shared.wire.chat.completions import MAX_CONTENT_CHARS, MAX_MESSAGES, MAX_STOP_CHARS, MAX_TOKENS
from tests.support import MODEL, assert_openai_error, rq_queue
from worker.ops.cluster import wait_until

CHAT = "/v1/chat/completions"
TEXT = "/v1/completions"
JSON = "application/json"
HI = [{"role": "user", "content": "hi"}]
DEEP = 100_000


@pytest.fixture(autouse=True)
def nothing_logged_at_error_and_nothing_queued(
    caplog: pytest.LogCaptureFixture, redis: Redis, stand_in: tuple[Keys, PubSub]
) -> Any:
    keys, _ = stand_in
    with caplog.at_level(logging.WARNING):
        yield
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert traces_of_jobs(redis, keys) == set()


def traces_of_jobs(redis: Redis, keys: Keys) -> set[str]:
    """What the namespace holds beyond the stand-in worker's own keys. A request that was queued
    leaves some even after it gave up and was withdrawn (its cancel flag); a queued one, its
    lane's queue and the backlog's keys."""
    stand_in = {keys.workers(MODEL), keys.models()}
    held = {key.decode() for key in redis.scan_iter(f"{keys.ns}:*")}
    held |= {name for name in keys.lanes(MODEL) if rq_queue(redis, name).count}
    return held - stand_in


def test_a_valid_request_is_queued_here(
    impatient_http: FlaskClient, redis: Redis, stand_in: tuple[Keys, PubSub]
) -> None:
    """What makes "nothing queued" above mean something: a valid body is admitted and waits in
    the interactive lane, and leaves its traces after it gave up (503) and was withdrawn."""
    keys, _ = stand_in
    queue = rq_queue(redis, keys.queue(MODEL))
    replies: list[TestResponse] = []
    body = {"model": MODEL, "messages": HI, "max_tokens": 1}
    asking = threading.Thread(target=lambda: replies.append(impatient_http.post(CHAT, json=body)))
    asking.start()
    wait_until(lambda: queue.count == 1, 5, "the valid request to be queued")
    asking.join(timeout=10)
    assert replies[0].status_code == 503 and queue.count == 0
    traces = traces_of_jobs(redis, keys)
    assert traces
    redis.delete(*traces)  # the check after each test is for the hostile bodies


def post_raw(http: FlaskClient, body: bytes | str, path: str = CHAT, **kw: Any) -> TestResponse:
    return http.post(path, data=body, content_type=kw.pop("content_type", JSON), **kw)


def chat(http: FlaskClient, **fields: Any) -> TestResponse:
    return http.post(CHAT, json={"model": MODEL, "messages": HI, **fields})


def error_of(response: TestResponse, status: int) -> dict[str, Any]:
    assert_openai_error(response, status)
    error: dict[str, Any] = response.get_json()["error"]
    return error


@pytest.mark.parametrize(
    "body",
    [
        b"{",
        b'{"model": "x",}',
        b"{'model': 'x'}",
        b'{"model": "x"} trailing',
        b"\xef\xbb\xbf{}",  # a byte-order mark
        b"\xff\xfe{}",  # not UTF-8
        b'{"model": "\xed\xa0\x80"}',  # a surrogate encoded as UTF-8
        b'{"model": "a\x00b"}',  # a raw NUL inside a string
    ],
)
def test_bad_json_is_a_400_invalid_json(http: FlaskClient, body: bytes) -> None:
    assert error_of(post_raw(http, body), 400)["code"] == "invalid_json"


@pytest.mark.parametrize("body", [b"", b"   ", b"\n"])
def test_empty_bodies_are_a_400(http: FlaskClient, body: bytes) -> None:
    error_of(post_raw(http, body), 400)


@pytest.mark.parametrize("body", [b"[]", b"[{}]", b"0", b"-1.5", b'"text"', b"true", b"null"])
def test_a_json_array_or_scalar_body_is_a_400(http: FlaskClient, body: bytes) -> None:
    assert "JSON object" in error_of(post_raw(http, body), 400)["message"]


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"messages": "hi"}, "messages"),
        ({"messages": [["user", "hi"]]}, "messages.0"),
        ({"messages": [{"role": "user", "content": 7}]}, "messages.0.content"),
        ({"messages": [{"role": "user", "content": [{"type": "image", "x": 1}]}]}, None),
        ({"messages": [{"role": "user"}]}, "messages.0.content"),
        ({"model": 7}, "model"),
        ({"model": ["m"]}, "model"),
        ({"max_tokens": "ten"}, "max_tokens"),
        ({"max_tokens": 1.5}, "max_tokens"),
        ({"temperature": "hot"}, "temperature"),
        ({"stop": {"a": 1}}, "stop"),
        ({"stop": [1, 2]}, "stop.0"),
        ({"stream_options": {"include_usage": True}}, None),
        ({"metadata": {"k": 1}}, "metadata.k"),
        ({"seed": "s"}, "seed"),
    ],
)
def test_wrong_types_are_a_400_naming_the_param(
    http: FlaskClient, fields: dict[str, Any], param: str | None
) -> None:
    error = error_of(chat(http, **fields), 400)
    if param is not None:
        assert error["param"] == param


@pytest.mark.parametrize("role", ["tool", "function", "System", "", "root", "user\x00"])
def test_unknown_roles_are_a_400(http: FlaskClient, role: str) -> None:
    error_of(chat(http, messages=[{"role": role, "content": "x"}]), 400)


@pytest.mark.parametrize(
    "literal", ["NaN", "Infinity", "-Infinity", "1e400", "-1e400", "1" + "0" * 5000]
)
@pytest.mark.parametrize("field", ["temperature", "top_p", "max_tokens", "seed", "logit_bias"])
def test_nan_infinity_and_numbers_beyond_range_are_a_400(
    http: FlaskClient, literal: str, field: str
) -> None:
    value = f'{{"1": {literal}}}' if field == "logit_bias" else literal
    body = f'{{"model": "{MODEL}", "messages": {json.dumps(HI)}, "{field}": {value}}}'
    error_of(post_raw(http, body), 400)


def test_nan_hidden_in_a_free_form_object_is_a_400(http: FlaskClient) -> None:
    body = f'{{"model": "{MODEL}", "messages": {json.dumps(HI)}, "tools": [{{"x": 1e999}}]}}'
    assert error_of(post_raw(http, body), 400)["param"] == "tools.0.x"


@pytest.mark.parametrize(
    "body",
    [
        "[" * DEEP + "]" * DEEP,
        "{" + '"a":{' * DEEP + "}" * (DEEP + 1),
        f'{{"model": "{MODEL}", "messages": ' + "[" * DEEP + "]" * DEEP + "}",
        f'{{"model": "{MODEL}", "messages": [{{"role": "user", "content": '
        + "[" * DEEP
        + "]" * DEEP
        + "}]}",
    ],
)
def test_deep_nesting_is_a_clean_400(http: FlaskClient, body: str) -> None:
    assert error_of(post_raw(http, body), 400)["code"] == "invalid_json"


def test_a_30_mb_body_is_a_413(http: FlaskClient) -> None:
    body = json.dumps({"model": MODEL, "messages": HI, "user": "x" * 30_000_000})
    error = error_of(post_raw(http, body), 413)
    assert "large" in error["message"] or "size" in error["message"]


@pytest.mark.parametrize("content", ["a\x00b", "\x00", ["part", "with \x00"]])
def test_null_characters_in_text_are_a_400(http: FlaskClient, content: str | list[str]) -> None:
    if isinstance(content, list):
        content = [{"type": "text", "text": t} for t in content]  # type: ignore[misc]
    error = error_of(chat(http, messages=[{"role": "user", "content": content}]), 400)
    assert "NUL" in error["message"] and error["param"].startswith("messages.0.content")


def test_null_characters_in_keys_and_prompts_are_a_400(http: FlaskClient) -> None:
    error_of(chat(http, metadata={"a\x00": "b"}), 400)
    error_of(http.post(TEXT, json={"model": MODEL, "prompt": "x\x00y"}), 400)


@pytest.mark.parametrize("escape", ["\\ud800", "\\udfff", "a\\ud83d", "\\ude00\\ud83d"])
def test_lone_surrogates_are_a_400(http: FlaskClient, escape: str) -> None:
    body = f'{{"model": "{MODEL}", "prompt": "{escape}"}}'
    assert error_of(post_raw(http, body, TEXT), 400)["code"] == "invalid_json"


@pytest.mark.parametrize(
    "content_type",
    [
        "text/plain",
        "application/x-www-form-urlencoded",
        "multipart/form-data; boundary=x",
        "application/json; charset=latin-1",
        "application/xml",
        "",
    ],
)
def test_a_body_not_declared_as_json_is_a_415(http: FlaskClient, content_type: str) -> None:
    body = json.dumps({"model": MODEL, "messages": HI})
    response = http.post(CHAT, data=body, headers={"Content-Type": content_type})
    assert error_of(response, 415)["code"] == "unsupported_media_type"


@pytest.mark.parametrize("content_type", ["application/json; charset=utf-8", "application/x+json"])
def test_json_content_types_with_utf8_are_accepted(http: FlaskClient, content_type: str) -> None:
    body = json.dumps({"model": "no-such-model", "messages": HI})
    assert error_of(post_raw(http, body, content_type=content_type), 404)["param"] == "model"


@pytest.mark.parametrize(
    ("method", "path", "status"),
    [
        ("get", CHAT, 405),
        ("put", TEXT, 405),
        ("delete", "/v1/models", 405),
        ("post", "/health", 405),
        ("get", "/v1/chat", 404),
        ("post", "/v2/chat/completions", 404),
        ("post", "/", 405),  # the page is GET only
        ("get", "/nowhere", 404),
        ("get", "/v1/models/../../etc/passwd", 404),
    ],
)
def test_wrong_method_and_unknown_route(
    http: FlaskClient, method: str, path: str, status: int
) -> None:
    error_of(getattr(http, method)(path), status)


@pytest.mark.parametrize(
    ("fields", "param", "code"),
    [
        ({"messages": HI * (MAX_MESSAGES + 1)}, "messages", "array_above_max_length"),
        ({"messages": []}, "messages", None),
        (
            {"messages": [{"role": "user", "content": "x" * (MAX_CONTENT_CHARS + 1)}]},
            "messages.0.content",
            "string_above_max_length",
        ),
        (
            {
                "messages": [
                    {"role": "user", "content": [{"type": "text", "text": "x" * 600_000}] * 2}
                ]
            },
            "messages.0.content",
            "string_above_max_length",
        ),
        ({"stop": ["a", "b", "c", "d", "e"]}, "stop", "array_above_max_length"),
        ({"stop": "s" * (MAX_STOP_CHARS + 1)}, "stop", "string_above_max_length"),
        ({"stop": ["ok", "s" * (MAX_STOP_CHARS + 1)]}, "stop.1", "string_above_max_length"),
        ({"n": 129}, "n", "integer_above_max_value"),
        ({"n": 0}, "n", "integer_below_min_value"),
        ({"max_tokens": MAX_TOKENS + 1}, "max_tokens", "integer_above_max_value"),
        ({"max_completion_tokens": 10**30}, "max_completion_tokens", "integer_above_max_value"),
        ({"seed": 2**63}, "seed", "integer_above_max_value"),
        ({"temperature": 2.5}, "temperature", "decimal_above_max_value"),
        ({"metadata": {str(i): "v" for i in range(17)}}, "metadata", "array_above_max_length"),
    ],
)
def test_limits_are_refused_with_openais_codes(
    http: FlaskClient, fields: dict[str, Any], param: str, code: str | None
) -> None:
    error = error_of(chat(http, **fields), 400)
    assert error["param"] == param
    if code is not None:
        assert error["code"] == code


def test_limit_messages_name_the_numbers(http: FlaskClient) -> None:
    error = error_of(chat(http, messages=HI * (MAX_MESSAGES + 5)), 400)
    assert f"maximum length {MAX_MESSAGES}" in error["message"]
    assert f"length {MAX_MESSAGES + 5}" in error["message"]
    error = error_of(chat(http, max_tokens=MAX_TOKENS + 1), 400)
    assert f"<= {MAX_TOKENS}" in error["message"] and str(MAX_TOKENS + 1) in error["message"]


def test_text_completion_prompt_is_bounded(http: FlaskClient) -> None:
    response = http.post(TEXT, json={"model": MODEL, "prompt": "x" * (MAX_CONTENT_CHARS + 1)})
    assert error_of(response, 400)["code"] == "string_above_max_length"


@pytest.mark.parametrize(
    ("path", "param"),
    [
        ("/v1/fleet?recent=0.0", "recent"),
        ("/v1/files?limit=%2B3", "limit"),
        ("/v1/batches?limit=1e1", "limit"),
        ("/v1/responses/resp_x?starting_after=2.5", "starting_after"),
    ],
)
def test_an_integer_query_parameter_written_otherwise_is_a_400_naming_it(
    http: FlaskClient, path: str, param: str
) -> None:
    assert_openai_error(http.get(path), 400, param)
