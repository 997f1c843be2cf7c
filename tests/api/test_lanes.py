"""The three lanes of a model (shared/queue/jobs.py), on the session's real Redis with a stand-in
worker: a request a client waits on goes to the interactive queue, one with OpenAI's
`service_tier: flex` and a background response to the background queue, and a worker's slots
take from the queues in that order, batch lines last (shared/queue/keys.py `lanes`)."""

from __future__ import annotations

import threading

from flask.testing import FlaskClient
from redis import Redis
from redis.client import PubSub

from shared.queue.keys import Keys
from tests.support import CHAT, MODEL, rq_queue
from worker.ops.cluster import wait_until

HI = [{"role": "user", "content": "hi"}]


def depths(redis: Redis, keys: Keys) -> list[int]:
    return [rq_queue(redis, name).count for name in keys.lanes(MODEL)]


def test_a_flex_request_waits_in_the_background_lane(
    impatient_http: FlaskClient, redis: Redis, stand_in: tuple[Keys, PubSub]
) -> None:
    keys, _ = stand_in
    body = {"model": MODEL, "messages": HI, "service_tier": "flex"}
    asking = threading.Thread(target=impatient_http.post, args=(CHAT,), kwargs={"json": body})
    asking.start()
    wait_until(lambda: depths(redis, keys) == [0, 1, 0], 5, "the flex request to be queued")
    asking.join(timeout=10)
    assert depths(redis, keys) == [0, 0, 0]  # withdrawn when it gave up


def test_a_background_response_waits_in_the_background_lane(
    impatient_http: FlaskClient, redis: Redis, stand_in: tuple[Keys, PubSub]
) -> None:
    keys, _ = stand_in
    reply = impatient_http.post(
        "/v1/responses", json={"model": MODEL, "input": "hi", "background": True}
    )
    assert reply.status_code == 200 and reply.get_json()["status"] == "queued"
    assert depths(redis, keys) == [0, 1, 0]


def test_slots_take_interactive_then_background_then_batch(stand_in: tuple[Keys, PubSub]) -> None:
    keys, _ = stand_in
    assert keys.lanes(MODEL) == [
        keys.queue(MODEL),
        keys.background_queue(MODEL),
        keys.batch_queue(MODEL),
    ]
