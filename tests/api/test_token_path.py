"""Plumbing of the token path in the API process, on the session's real Redis and no worker:
- the relay delivers a job's events from its process's reply channel in order from the moment
  `subscribe` returns, each to its own job, and ends every open subscription with an error
  when its Redis connection drops;
- a stream that receives an event it cannot decode ends with an OpenAI error frame, after the
  tokens that came before it;
- a job whose worker keeps saying it is alive (a long prompt's prefill) waits past the wait
  between events (MLXQ_EVENT_TIMEOUT_S), and one that says nothing does not;
- the job watch ends a request whose job can no longer finish: queued when its model's last
  worker dies (404 model_not_found), or started by a worker that dies (worker_lost).
A stand-in worker (a heartbeat and a presence subscription, tests/support.py) makes the API
admit requests; closing its presence connection is its death."""

from __future__ import annotations

import json
import threading
import time

import pytest
from flask.testing import FlaskClient
from redis import Redis
from redis.client import PubSub
from werkzeug.test import TestResponse

from api import create_app
from api.queue.relay import EventRelay
from shared.queue.config import Settings
from shared.queue.keys import Keys
from shared.wire.chat.completions import Usage
from shared.wire.events import (
    AliveEvent,
    DoneEvent,
    StartedEvent,
    TokenEvent,
    decode_event,
    encode_event,
    encode_frame,
)
from tests.support import CHAT, MODEL, STAND_IN, publish_as_worker, rq_job, rq_queue
from worker.ops.cluster import wait_until


@pytest.fixture
def relay(redis_url: str, app_settings: Settings) -> EventRelay:
    """A relay whose connections carry the test namespace as their name (CLIENT SETNAME), so
    that a test drops its connection and no other on the session's Redis."""
    own = Redis.from_url(redis_url, client_name=app_settings.namespace)
    return EventRelay(own, Keys(app_settings.namespace).reply("api-test"))


def test_events_published_once_subscribe_returns_all_arrive_in_order(
    relay: EventRelay, redis: Redis
) -> None:
    sub = relay.subscribe("job-order")
    sent = [encode_event(TokenEvent(text=str(i))) for i in range(200)]
    for start in range(0, len(sent), 7):  # frames of several events each, as a worker's steps
        redis.publish(
            relay.channel, encode_frame(("job-order", e) for e in sent[start : start + 7])
        )
    got: list[bytes] = []
    deadline = time.monotonic() + 5
    while len(got) < len(sent) and time.monotonic() < deadline:
        got += sub.next_messages(0.5)
    assert got == sent
    relay.unsubscribe(sub)
    assert not relay.is_open(sub)


def test_one_frame_reaches_each_of_its_jobs_and_skips_jobs_nobody_waits_on(
    relay: EventRelay, redis: Redis
) -> None:
    a, b = relay.subscribe("job-a"), relay.subscribe("job-b")
    x, y, z = (encode_event(TokenEvent(text=t)) for t in "xyz")
    redis.publish(relay.channel, encode_frame([("job-a", x), ("job-gone", y), ("job-b", z)]))
    assert a.next_messages(5) == [x]
    assert b.next_messages(5) == [z]


def test_a_dropped_redis_connection_ends_every_open_subscription_with_an_error(
    relay: EventRelay, redis: Redis, app_settings: Settings
) -> None:
    subs = [relay.subscribe(f"job-{i}") for i in range(3)]
    pubsubs = redis.client_list(_type="pubsub")
    (own,) = [c["id"] for c in pubsubs if c["name"] == app_settings.namespace]
    redis.client_kill_filter(_id=own)
    for sub in subs:
        (message,) = sub.next_messages(5)
        event = decode_event(message)
        assert event.type == "error" and event.error.code == "backend_unavailable"  # type: ignore[union-attr]
        assert not relay.is_open(sub)
    again = relay.subscribe("job-after")  # and it listens again
    redis.publish(relay.channel, encode_frame([("job-after", encode_event(TokenEvent(text="x")))]))
    assert again.next_messages(5) == [encode_event(TokenEvent(text="x"))]


