"""Byte quotas on what a key keeps (api/limits/quotas.py), on the in-process app and the
session's real Redis: a stored response's record and a kept Idempotency-Key answer count their
bytes, deleting or expiry gives them back, and an upload is refused from its Content-Length
before its body is read."""

from __future__ import annotations

import io
import time

import pytest
from flask.testing import FlaskClient
from redis import Redis
from redis.client import PubSub
from werkzeug.test import TestResponse

from api.limits.quotas import Usage
from api.routes.batch.files import FORM_OVERHEAD_BYTES
from shared.queue.config import Settings
from shared.queue.keys import Keys
from shared.wire.errors import QuotaExceededError
from tests.api.test_quotas import (
    ALICE,
    BOB,
    assert_over_quota,
    keyed_app,
    keyed_upload,
    quotas_under,
)
from tests.support import MODEL, post_file

# A stored background response whose record is about 2,000 bytes, nearly all its instructions.
BIG = {"model": MODEL, "input": "hi", "background": True, "instructions": "x" * 2000}
MOST_BYTES = 3000  # room for one such record, not two


def test_a_key_at_its_response_bytes_is_refused_naming_the_setting_until_it_deletes_one(
    app_settings: Settings, stand_in: tuple[Keys, PubSub]
) -> None:
    http = keyed_app(app_settings, quota_response_bytes=MOST_BYTES).test_client()
    first = http.post("/v1/responses", json=BIG, headers=ALICE)
    assert first.status_code == 200, first.get_data(as_text=True)
    refused = http.post("/v1/responses", json=BIG, headers=ALICE)
    assert_over_quota(refused)
    assert "MLXQ_QUOTA_RESPONSE_BYTES" in refused.get_json()["error"]["message"]
    assert http.post("/v1/responses", json=BIG, headers=BOB).status_code == 200
    assert http.delete(f"/v1/responses/{first.get_json()['id']}", headers=ALICE).status_code == 200
    assert http.post("/v1/responses", json=BIG, headers=ALICE).status_code == 200


def test_a_stored_responses_bytes_come_back_when_it_expires(
    app_settings: Settings, redis: Redis, keys: Keys
) -> None:
    with quotas_under(app_settings, quota_response_bytes=MOST_BYTES) as held:
        held.take("frank", Usage("responses", "resp_kept", size=500))  # kept a day
        held.take("frank", Usage("responses", "resp_short", size=2000, hold_s=0.05))
        with pytest.raises(QuotaExceededError):
            held.ensure_room("frank", Usage("responses", "resp_next", size=2000))
        time.sleep(0.1)  # its record expired: nobody told the quota
        held.ensure_room("frank", Usage("responses", "resp_next", size=2000))
        assert redis.zscore(keys.quota("frank", "responses"), "resp_next") is None  # not held
        held.take("frank", Usage("responses", "resp_next", size=2000))


class _Unread(io.BytesIO):
    """A request body that records whether anything read it."""

    touched = False

    def read(self, size: int | None = -1) -> bytes:
        self.touched = True
        return super().read(size)

    def readline(self, size: int | None = -1) -> bytes:
        self.touched = True
        return super().readline(size)


def _claimed_upload(http: FlaskClient, body: _Unread, claimed: int) -> TestResponse:
    """An upload whose Content-Length says `claimed` bytes, whatever `body` holds."""
    return http.post(
        "/v1/files",
        input_stream=body,
        environ_overrides={"CONTENT_LENGTH": str(claimed)},  # a header, not the body's size
        content_type="multipart/form-data; boundary=b",
        headers=ALICE,
    )


def test_an_upload_past_the_keys_file_bytes_is_refused_from_its_length_before_its_body_is_read(
    app_settings: Settings,
) -> None:
    http = keyed_app(app_settings, quota_file_bytes=1000).test_client()
    body = _Unread(b"tiny")
    claimed = FORM_OVERHEAD_BYTES + 50 * 1024 * 1024  # a 50 MiB file, by its headers
    refused = _claimed_upload(http, body, claimed)
    assert_over_quota(refused, param="file")
    assert "MLXQ_QUOTA_FILE_BYTES" in refused.get_json()["error"]["message"]
    assert not body.touched
    assert post_file(http, b"x" * 600, headers=BOB).status_code == 200
    assert post_file(http, b"x" * 600, headers=ALICE).status_code == 200  # within it: taken


def test_kept_idempotency_answers_count_their_bytes_and_a_key_past_them_claims_no_new_one(
    app_settings: Settings,
) -> None:
    upload = keyed_upload(keyed_app(app_settings, quota_idempotency_bytes=1).test_client())
    assert upload("k1", ALICE).status_code == 200  # nothing kept yet: its answer passes the byte
    refused = upload("k2", ALICE)
    assert_over_quota(refused, param="Idempotency-Key")
    assert "MLXQ_QUOTA_IDEMPOTENCY_BYTES" in refused.get_json()["error"]["message"]
    assert upload("k1", ALICE).headers["Idempotent-Replayed"] == "true"  # kept, still answered
    assert upload("k2", BOB).status_code == 200


def test_an_upload_by_a_key_at_its_file_count_is_refused_before_its_body_is_read(
    app_settings: Settings,
) -> None:
    http = keyed_app(app_settings, quota_files=1).test_client()
    assert post_file(http, b"{}\n", headers=ALICE).status_code == 200
    body = _Unread(b"tiny")
    assert_over_quota(_claimed_upload(http, body, 50 * 1024 * 1024))
    assert not body.touched
    assert post_file(http, b"{}\n", headers=BOB).status_code == 200
