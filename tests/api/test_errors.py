"""Bad input and unavailable backends: always OpenAI's error body, never a 500.

These run the Flask app in-process against the session's real Redis; no worker is needed
because every request here is refused before a job would be queued.
"""

from __future__ import annotations

import time

import pytest
from flask.testing import FlaskClient

from api import create_app
from shared.queue.config import Settings
from tests.support import CHAT, MESSAGES, assert_openai_error, chat
from worker.ops.cluster import free_port


def test_malformed_json_is_a_400(http: FlaskClient) -> None:
    response = http.post(CHAT, data=b'{"model": "m", ', content_type="application/json")
    assert_openai_error(response, 400)
    assert response.get_json()["error"]["code"] == "invalid_json"


def test_empty_body_is_a_400(http: FlaskClient) -> None:
    assert_openai_error(http.post(CHAT, data=b""), 400)


@pytest.mark.parametrize("body", [b"[]", b"42", b'"text"', b"null"])
def test_a_body_that_is_not_an_object_is_a_400(http: FlaskClient, body: bytes) -> None:
    assert_openai_error(http.post(CHAT, data=body, content_type="application/json"), 400)


def test_missing_messages_names_the_param(http: FlaskClient) -> None:
    response = http.post(CHAT, json={"model": "m"})
    assert_openai_error(response, 400, "messages")


@pytest.mark.parametrize(
    ("field", "value"),
    [("temperature", 2.5), ("temperature", -1), ("top_p", 0), ("top_p", 1.5), ("max_tokens", 0)],
)
def test_out_of_range_values_name_the_param(http: FlaskClient, field: str, value: float) -> None:
    assert_openai_error(chat(http, **{field: value}), 400, field)


def test_more_than_four_stop_strings_is_a_400(http: FlaskClient) -> None:
    assert_openai_error(chat(http, stop=["a", "b", "c", "d", "e"]), 400, "stop")


def test_non_string_stop_values_are_a_400(http: FlaskClient) -> None:
    response = chat(http, stop=[1, 2])
    assert_openai_error(response, 400)
    assert response.get_json()["error"]["param"].startswith("stop")


def test_unknown_role_is_a_400(http: FlaskClient) -> None:
    response = http.post(CHAT, json={"model": "m", "messages": [{"role": "x", "content": "y"}]})
    assert_openai_error(response, 400, "messages.0.role")


def test_unknown_argument_is_named(http: FlaskClient) -> None:
    response = chat(http, frobnicate=True)
    assert_openai_error(response, 400, "frobnicate")
    assert "frobnicate" in response.get_json()["error"]["message"]


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("functions", [{"name": "f"}]),
        ("function_call", "auto"),
    ],
)
def test_unsupported_openai_parameters_are_refused_by_name(
    http: FlaskClient, field: str, value: object
) -> None:
    response = chat(http, **{field: value})
    assert_openai_error(response, 400, field)
    assert response.get_json()["error"]["code"] == "unsupported_parameter"


def test_user_and_metadata_are_accepted(http: FlaskClient) -> None:
    response = chat(http, user="u1", metadata={"k": "v"})
    assert response.status_code == 404  # validation passed; model "m" has no worker


def test_unknown_model_is_a_404_model_not_found_at_once(http: FlaskClient) -> None:
    started = time.monotonic()
    response = chat(http, model="no-such-model")
    assert_openai_error(response, 404, "model")
    assert response.get_json()["error"]["code"] == "model_not_found"
    assert time.monotonic() - started < 1.0


def test_text_completion_unknown_model_is_a_404(http: FlaskClient) -> None:
    response = http.post("/v1/completions", json={"model": "nope", "prompt": "x"})
    assert_openai_error(response, 404, "model")


def test_unknown_route_is_a_404_in_openai_format(http: FlaskClient) -> None:
    assert_openai_error(http.get("/v1/nothing-here"), 404)


def test_wrong_method_is_a_405_in_openai_format(http: FlaskClient) -> None:
    assert_openai_error(http.get(CHAT), 405)


def test_redis_unreachable_is_a_503_within_two_seconds(settings: Settings) -> None:
    dead = settings.model_copy(update={"redis_url": f"redis://127.0.0.1:{free_port()}/0"})
    http = create_app(dead).test_client()
    started = time.monotonic()
    response = http.post(CHAT, json={"model": "m", "messages": MESSAGES})
    assert_openai_error(response, 503)
    assert time.monotonic() - started < 2.0
    assert_openai_error(http.get("/health"), 503)
