"""The order of a model's interactive queue (shared/queue/fair_order.py), on the session's real
Redis with a stand-in worker that takes nothing: callers take turns whatever they have queued, FIFO
within a turn, and a lower `priority` goes first. The queue stays RQ's list."""

from __future__ import annotations

import threading

from flask.testing import FlaskClient
from redis import Redis
from redis.client import PubSub

from shared.queue.keys import Keys
from tests.support import CHAT, MODEL, rq_job, rq_queue
from worker.ops.cluster import wait_until


def queued_by(
    impatient_http: FlaskClient, redis: Redis, keys: Keys, asks: list[dict[str, object]]
) -> list[str]:
    """Send the requests one after another (each queued before the next is sent); the queue's
    order, as each job's share and priority."""
    queue = rq_queue(redis, keys.queue(MODEL))
    threads = []
    for n, extra in enumerate(asks, start=1):
        body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], **extra}
        threads.append(
            threading.Thread(target=impatient_http.post, args=(CHAT,), kwargs={"json": body})
        )
        threads[-1].start()
        # Queued (RQ appends it), then placed (PLACE records its place): one round trip apart.
        wait_until(lambda n=n: placed(redis, keys) == n, 5, "the request to be placed")  # type: ignore[misc]
    order = [_label(rq_job(redis, job_id).args[0]) for job_id in queue.get_job_ids()]
    for thread in threads:
        thread.join(timeout=10)
    return order


def placed(redis: Redis, keys: Keys) -> int:
    return int(redis.hlen(keys.order(MODEL)))


def _label(job: dict[str, object]) -> str:
    return f"{job['share']}:{job['priority']}"


def test_a_caller_with_many_queued_requests_takes_turns_with_a_newcomer(
    impatient_http: FlaskClient, redis: Redis, stand_in: tuple[Keys, PubSub]
) -> None:
    keys, _ = stand_in
    a = [{"user": "alice"}] * 4
    order = queued_by(impatient_http, redis, keys, [*a, {"user": "bob"}])
    alice, bob = order[0], order[1]
    assert alice != bob and order == [alice, bob, alice, alice, alice]


def test_a_lower_priority_value_goes_first(
    impatient_http: FlaskClient, redis: Redis, stand_in: tuple[Keys, PubSub]
) -> None:
    keys, _ = stand_in
    order = queued_by(impatient_http, redis, keys, [{"user": "u"}, {"user": "u", "priority": -5}])
    assert [label.split(":")[1] for label in order] == ["-5", "0"]
