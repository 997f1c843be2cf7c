"""/v1/fleet per caller (api/routes/fleet.py), on the real Redis with a worker's report and
recent jobs written as a worker writes them: a key sees the models, their queues and its own
jobs, without the workers; an operator key (MLXQ_ADMIN_KEYS) sees the whole fleet, and so does
the one local user of an API without keys."""

from __future__ import annotations

import io
import time
from collections.abc import Iterator

import pytest
from flask import Flask
from pydantic import SecretStr
from redis import Redis

from api import create_app
from api.http.auth import owner_of_key
from shared.observe.fleet import PLACEMENT
from shared.observe.metrics import JobRecord, record_job
from shared.queue.config import Settings
from shared.queue.keys import Keys
from tests.support import MODEL, announce, assert_openai_error

ALICE, BOB, OPERATOR = "sk-alice-0a1b2c", "sk-bob-3d4e5f", "sk-operator-6a7b8c"
SECRET = "the owners' secret"
WORKER = "gpu-host-7.4242"
LINE = b'{"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": {}}\n'


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def owner(key: str) -> str:
    return owner_of_key(key, SECRET.encode())


@pytest.fixture
def fleet(app_settings: Settings, redis: Redis) -> Iterator[Settings]:
    """A live worker's report and one finished job of each of Alice, Bob and the operator."""
    keys = Keys(app_settings.namespace)
    presence = redis.pubsub()
    presence.subscribe(keys.presence(WORKER))
    announce(redis, keys, WORKER, 1, time.time(), app_settings.heartbeat_s, host="gpu-host-7")
    pipe = redis.pipeline()
    for job_id, key in (("job-alice", ALICE), ("job-bob", BOB), ("job-op", OPERATOR)):
        record_job(pipe, keys, _record(job_id, owner(key)))
    pipe.execute()
    yield app_settings
    presence.close()  # the worker's process ends


def _record(job_id: str, owner: str) -> JobRecord:
    return JobRecord(
        job_id=job_id,
        model=MODEL,
        lane="interactive",
        worker=WORKER,
        owner=owner,
        finish_reason="error",
        prompt_tokens=10,
        completion_tokens=2,
        cached_tokens=0,
        enqueued_at=100.0,
        started_at=100.5,
        first_token_at=101.0,
        ended_at=102.0,
        error=f"an error only {job_id}'s owner may read",
    )


def keyed_app(settings: Settings) -> Flask:
    update = {
        "api_keys": Settings(api_keys=f"{ALICE},{BOB}").api_keys,
        "admin_keys": Settings(admin_keys=OPERATOR).admin_keys,
        "owner_secret": SecretStr(SECRET),
    }
    return create_app(settings.model_copy(update=update))


def test_a_key_sees_its_own_jobs_and_the_queues_but_no_other_keys_jobs_workers_or_placement(
    fleet: Settings,
) -> None:
    response = keyed_app(fleet).test_client().get("/v1/fleet", headers=bearer(ALICE))
    assert response.status_code == 200
    view = response.get_json()
    assert view["scope"] == "owner"
    assert [job["job_id"] for job in view["recent_jobs"]] == ["job-alice"]
    (job,) = view["recent_jobs"]
    assert job["owner"] == owner(ALICE) and job["worker"] == ""
    assert view["workers"] == []
    assert [(m["model"], m["live_workers"]) for m in view["models"]] == [(MODEL, 1)]
    assert [m["placement"] for m in view["models"]] == [{}]  # counts other keys' prompts move
    text = response.get_data(as_text=True)
    for foreign in ("job-bob", "job-op", owner(BOB), owner(OPERATOR), "gpu-host-7"):
        assert foreign not in text


def test_an_operator_key_sees_every_keys_jobs_and_the_workers(fleet: Settings) -> None:
    view = keyed_app(fleet).test_client().get("/v1/fleet", headers=bearer(OPERATOR)).get_json()
    assert view["scope"] == "fleet"
    assert [job["job_id"] for job in view["recent_jobs"]] == ["job-op", "job-bob", "job-alice"]
    assert [(w["worker_id"], w["host"]) for w in view["workers"]] == [(WORKER, "gpu-host-7")]
    assert [sorted(m["placement"]) for m in view["models"]] == [sorted(PLACEMENT)]


def test_a_keys_recent_count_is_of_its_own_jobs(fleet: Settings) -> None:
    http = keyed_app(fleet).test_client()
    view = http.get("/v1/fleet?recent=1", headers=bearer(ALICE)).get_json()
    assert [job["job_id"] for job in view["recent_jobs"]] == ["job-alice"]  # not the fleet's last
    assert http.get("/v1/fleet?recent=0", headers=bearer(ALICE)).get_json()["recent_jobs"] == []


def test_without_keys_the_local_user_is_the_operator(fleet: Settings) -> None:
    view = create_app(fleet).test_client().get("/v1/fleet").get_json()
    assert view["scope"] == "fleet"
    assert len(view["recent_jobs"]) == 3 and len(view["workers"]) == 1


def test_an_operator_key_is_a_key_on_every_route_with_an_owner_of_its_own(
    fleet: Settings,
) -> None:
    http = keyed_app(fleet).test_client()
    body = {"model": "no-such-model", "messages": [{"role": "user", "content": "hi"}]}
    refused = http.post("/v1/chat/completions", json=body, headers=bearer(OPERATOR))
    assert_openai_error(refused, 404)  # past the key check: the model has no worker
    assert http.get("/v1/models", headers=bearer(OPERATOR)).status_code == 200
    assert_openai_error(http.get("/v1/fleet", headers=bearer("sk-operator")), 401)
    made = http.post(
        "/v1/files",
        data={"purpose": "batch", "file": (io.BytesIO(LINE), "in.jsonl")},
        headers=bearer(OPERATOR),
    )
    assert made.status_code == 200, made.get_data(as_text=True)
    file_id = made.get_json()["id"]
    # An operator's stored objects are its own, as any key's: Alice gets a 404.
    assert_openai_error(http.get(f"/v1/files/{file_id}", headers=bearer(ALICE)), 404)
    assert http.get(f"/v1/files/{file_id}", headers=bearer(OPERATOR)).status_code == 200
