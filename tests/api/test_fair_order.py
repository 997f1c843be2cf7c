"""The order of a model's interactive queue (shared/queue/fair_order.py), on the session's real
Redis with a stand-in worker that takes nothing: callers take turns whatever they have queued, FIFO
within a turn, and a lower `priority` goes first among a caller's own jobs only, so no caller buys
another's turn. The queue stays RQ's list."""

from __future__ import annotations

import threading

from flask.testing import FlaskClient
from redis import Redis
from redis.client import PubSub

from shared.queue import backlog
from shared.queue.fair_order import share
from shared.queue.keys import Keys
from tests.support import CHAT, MODEL, finish_queued, rq_job, rq_queue
from worker.ops.cluster import wait_until


def queued_by(
    impatient_http: FlaskClient, redis: Redis, keys: Keys, asks: list[dict[str, object]]
) -> list[str]:
    """Send the requests one after another (each queued before the next is sent); the queue's
    order (`queue_order`)."""
    threads = send_in_turn(impatient_http, redis, keys, asks)
    order = queue_order(redis, keys)
    finish_queued(redis, keys)
    for thread in threads:
        thread.join(timeout=10)
    return order


def send_in_turn(
    impatient_http: FlaskClient,
    redis: Redis,
    keys: Keys,
    asks: list[dict[str, object]],
    already: int = 0,
) -> list[threading.Thread]:
    """Send the requests one after another, each once the one before is placed (`already`:
    jobs placed before these); the threads that wait on them."""
    threads = []
    for n, extra in enumerate(asks, start=already + 1):
        body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], **extra}
        threads.append(
            threading.Thread(target=impatient_http.post, args=(CHAT,), kwargs={"json": body})
        )
        threads[-1].start()
        # Queued (RQ appends it), then placed (PLACE records its place): one round trip apart.
        wait_until(lambda n=n: placed(redis, keys) == n, 5, "the request to be placed")  # type: ignore[misc]
    return threads


def queue_order(redis: Redis, keys: Keys) -> list[str]:
    """The queue's order, as each job's share and priority (and its `max_tokens`, where a test
    tags a job with it)."""
    queue = rq_queue(redis, keys.queue(MODEL))
    return [_label(rq_job(redis, job_id).args[0]) for job_id in queue.get_job_ids()]


def placed(redis: Redis, keys: Keys) -> int:
    return int(redis.hlen(keys.order(MODEL)))


def _label(job: dict[str, object]) -> str:
    tag = "" if job["max_tokens"] is None else f":{job['max_tokens']}"
    return f"{job['share']}:{job['priority']}{tag}"


HIGHEST = -(2**20)  # the most urgent priority a request may ask for
ALICE, BOB = share(None, "alice", keyed=False), share(None, "bob", keyed=False)


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


def test_a_priority_does_not_put_a_job_ahead_of_another_callers_turn(
    impatient_http: FlaskClient, redis: Redis, stand_in: tuple[Keys, PubSub]
) -> None:
    keys, _ = stand_in
    a = [{"user": "alice"}] * 3
    order = queued_by(impatient_http, redis, keys, [*a, {"user": "bob", "priority": HIGHEST}])
    alice, bob = f"{ALICE}:0", f"{BOB}:{HIGHEST}"
    assert order == [alice, bob, alice, alice]


def test_a_caller_flooding_at_the_highest_priority_still_takes_one_turn_at_a_time(
    impatient_http: FlaskClient, redis: Redis, stand_in: tuple[Keys, PubSub]
) -> None:
    keys, _ = stand_in
    a = [{"user": "alice", "priority": HIGHEST}] * 4
    order = queued_by(impatient_http, redis, keys, [*a, {"user": "bob"}])
    alice, bob = f"{ALICE}:{HIGHEST}", f"{BOB}:0"
    assert order == [alice, bob, alice, alice, alice]


def test_priority_orders_a_callers_own_jobs_within_its_turns(
    impatient_http: FlaskClient, redis: Redis, stand_in: tuple[Keys, PubSub]
) -> None:
    keys, _ = stand_in
    asks: list[dict[str, object]] = [
        {"user": "alice", "max_tokens": 1},
        {"user": "alice", "max_tokens": 2},
        {"user": "bob", "max_tokens": 3},
        {"user": "alice", "max_tokens": 4, "priority": -5},
        {"user": "alice", "max_tokens": 5, "priority": -5},
    ]
    order = queued_by(impatient_http, redis, keys, asks)
    # Alice's turns stay the first, third, fourth and fifth places: her two urgent jobs take the
    # first two of them in their arrival order, her earlier ones the later two; Bob keeps his.
    assert order == [
        f"{ALICE}:-5:4",
        f"{BOB}:0:3",
        f"{ALICE}:-5:5",
        f"{ALICE}:0:1",
        f"{ALICE}:0:2",
    ]


def test_a_taken_job_moves_the_round_on_to_its_turn(
    impatient_http: FlaskClient, redis: Redis, stand_in: tuple[Keys, PubSub]
) -> None:
    keys, _ = stand_in
    asks: list[dict[str, object]] = [{"user": "alice"}, {"user": "alice"}, {"user": "bob"}]
    threads = send_in_turn(impatient_http, redis, keys, asks)
    queue = rq_queue(redis, keys.queue(MODEL))
    head = queue.get_job_ids()[0]
    # Taken as a worker's slot takes it: off the list, then released as "taken"
    # (worker/runtime/job_function.py).
    redis.lrem(queue.key, 1, head)
    release = redis.register_script(backlog.RELEASE)
    release(keys=[keys.backlog(MODEL), keys.backlog_tokens(MODEL), keys.order(MODEL),
                  keys.round(MODEL)], args=[head, "taken"])  # fmt: skip
    assert redis.get(keys.round(MODEL)) == b"1"
    threads += send_in_turn(impatient_http, redis, keys, [{"user": "carol"}], already=2)
    order = queue_order(redis, keys)
    finish_queued(redis, keys, MODEL, head)
    for thread in threads:
        thread.join(timeout=10)
    # Round 1 was served: Carol's first turn is round 2, after Alice's second job.
    assert order == [f"{BOB}:0", f"{ALICE}:0", f"{share(None, 'carol', keyed=False)}:0"]
