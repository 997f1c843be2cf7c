"""The three lanes of a model (shared/queue/jobs.py), on the session's real Redis: with a stand-in
worker, a request a client waits on goes to the interactive queue, one with OpenAI's
`service_tier: flex` and a background response to the background queue; a worker's slots, as
the worker makes them (worker/runtime/intake/slots.py `make_slots`), take from the queues in that
order, batch lines last, and its reserved slots take interactive jobs only."""

from __future__ import annotations

import threading

from flask.testing import FlaskClient
from redis import Redis
from redis.client import PubSub

from shared.queue.config import Settings
from shared.queue.jobs import JOB_FUNCTION, LANES
from shared.queue.keys import Keys
from tests.support import CHAT, MODEL, rq_queue, waiting_in
from worker.ops.cluster import wait_until
from worker.runtime.intake.slots import make_slots

HI = [{"role": "user", "content": "hi"}]


def depths(redis: Redis, keys: Keys) -> list[int]:
    return [waiting_in(redis, keys, MODEL, lane) for lane in LANES]


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


def test_slots_take_interactive_then_background_then_batch(
    redis: Redis, app_settings: Settings
) -> None:
    """The order is stated here, by the queues' names (shared/queue/keys.py's layout), not read
    back from `Keys.lanes`: swapping two lanes there makes the slots take in another order."""
    keys = Keys(app_settings.namespace)
    ns = app_settings.namespace
    queued: dict[str, str] = {}
    for lane in ("batch", "background", "interactive"):  # queued lowest first
        queue = rq_queue(redis, keys.lane(MODEL, lane))
        queued[lane] = queue.enqueue_call(JOB_FUNCTION, args=({},)).id
    _, bulk = make_slots(redis, keys, MODEL, f"{ns}.1", count=2, interactive=1)
    taken = [bulk.dequeue_job_and_maintain_ttl(None) for _ in range(3)]
    assert [job.id for job, _ in taken] == [
        queued["interactive"],
        queued["background"],
        queued["batch"],
    ]
    assert [queue.name for _, queue in taken] == [
        f"{ns}.{MODEL}",
        f"{ns}.{MODEL}.background",
        f"{ns}.{MODEL}.batch",
    ]


def test_the_reserved_slots_take_interactive_jobs_only(
    redis: Redis, app_settings: Settings
) -> None:
    keys = Keys(app_settings.namespace)
    batch = rq_queue(redis, keys.batch_queue(MODEL))
    batch.enqueue_call(JOB_FUNCTION, args=({},))
    reserved, bulk = make_slots(redis, keys, MODEL, f"{keys.ns}.1", count=2, interactive=1)
    assert reserved._take() is None  # one wait for an interactive job, TAKE_WAIT_S
    assert batch.count == 1
    interactive = rq_queue(redis, keys.queue(MODEL)).enqueue_call(JOB_FUNCTION, args=({},))
    assert reserved.dequeue_job_and_maintain_ttl(None)[0].id == interactive.id
    assert bulk.dequeue_job_and_maintain_ttl(None)[1].name == batch.name


def test_at_least_one_slot_takes_bulk_jobs(redis: Redis, app_settings: Settings) -> None:
    keys = Keys(app_settings.namespace)
    slots = make_slots(redis, keys, MODEL, f"{keys.ns}.1", count=2, interactive=5)
    assert [len(slot.queues) for slot in slots] == [1, 3]
