"""Every creating route takes a request of its key's per-minute limit (api/limits/rates.py):
generation requests, background responses, uploads, batches and message batches alike, and so
does count_tokens, which renders and counts a prompt on the API. Each
case holds whatever answer the first request gets (a 404 for a model no worker serves still took
its request) and a 429 for the second, with a key allowed one request a minute."""

from __future__ import annotations

import io
from collections.abc import Callable
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient
from redis.client import PubSub
from werkzeug.test import TestResponse

from api import create_app
from shared.queue.config import Settings
from shared.queue.keys import Keys
from tests.support import MESSAGES, MODEL, assert_openai_error, batch_body

LIMITED = {"Authorization": "Bearer sk-limited"}
# POST routes that change what exists without creating anything a key keeps or runs.
NOT_CREATING = {
    "/v1/responses/<response_id>/cancel",
    "/v1/batches/<batch_id>/cancel",
    "/v1/messages/batches/<batch_id>/cancel",
}


def _upload(http: FlaskClient) -> TestResponse:
    form = {"purpose": "batch", "file": (io.BytesIO(b"{}\n"), "in.jsonl")}
    return http.post("/v1/files", data=form, content_type="multipart/form-data", headers=LIMITED)


def _json(path: str, body: dict[str, Any]) -> Callable[[FlaskClient], TestResponse]:
    return lambda http: http.post(path, json=body, headers=LIMITED)


# The creating routes, each with a request; "m" is served by no worker.
CREATING: dict[str, Callable[[FlaskClient], TestResponse]] = {
    "/v1/chat/completions": _json("/v1/chat/completions", {"model": "m", "messages": MESSAGES}),
    "/v1/completions": _json("/v1/completions", {"model": "m", "prompt": "hi"}),
    "/v1/embeddings": _json("/v1/embeddings", {"model": "m", "input": "hi"}),
    "/v1/messages": _json("/v1/messages", {"model": "m", "max_tokens": 3, "messages": MESSAGES}),
    "/v1/responses": _json("/v1/responses", {"model": "m", "input": "hi"}),
    "background /v1/responses": _json(
        "/v1/responses", {"model": MODEL, "input": "hi", "background": True}
    ),
    "/v1/files": _upload,
    "/v1/batches": _json("/v1/batches", batch_body("file-none")),
    "/v1/messages/batches": _json("/v1/messages/batches", {"requests": []}),
    "/v1/messages/count_tokens": _json(
        "/v1/messages/count_tokens", {"model": "m", "messages": MESSAGES}
    ),
}


def _limited_app(app_settings: Settings) -> Flask:
    keyed = Settings(api_keys="sk-limited:rpm=1").api_keys
    return create_app(app_settings.model_copy(update={"api_keys": keyed}))


def test_every_post_route_that_creates_is_among_the_cases(app_settings: Settings) -> None:
    posts = {
        rule.rule
        for rule in _limited_app(app_settings).url_map.iter_rules()
        if "POST" in (rule.methods or set())
    }
    assert posts - NOT_CREATING == {case.removeprefix("background ") for case in CREATING}


@pytest.mark.parametrize("route", list(CREATING))
def test_a_creating_route_takes_a_request_of_its_keys_per_minute_limit(
    app_settings: Settings, stand_in: tuple[Keys, PubSub], route: str
) -> None:
    http = _limited_app(app_settings).test_client()
    first = CREATING[route](http)
    assert first.status_code != 429, first.get_data(as_text=True)
    assert first.headers["x-ratelimit-remaining-requests"] == "0"
    second = CREATING[route](http)
    if route.startswith("/v1/messages"):
        assert (
            second.status_code == 429 and second.get_json()["error"]["type"] == "rate_limit_error"
        )
    else:
        assert_openai_error(second, 429)
        assert second.get_json()["error"]["code"] == "rate_limit_exceeded"
    assert "Retry-After" in second.headers
