"""A model of the wrong kind is refused at once, on every route (shared/queue/model_kinds.py):
a chat, a completion, a response (background too) or a message naming an embedding model,
embeddings naming a chat model, and a batch line naming a model that cannot run it, which ends
at once as an error line. On the in-process app and the session's real Redis, with a stand-in
worker for each model that announced its kind as a worker does (`born`) and never takes a
job: whatever got queued would show in its lanes, and a request waiting on it would time out.
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from typing import Any

import pytest
from flask.testing import FlaskClient
from redis import Redis

from shared.queue.config import Settings
from shared.queue.jobs import LANES, GenerationJob
from shared.queue.keys import Keys
from shared.queue.model_kinds import refuse_wrong_kind
from shared.wire.errors import InvalidRequestError
from tests.support import (
    MESSAGES,
    MODEL,
    STAND_IN,
    assert_openai_error,
    ended_message_batch,
    settled,
    stand_in_worker,
    taken_in,
    waiting_in,
)
from worker.runtime.liveness.heartbeat import born

EMBEDDER = "all-MiniLM-L6-v2"
GENERATING: dict[str, dict[str, Any]] = {
    "/v1/chat/completions": {"messages": MESSAGES, "max_tokens": 4},
    "/v1/completions": {"prompt": "hi", "max_tokens": 4},
    "/v1/responses": {"input": "hi", "max_output_tokens": 16},
}


@pytest.fixture
def fleet(redis: Redis, app_settings: Settings) -> Iterator[Keys]:
    """A live chat model and a live embedding model, each of whose kind its worker announced."""
    keys = Keys(app_settings.namespace)
    with stand_in_worker(redis, keys, MODEL), stand_in_worker(redis, keys, EMBEDDER):
        born(redis, keys, STAND_IN, MODEL, "chat")
        born(redis, keys, STAND_IN, EMBEDDER, "embedding")
        yield keys


def queued(redis: Redis, keys: Keys, model: str) -> int:
    """The jobs waiting in any of the model's lanes."""
    return sum(waiting_in(redis, keys, model, lane) for lane in LANES)


@pytest.mark.parametrize(
    ("path", "body"),
    [
        *GENERATING.items(),
        ("/v1/responses", {**GENERATING["/v1/responses"], "background": True}),
        ("/v1/chat/completions", {**GENERATING["/v1/chat/completions"], "service_tier": "flex"}),
    ],
    ids=["chat", "completions", "responses", "background-response", "flex-chat"],
)
def test_a_generation_route_refuses_an_embedding_model_at_once_naming_model(
    impatient_http: FlaskClient, redis: Redis, fleet: Keys, path: str, body: dict[str, Any]
) -> None:
    reply = impatient_http.post(path, json={"model": EMBEDDER, **body})
    assert_openai_error(reply, 400, "model")
    assert "embedding model" in reply.get_json()["error"]["message"]
    assert queued(redis, fleet, EMBEDDER) == 0


def test_messages_refuses_an_embedding_model_at_once_in_anthropics_shape(
    impatient_http: FlaskClient, redis: Redis, fleet: Keys
) -> None:
    body = {"model": EMBEDDER, "max_tokens": 4, "messages": MESSAGES}
    reply = impatient_http.post("/v1/messages", json=body)
    assert reply.status_code == 400
    error = reply.get_json()
    assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error"
    assert "embedding model" in error["error"]["message"]
    assert queued(redis, fleet, EMBEDDER) == 0


def test_embeddings_refuses_a_chat_model_at_once_naming_model(
    impatient_http: FlaskClient, redis: Redis, fleet: Keys
) -> None:
    reply = impatient_http.post("/v1/embeddings", json={"model": MODEL, "input": "hello"})
    assert_openai_error(reply, 400, "model")
    assert "chat model" in reply.get_json()["error"]["message"]
    assert queued(redis, fleet, MODEL) == 0


def test_models_lists_each_model_with_the_kind_its_worker_announced(
    http: FlaskClient, fleet: Keys
) -> None:
    kinds = {m["id"]: m["kind"] for m in http.get("/v1/models").get_json()["data"]}
    assert kinds == {MODEL: "chat", EMBEDDER: "embedding"}


