"""The Idempotency-Key contract of creating POSTs (api/stores/idempotency.py), on the in-process
app and a real Redis: the same key and request answer the first answer again, another request
is a 422, a try in flight a 409, a failed try leaves the key free, and keys are per caller."""

from __future__ import annotations

from typing import Any

from flask import Flask
from flask.testing import FlaskClient
from redis import Redis

from api import create_app
from api.stores.idempotency import IdempotencyStore, fingerprint
from shared.queue.config import Settings
from shared.queue.keys import Keys
from tests.support import assert_openai_error, batch_body, post_file

BAD_LINES = b"not json\n"


def _upload(http: FlaskClient, key: str, content: bytes = BAD_LINES, **headers: str) -> Any:
    return post_file(http, content, headers={"Idempotency-Key": key, **headers})


def test_the_same_upload_with_the_same_key_answers_the_first_file_again(
    http: FlaskClient,
) -> None:
    first = _upload(http, "k1")
    again = _upload(http, "k1")
    assert first.status_code == again.status_code == 200
    assert again.get_json() == first.get_json()
    assert again.headers["Idempotent-Replayed"] == "true"
    assert "Idempotent-Replayed" not in first.headers
    assert [f["id"] for f in http.get("/v1/files").get_json()["data"]] == [first.get_json()["id"]]


def test_the_same_key_with_another_body_is_a_422_naming_the_header(http: FlaskClient) -> None:
    assert _upload(http, "k2").status_code == 200
    other = _upload(http, "k2", content=b"other\n")
    assert_openai_error(other, 422, param="Idempotency-Key")
    assert other.get_json()["error"]["code"] == "idempotency_key_reused"
    assert len(http.get("/v1/files").get_json()["data"]) == 1


def test_a_try_that_failed_validation_leaves_the_key_free(http: FlaskClient) -> None:
    headers = {"Idempotency-Key": "k3"}
    refused = http.post("/v1/batches", json={"endpoint": "/v1/completions"}, headers=headers)
    assert_openai_error(refused, 400)
    file_id = _upload(http, "k3-file").get_json()["id"]
    created = http.post("/v1/batches", json=batch_body(file_id), headers=headers)
    assert created.status_code == 200
    assert "Idempotent-Replayed" not in created.headers


def test_a_try_while_the_first_is_in_flight_is_a_409_with_retry_after(
    http: FlaskClient, app_settings: Settings, redis: Redis
) -> None:
    file_id = _upload(http, "k4-file").get_json()["id"]
    body = batch_body(file_id)
    # The first try holds the key: claimed with this very request's fingerprint.
    with http.application.test_request_context(
        "/v1/batches", method="POST", json=body, headers={"Idempotency-Key": "k4"}
    ):
        asked = fingerprint()
    store = IdempotencyStore(redis, Keys(app_settings.namespace), "anonymous", 60)
    assert store.claim("k4", asked) is None
    busy = http.post("/v1/batches", json=body, headers={"Idempotency-Key": "k4"})
    assert_openai_error(busy, 409, param="Idempotency-Key")
    assert busy.get_json()["error"]["code"] == "idempotency_key_in_use"
    assert busy.headers["Retry-After"] == "1"
    assert http.get("/v1/batches").get_json()["data"] == []


def test_keys_are_per_caller(app_settings: Settings) -> None:
    keyed = app_settings.model_copy(update={"api_keys": Settings(api_keys="alice,bob").api_keys})
    app: Flask = create_app(keyed)
    http = app.test_client()
    alice = _upload(http, "shared", Authorization="Bearer alice")
    bob = _upload(http, "shared", Authorization="Bearer bob")
    assert alice.status_code == bob.status_code == 200
    assert alice.get_json()["id"] != bob.get_json()["id"]
    assert "Idempotent-Replayed" not in bob.headers


def test_a_streamed_request_with_a_key_is_a_400_naming_the_header(http: FlaskClient) -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    refused = http.post("/v1/chat/completions", json=body, headers={"Idempotency-Key": "k5"})
    assert_openai_error(refused, 400, param="Idempotency-Key")


def test_a_malformed_key_is_a_400_naming_the_header(http: FlaskClient) -> None:
    assert_openai_error(_upload(http, "x" * 256), 400, param="Idempotency-Key")
    assert_openai_error(_upload(http, " leading-space"), 400, param="Idempotency-Key")


def test_an_upload_with_a_nameless_part_and_a_key_is_a_400_not_a_500(http: FlaskClient) -> None:
    # A multipart part may omit its name (werkzeug reads it as None): found by the abuse fuzzing
    # (tests/api/test_key_isolation_fuzz.py), its fingerprint was a 500 once a key came with it.
    parts = [
        b'Content-Disposition: form-data; name="purpose"\r\n\r\nbatch',
        b"Content-Disposition: form-data\r\n\r\nnameless",
        b'Content-Disposition: form-data; name="file"; filename="in.jsonl"\r\n\r\n{}\n',
    ]
    body = b"".join(b"--XX\r\n" + part + b"\r\n" for part in parts) + b"--XX--\r\n"
    headers = {"Idempotency-Key": "k6", "Content-Type": "multipart/form-data; boundary=XX"}
    assert_openai_error(http.post("/v1/files", data=body, headers=headers), 400)
