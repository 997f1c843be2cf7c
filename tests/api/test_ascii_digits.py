"""Every number a client writes as a string is ASCII digits only (shared/wire/digits.py):
`logit_bias` keys, query integers, the upload form's `expires_after[seconds]`, `Last-Event-ID`
and `anthropic-version`. Other scripts' digits, superscripts, signs, underscores and fractions
are a 400 naming the parameter (or, for `Last-Event-ID`, no id), never a 500 nor another
number. On the in-process app, the session's real Redis and a stand-in worker."""

from __future__ import annotations

import io

import pytest
from flask.testing import FlaskClient
from redis import Redis
from redis.client import PubSub

from shared.queue.keys import Keys
from shared.wire.digits import parse_integer
from tests.support import MESSAGES, MODEL, assert_openai_error, rq_queue

# Written as escapes, the digits being what the test is about:
ARABIC_12 = "\u0661\u0662"  # Arabic-Indic 1 and 2: int() reads 12
FULLWIDTH_12 = "\uff11\uff12"  # fullwidth 1 and 2: int() reads 12
SQUARED = "\u00b2"  # superscript 2: str.isdigit() accepts it, int() raises
NOT_ASCII = [SQUARED, ARABIC_12, FULLWIDTH_12, "+12", "1_2", " 12", "12.0", "", "-"]


@pytest.mark.parametrize("text", NOT_ASCII)
def test_only_ascii_digits_are_an_integer(text: str) -> None:
    assert parse_integer(text) is None
    assert parse_integer("12") == 12 and parse_integer("-1", signed=True) == -1
    assert parse_integer("-1") is None and parse_integer("1234", max_digits=3) is None


@pytest.mark.parametrize("key", NOT_ASCII)
@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/chat/completions", {"messages": MESSAGES}),
        ("/v1/completions", {"prompt": "hi"}),
    ],
    ids=["chat", "completions"],
)
def test_a_logit_bias_key_not_in_ascii_digits_is_a_400_naming_logit_bias(
    http: FlaskClient,
    redis: Redis,
    stand_in: tuple[Keys, PubSub],
    path: str,
    body: dict[str, object],
    key: str,
) -> None:
    keys, _ = stand_in
    reply = http.post(path, json={"model": MODEL, **body, "logit_bias": {key: 1}})
    assert_openai_error(reply, 400)
    assert reply.get_json()["error"]["param"].startswith("logit_bias")
    assert rq_queue(redis, keys.queue(MODEL)).count == 0


@pytest.mark.parametrize("limit", [SQUARED, ARABIC_12, "+5", "5.0"])
def test_a_query_integer_not_in_ascii_digits_is_a_400_naming_it(
    http: FlaskClient, limit: str
) -> None:
    assert_openai_error(http.get("/v1/batches", query_string={"limit": limit}), 400, "limit")


@pytest.mark.parametrize("seconds", [FULLWIDTH_12 + "00", "+3600", "3_600", "3600.0", " 3600"])
def test_an_upload_lifetime_not_in_ascii_digits_is_a_400_naming_expires_after(
    http: FlaskClient, seconds: str
) -> None:
    form = {
        "purpose": "batch",
        "expires_after[anchor]": "created_at",
        "expires_after[seconds]": seconds,
        "file": (io.BytesIO(b"{}\n"), "in.jsonl"),
    }
    assert_openai_error(http.post("/v1/files", data=form), 400, "expires_after")


def test_an_upload_lifetime_in_ascii_digits_is_taken(http: FlaskClient) -> None:
    form = {
        "purpose": "batch",
        "expires_after[anchor]": "created_at",
        "expires_after[seconds]": "3600",
        "file": (io.BytesIO(b"{}\n"), "in.jsonl"),
    }
    created = http.post("/v1/files", data=form).get_json()
    assert created["expires_at"] - created["created_at"] == 3600


def test_a_last_event_id_not_in_ascii_digits_names_no_event_and_the_stream_replays_all(
    http: FlaskClient, stand_in: tuple[Keys, PubSub]
) -> None:
    created = http.post("/v1/responses", json={"model": MODEL, "input": "hi", "background": True})
    assert created.status_code == 200, created.get_data(as_text=True)
    path = f"/v1/responses/{created.get_json()['id']}?stream=true"
    reply = http.get(path, headers={"Last-Event-ID": SQUARED}, buffered=False)
    try:
        assert reply.status_code == 200  # was a 500: isdigit() took it, then int() raised
        assert reply.mimetype == "text/event-stream"
    finally:
        reply.close()


def test_an_anthropic_version_not_in_ascii_digits_is_a_400_naming_it(http: FlaskClient) -> None:
    body = {"model": MODEL, "max_tokens": 4, "messages": MESSAGES}
    date = "-".join(ARABIC_12 * n for n in (2, 1, 1))  # a version date in Arabic-Indic digits
    reply = http.post("/v1/messages", json=body, headers={"anthropic-version": date})
    assert reply.status_code == 400
    assert reply.get_json()["error"]["type"] == "invalid_request_error"
    assert "anthropic-version" in reply.get_json()["error"]["message"]