def upload(http: FlaskClient, lines: list[dict[str, Any]]) -> str:
    data = "\n".join(json.dumps(line) for line in lines).encode()
    form = {"purpose": "batch", "file": (io.BytesIO(data), "in.jsonl")}
    created = http.post("/v1/files", data=form)
    assert created.status_code == 200, created.get_data(as_text=True)
    file_id: str = created.get_json()["id"]
    return file_id


def chat_line(custom_id: str, model: str) -> dict[str, Any]:
    body = {"model": model, "messages": MESSAGES, "max_tokens": 4}
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions", "body": body}


def create_batch(
    http: FlaskClient, redis: Redis, keys: Keys, lines: list[dict[str, Any]]
) -> dict[str, Any]:
    """The batch of `lines` once its intake process has taken them in."""
    body = {
        "input_file_id": upload(http, lines),
        "endpoint": "/v1/chat/completions",
        "completion_window": "24h",
    }
    reply = http.post("/v1/batches", json=body)
    assert reply.status_code == 200, reply.get_data(as_text=True)
    taken_in(redis, keys, reply.get_json()["id"])
    return settled(http, reply.get_json()["id"])


def test_a_batch_line_naming_an_embedding_model_ends_at_once_as_an_error_line(
    http: FlaskClient, redis: Redis, fleet: Keys
) -> None:
    batch = create_batch(
        http, redis, fleet, [chat_line("runs", MODEL), chat_line("cannot", EMBEDDER)]
    )
    assert batch["status"] == "in_progress"
    assert batch["request_counts"] == {"total": 2, "completed": 0, "failed": 1}
    assert queued(redis, fleet, EMBEDDER) == 0  # nothing waits for a worker that cannot take it
    assert queued(redis, fleet, MODEL) == 1


def test_a_batch_whose_every_line_names_an_embedding_model_ends_with_its_error_file(
    http: FlaskClient, redis: Redis, fleet: Keys
) -> None:
    lines = [chat_line("a", EMBEDDER), chat_line("b", EMBEDDER)]
    batch = create_batch(http, redis, fleet, lines)  # reading it settles it, finalized elsewhere
    assert batch["status"] == "completed"
    assert batch["request_counts"] == {"total": 2, "completed": 0, "failed": 2}
    content = http.get(f"/v1/files/{batch['error_file_id']}/content").get_data(as_text=True)
    lines = [json.loads(line) for line in content.splitlines()]
    assert [line["custom_id"] for line in lines] == ["a", "b"]
    for line in lines:
        assert line["response"]["status_code"] == 400
        error = line["response"]["body"]["error"]
        assert error["param"] == "model" and "embedding model" in error["message"]
    assert queued(redis, fleet, EMBEDDER) == 0


def test_a_message_batch_request_naming_an_embedding_model_ends_errored(
    http: FlaskClient, redis: Redis, fleet: Keys
) -> None:
    params = {"model": EMBEDDER, "max_tokens": 4, "messages": MESSAGES}
    created = http.post(
        "/v1/messages/batches", json={"requests": [{"custom_id": "e", "params": params}]}
    )
    assert created.status_code == 200, created.get_data(as_text=True)
    batch_id = created.get_json()["id"]
    taken_in(redis, fleet, batch_id)
    batch = ended_message_batch(http, batch_id)
    assert batch["request_counts"]["errored"] == 1
    results = http.get(f"/v1/messages/batches/{batch_id}/results").get_data(as_text=True)
    (result,) = [json.loads(line) for line in results.splitlines()]
    assert result["custom_id"] == "e" and result["result"]["type"] == "errored"
    assert "embedding model" in json.dumps(result["result"]["error"])
    assert queued(redis, fleet, EMBEDDER) == 0


def test_a_model_whose_kind_was_never_announced_is_left_to_its_worker() -> None:
    job = GenerationJob(job_id="chatcmpl-1", model=EMBEDDER, messages=MESSAGES)
    refuse_wrong_kind(job, None)  # an older worker's model: its worker still refuses
    refuse_wrong_kind(job, "chat")
    with pytest.raises(InvalidRequestError, match="embedding model"):
        refuse_wrong_kind(job, "embedding")
