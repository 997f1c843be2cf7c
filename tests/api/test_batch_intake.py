"""A batch's intake (api/stores/batch_feed.py) on the in-process app, a real Redis, a real intake
process and a stand-in worker that takes nothing, so every queued line stays queued: creating
answers `validating` at once, the lines are queued a chunk at a time as they pass, a line past
the limit fails the batch as it is reached, and a cancel drops the queued lines in one step."""

from __future__ import annotations

import json
from typing import Any

import pytest
from flask.testing import FlaskClient
from redis import Redis
from redis.client import PubSub
from rq.job import Job

from api import create_app
from api.stores.batch_feed import CHUNK_LINES
from shared.queue.config import Settings
from shared.queue.keys import Keys
from shared.wire.batch.batches import line_job_id
from tests.support import (
    CHAT,
    MODEL,
    batch_body,
    chat_line,
    post_file,
    queued_ids,
    settled,
    taken_in,
    waiting_in,
)

# More lines than one chunk, so a batch is queued in several.
LINES = 2 * CHUNK_LINES + 200


def _file(http: FlaskClient, count: int) -> str:
    lines = [chat_line(f"r{i}", "Hi", max_tokens=1) for i in range(count)]
    reply = post_file(http, "\n".join(json.dumps(line) for line in lines).encode())
    assert reply.status_code == 200, reply.get_data(as_text=True)
    file_id: str = reply.get_json()["id"]
    return file_id


def _create(http: FlaskClient, count: int) -> dict[str, Any]:
    reply = http.post("/v1/batches", json={**batch_body(_file(http, count)), "endpoint": CHAT})
    assert reply.status_code == 200, reply.get_data(as_text=True)
    batch: dict[str, Any] = reply.get_json()
    return batch


def _lane(redis: Redis, keys: Keys) -> int:
    return waiting_in(redis, keys, MODEL, "batch")


def test_a_batch_answers_validating_then_runs_with_every_line_queued(
    http: FlaskClient, redis: Redis, stand_in: tuple[Keys, PubSub]
) -> None:
    keys, _ = stand_in
    created = _create(http, LINES)
    assert created["status"] == "validating"
    assert created["request_counts"]["total"] == 0 and created["in_progress_at"] is None
    taken_in(redis, keys, created["id"])
    batch = http.get(f"/v1/batches/{created['id']}").get_json()
    assert batch["status"] == "in_progress" and batch["in_progress_at"] is not None
    assert batch["request_counts"] == {"total": LINES, "completed": 0, "failed": 0}
    assert batch["model"] == MODEL
    assert _lane(redis, keys) == LINES


def test_a_line_past_the_limit_fails_the_batch_as_it_is_reached(
    app_settings: Settings, redis: Redis, stand_in: tuple[Keys, PubSub]
) -> None:
    keys, _ = stand_in
    limit = 2 * CHUNK_LINES  # two chunks pass and are queued; the next line is one too many
    http = create_app(app_settings.model_copy(update={"batch_max_lines": limit})).test_client()
    created = _create(http, LINES)
    taken_in(redis, keys, created["id"])
    batch = http.get(f"/v1/batches/{created['id']}").get_json()
    assert batch["status"] == "failed" and batch["failed_at"] is not None
    error = batch["errors"]["data"][0]
    assert (error["code"], error["line"]) == ("too_many_requests", limit + 1)
    assert str(limit) in error["message"]
    assert _lane(redis, keys) == 0  # the lines it had queued are gone with it


def test_cancelling_drops_every_queued_line_and_its_job_in_one_step(
    http: FlaskClient, redis: Redis, stand_in: tuple[Keys, PubSub]
) -> None:
    keys, _ = stand_in
    other = _create(http, 3)  # another batch's lines on the same lane stay, in order
    created = _create(http, LINES)
    taken_in(redis, keys, other["id"])
    taken_in(redis, keys, created["id"])
    assert _lane(redis, keys) == LINES + 3
    cancelling = http.post(f"/v1/batches/{created['id']}/cancel").get_json()
    assert cancelling["status"] in ("cancelling", "cancelled")
    left = queued_ids(redis, keys, MODEL, "batch")
    assert left == [line_job_id(other["id"], i) for i in range(3)]
    assert not redis.exists(*(Job.key_for(line_job_id(created["id"], i)) for i in range(LINES)))
    batch = settled(http, created["id"])  # its finalization runs in a process of its own
    assert batch["status"] == "cancelled"
    assert batch["request_counts"] == {"total": LINES, "completed": 0, "failed": LINES}


@pytest.mark.parametrize("when", ["validating", "taken in"])
def test_a_message_batch_reads_in_progress_while_it_is_validated(
    http: FlaskClient, redis: Redis, stand_in: tuple[Keys, PubSub], when: str
) -> None:
    keys, _ = stand_in
    params = {"model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": "Hi"}]}
    requests = [{"custom_id": f"m{i}", "params": params} for i in range(3)]
    created = http.post("/v1/messages/batches", json={"requests": requests})
    assert created.status_code == 200, created.get_data(as_text=True)
    batch = created.get_json()
    if when == "taken in":
        taken_in(redis, keys, batch["id"])
        batch = http.get(f"/v1/messages/batches/{batch['id']}").get_json()
        assert batch["request_counts"]["processing"] == 3
    assert batch["processing_status"] == "in_progress" and batch["results_url"] is None


def test_a_message_batch_body_its_intake_refuses_is_the_creates_400_and_leaves_no_batch(
    http: FlaskClient, stand_in: tuple[Keys, PubSub]
) -> None:
    params = {"model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": "Hi"}]}
    twice = [{"custom_id": "same", "params": params}] * 2
    refused = http.post("/v1/messages/batches", json={"requests": twice})
    assert refused.status_code == 400, refused.get_data(as_text=True)
    error = refused.get_json()
    assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error"
    assert "same" in error["error"]["message"]
    assert http.get("/v1/messages/batches").get_json()["data"] == []


def test_a_line_that_asks_a_keep_alive_fails_alone_naming_it(
    http: FlaskClient, redis: Redis, stand_in: tuple[Keys, PubSub]
) -> None:
    """A batch does not decide how long a model every key shares stays loaded."""
    keys, _ = stand_in
    lines = [chat_line("plain", "Hi", max_tokens=1), chat_line("pinning", "Hi", max_tokens=1)]
    lines[1]["body"]["keep_alive"] = -1
    reply = post_file(http, "\n".join(json.dumps(line) for line in lines).encode())
    file_id = reply.get_json()["id"]
    created = http.post("/v1/batches", json={**batch_body(file_id), "endpoint": CHAT}).get_json()
    taken_in(redis, keys, created["id"])
    batch = http.get(f"/v1/batches/{created['id']}").get_json()
    assert batch["request_counts"] == {"total": 2, "completed": 0, "failed": 1}
    assert _lane(redis, keys) == 1  # the plain line is queued