def test_an_undecodable_event_ends_the_stream_with_an_openai_error_frame(
    http: FlaskClient, redis: Redis, stand_in: tuple[Keys, PubSub]
) -> None:
    keys, _ = stand_in
    queue = rq_queue(redis, keys.queue(MODEL))

    def act_as_the_worker() -> None:
        wait_until(lambda: queue.count == 1, 10, "the job to be queued")
        job_id = queue.get_job_ids()[0]
        started, hello = StartedEvent(prompt_tokens=3), TokenEvent(text="Hello")
        publish_as_worker(redis, keys, job_id, encode_event(started), encode_event(hello))
        publish_as_worker(redis, keys, job_id, b"{not an event")

    worker = threading.Thread(target=act_as_the_worker, daemon=True)
    worker.start()
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": True}
    response = http.post(CHAT, json=body, buffered=False)
    frames = [line[6:] for line in response.get_data().split(b"\n") if line.startswith(b"data: ")]
    worker.join(timeout=5)
    assert response.status_code == 200
    texts = [json.loads(f)["choices"][0]["delta"].get("content") for f in frames[:-1]]
    assert "Hello" in texts
    error = json.loads(frames[-1])["error"]
    assert set(error) == {"message", "type", "param", "code"}


@pytest.mark.parametrize("alive", [True, False])
def test_a_job_said_alive_waits_past_the_event_timeout_and_a_silent_one_does_not(
    app_settings: Settings, redis: Redis, stand_in: tuple[Keys, PubSub], alive: bool
) -> None:
    keys, _ = stand_in
    http = create_app(app_settings.model_copy(update={"event_timeout_s": 1.0})).test_client()
    queue = rq_queue(redis, keys.queue(MODEL))

    def act_as_the_worker() -> None:
        wait_until(lambda: queue.count == 1, 10, "the job to be queued")
        job_id = queue.get_job_ids()[0]
        publish_as_worker(redis, keys, job_id, encode_event(StartedEvent(prompt_tokens=3)))
        for _ in range(6):  # 2.4 s of prefill, more than twice the wait between events
            time.sleep(0.4)
            if alive:
                publish_as_worker(redis, keys, job_id, encode_event(AliveEvent()))
        usage = Usage(prompt_tokens=3, completion_tokens=1, total_tokens=4)
        done = DoneEvent(finish_reason="stop", usage=usage)
        publish_as_worker(
            redis, keys, job_id, encode_event(TokenEvent(text="Paris")), encode_event(done)
        )

    worker = threading.Thread(target=act_as_the_worker, daemon=True)
    worker.start()
    reply = http.post(CHAT, json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}]})
    worker.join(timeout=10)
    if alive:
        assert reply.status_code == 200
        assert reply.get_json()["choices"][0]["message"]["content"] == "Paris"
    else:
        assert reply.get_json()["error"]["code"] == "timeout"


def _ask_in_the_background(http: FlaskClient) -> tuple[threading.Thread, list[TestResponse]]:
    replies: list[TestResponse] = []
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
    asking = threading.Thread(target=lambda: replies.append(http.post(CHAT, json=body)))
    asking.start()
    return asking, replies


def test_a_queued_request_whose_last_worker_dies_gets_a_404_within_the_heartbeat_window(
    http: FlaskClient, redis: Redis, stand_in: tuple[Keys, PubSub], app_settings: Settings
) -> None:
    keys, presence = stand_in
    asking, replies = _ask_in_the_background(http)
    queue = rq_queue(redis, keys.queue(MODEL))
    wait_until(lambda: queue.count == 1, 10, "the job to be queued")
    presence.close()  # the worker's process ends
    died = time.monotonic()
    asking.join(timeout=10)
    assert time.monotonic() - died < 3 * app_settings.heartbeat_s
    (reply,) = replies
    assert reply.status_code == 404 and reply.get_json()["error"]["code"] == "model_not_found"
    assert queue.count == 0  # and it was taken off the queue


def test_a_request_whose_worker_dies_while_running_it_gets_worker_lost(
    http: FlaskClient, redis: Redis, stand_in: tuple[Keys, PubSub]
) -> None:
    keys, presence = stand_in
    asking, replies = _ask_in_the_background(http)
    queue = rq_queue(redis, keys.queue(MODEL))
    wait_until(lambda: queue.count == 1, 10, "the job to be queued")
    job_id = queue.get_job_ids()[0]
    job = rq_job(redis, job_id)  # the stand-in takes the job, as a worker's slot does
    redis.hset(job.key, mapping={"status": "started", "worker_name": f"{STAND_IN}.0"})
    publish_as_worker(redis, keys, job_id, encode_event(StartedEvent(prompt_tokens=3)))
    presence.close()
    asking.join(timeout=10)
    (reply,) = replies
    assert reply.status_code >= 500 and reply.get_json()["error"]["code"] == "worker_lost"
