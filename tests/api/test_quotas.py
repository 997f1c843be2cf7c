"""Per-key quotas on what a key keeps (api/limits/quotas.py), on the in-process app and the
session's real Redis: files and their bytes, stored responses, batches kept and open, open
background responses and Idempotency-Keys; each refused in OpenAI's shape (Anthropic's on the
Message Batches route) while another key goes on creating."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient
from redis import Redis
from redis.client import PubSub
from rq.job import Job
from werkzeug.test import TestResponse

from api import create_app
from api.http.auth import owner_id
from api.limits.quotas import Quotas, Usage, quotas
from api.routes.batch import files
from shared.queue.config import Settings
from shared.queue.keys import Keys
from shared.wire.errors import RateLimitError
from tests.api.test_messages import assert_anthropic_error
from tests.support import (
    MODEL,
    assert_openai_error,
    batch_body,
    post_file,
    settled,
    taken_in,
)

ALICE = {"Authorization": "Bearer sk-alice"}
BOB = {"Authorization": "Bearer sk-bob"}
BACKGROUND = {"model": MODEL, "input": "hi", "background": True}
COMPLETION_LINE = (
    b'{"custom_id": "1", "method": "POST", "url": "/v1/completions", '
    b'"body": {"model": "' + MODEL.encode() + b'", "prompt": "hi", "max_tokens": 3}}\n'
)


def keyed_app(app_settings: Settings, **quotas: int) -> Flask:
    """The app with the keys sk-alice and sk-bob, under `quotas` (QuotaSettings' fields)."""
    keyed = Settings(api_keys="sk-alice,sk-bob").api_keys
    return create_app(app_settings.model_copy(update={"api_keys": keyed, **quotas}))


@contextmanager
def quotas_under(app_settings: Settings, **limits: int) -> Iterator[Quotas]:
    """The quotas of a keyed app under `limits`, in its app context."""
    with keyed_app(app_settings, **limits).app_context():
        yield quotas()


def assert_over_quota(reply: TestResponse, param: str | None = None) -> None:
    """OpenAI's 429 for a quota no wait restores, which its SDK is told not to retry."""
    assert_openai_error(reply, 429, param)
    error = reply.get_json()["error"]
    assert (error["type"], error["code"]) == ("insufficient_quota", "insufficient_quota")
    assert reply.headers["x-should-retry"] == "false"


def assert_over_cap(reply: TestResponse, kind: str) -> None:
    """The 429 of a cap on what a key runs at once: some ends soon, so it says when to retry."""
    assert_openai_error(reply, 429)
    error = reply.get_json()["error"]
    assert (error["type"], error["code"]) == (kind, "rate_limit_exceeded")
    assert int(reply.headers["Retry-After"]) >= 1


def test_a_key_at_its_file_quota_is_refused_and_another_key_still_uploads(
    app_settings: Settings,
) -> None:
    http = keyed_app(app_settings, quota_files=2).test_client()
    for _ in range(2):
        assert post_file(http, b"{}\n", headers=ALICE).status_code == 200
    assert_over_quota(post_file(http, b"{}\n", headers=ALICE))
    assert post_file(http, b"{}\n", headers=BOB).status_code == 200


def test_a_keys_files_bytes_are_its_quota_and_a_deleted_file_gives_them_back(
    app_settings: Settings,
) -> None:
    http = keyed_app(app_settings, quota_file_bytes=1000).test_client()
    first = post_file(http, b"x" * 600, headers=ALICE).get_json()["id"]
    refused = post_file(http, b"x" * 600, headers=ALICE)
    assert_over_quota(refused, param="file")
    assert "1000 bytes" in refused.get_json()["error"]["message"]
    assert http.delete(f"/v1/files/{first}", headers=ALICE).status_code == 200
    assert post_file(http, b"x" * 600, headers=ALICE).status_code == 200


def test_a_batch_output_file_is_counted_but_never_refused(app_settings: Settings) -> None:
    app = keyed_app(app_settings, quota_files=2)
    http = app.test_client()
    uploaded = [post_file(http, b"{}\n", headers=ALICE).get_json()["id"] for _ in range(2)]
    with app.test_request_context("/v1/files", headers=ALICE):
        app.preprocess_request()  # the key check: the request's owner is alice
        files.store().create(owner_id(), "batch_out.jsonl", "batch_output", b"{}\n")
    assert http.delete(f"/v1/files/{uploaded[0]}", headers=ALICE).status_code == 200
    assert_over_quota(post_file(http, b"{}\n", headers=ALICE))  # the output is one of the two


def test_an_entry_past_its_hold_stops_counting_without_any_callback(
    app_settings: Settings, redis: Redis, keys: Keys
) -> None:
    with quotas_under(app_settings, quota_files=2) as held:
        held.take("carol", Usage("files", "file-kept", size=5))
        held.take("carol", Usage("files", "file-short", size=10, hold_s=0.05))
        time.sleep(0.1)  # the file expired with its hold: nobody told the quota
        held.take("carol", Usage("files", "file-next", size=7))
    assert redis.zrange(keys.quota("carol", "files"), 0, -1) == [b"file-kept", b"file-next"]
    assert redis.hget(keys.usage("carol", "files"), "total") == b"12"


def test_a_files_bytes_go_with_it_whatever_else_its_key_keeps_longer(
    app_settings: Settings,
) -> None:
    with quotas_under(app_settings, quota_file_bytes=1000) as held:
        held.take("erin", Usage("files", "file-short", size=600, hold_s=0.05))
        held.take("erin", Usage("responses", "resp_kept"))  # kept a day
        time.sleep(0.1)  # the file and every entry of its kind expired at once
        held.take("erin", Usage("files", "file-next", size=600))


def test_a_key_at_its_stored_responses_quota_is_refused_until_it_deletes_one(
    app_settings: Settings, stand_in: tuple[Keys, PubSub]
) -> None:
    http = keyed_app(app_settings, quota_responses=1).test_client()
    first = http.post("/v1/responses", json=BACKGROUND, headers=ALICE)
    assert first.status_code == 200, first.get_data(as_text=True)
    assert_over_quota(http.post("/v1/responses", json=BACKGROUND, headers=ALICE))
    assert http.post("/v1/responses", json=BACKGROUND, headers=BOB).status_code == 200
    response_id = first.get_json()["id"]
    assert http.delete(f"/v1/responses/{response_id}", headers=ALICE).status_code == 200
    assert http.post("/v1/responses", json=BACKGROUND, headers=ALICE).status_code == 200


def test_open_background_responses_are_capped_per_key_until_one_ends_or_is_cancelled(
    app_settings: Settings, redis: Redis, stand_in: tuple[Keys, PubSub]
) -> None:
    http = keyed_app(app_settings, quota_background=1).test_client()
    first = http.post("/v1/responses", json=BACKGROUND, headers=ALICE).get_json()["id"]
    assert_over_cap(
        http.post("/v1/responses", json=BACKGROUND, headers=ALICE), "background_responses"
    )
    assert http.post("/v1/responses", json=BACKGROUND, headers=BOB).status_code == 200
    redis.hset(Job.key_for(first), "status", "finished")  # as its worker ends it
    second = http.post("/v1/responses", json=BACKGROUND, headers=ALICE)
    assert second.status_code == 200
    assert_over_cap(
        http.post("/v1/responses", json=BACKGROUND, headers=ALICE), "background_responses"
    )
    cancelled = http.post(f"/v1/responses/{second.get_json()['id']}/cancel", headers=ALICE)
    assert cancelled.get_json()["status"] == "cancelled"
    assert http.post("/v1/responses", json=BACKGROUND, headers=ALICE).status_code == 200


def test_a_background_response_held_a_moment_ago_counts_before_its_job_is_queued(
    app_settings: Settings,
) -> None:
    with quotas_under(app_settings, quota_background=1) as held:
        held.take("dave", Usage("background", "resp_notyetqueued"))  # no RQ job yet
        with pytest.raises(RateLimitError):
            held.take("dave", Usage("background", "resp_next"))


def _message_batch(**params: Any) -> dict[str, Any]:
    body = {"model": MODEL, "max_tokens": 3, "messages": [{"role": "user", "content": "hi"}]}
    return {"requests": [{"custom_id": "a", "params": {**body, **params}}]}


def test_a_key_at_its_batch_quota_is_refused_in_openais_shape_and_in_anthropics(
    app_settings: Settings, stand_in: tuple[Keys, PubSub]
) -> None:
    http = keyed_app(app_settings, quota_batches=1).test_client()
    file_id = post_file(http, b"not json\n", headers=ALICE).get_json()["id"]
    failed = http.post("/v1/batches", json=batch_body(file_id), headers=ALICE)
    assert failed.get_json()["status"] == "validating"  # it will fail; kept, it counts
    assert_over_quota(http.post("/v1/batches", json=batch_body(file_id), headers=ALICE))
    refused = http.post("/v1/messages/batches", json=_message_batch(), headers=ALICE)
    assert_anthropic_error(refused, 429, "rate_limit_error", naming="batches")
    taken = http.post("/v1/messages/batches", json=_message_batch(), headers=BOB)
    assert taken.status_code == 200, taken.get_data(as_text=True)


def test_open_batches_are_capped_per_key_until_one_ends(
    app_settings: Settings, redis: Redis, stand_in: tuple[Keys, PubSub]
) -> None:
    http = keyed_app(app_settings, quota_open_batches=1).test_client()
    file_id = post_file(http, COMPLETION_LINE, headers=ALICE).get_json()["id"]
    first = http.post("/v1/batches", json=batch_body(file_id), headers=ALICE).get_json()
    assert first["status"] == "validating"
    assert_over_cap(
        http.post("/v1/batches", json=batch_body(file_id), headers=ALICE), "open_batches"
    )
    http.post(f"/v1/batches/{first['id']}/cancel", headers=ALICE)
    taken_in(redis, stand_in[0], first["id"])  # it ends once its intake has stopped
    assert settled(http, first["id"], headers=ALICE)["status"] == "cancelled"
    assert http.post("/v1/batches", json=batch_body(file_id), headers=ALICE).status_code == 200


def keyed_upload(http: FlaskClient) -> Callable[[str, dict[str, str]], TestResponse]:
    """An upload to `http` under an Idempotency-Key, as one key or another."""

    def upload(key: str, who: dict[str, str]) -> TestResponse:
        return post_file(http, b"{}\n", headers={**who, "Idempotency-Key": key})

    return upload


def test_idempotency_records_are_capped_per_key_and_a_replay_takes_no_place(
    app_settings: Settings,
) -> None:
    http = keyed_app(app_settings, quota_idempotency_keys=1).test_client()
    upload = keyed_upload(http)
    assert upload("k1", ALICE).status_code == 200
    replayed = upload("k1", ALICE)
    assert replayed.status_code == 200 and replayed.headers["Idempotent-Replayed"] == "true"
    assert_over_quota(upload("k2", ALICE), param="Idempotency-Key")
    assert post_file(http, b"{}\n", headers=ALICE).status_code == 200  # without a key: no record
    assert upload("k2", BOB).status_code == 200


def test_without_keys_the_one_local_owner_has_the_quotas(app_settings: Settings) -> None:
    http = create_app(app_settings.model_copy(update={"quota_files": 1})).test_client()
    assert post_file(http, b"{}\n").status_code == 200
    assert_over_quota(post_file(http, b"{}\n"))
