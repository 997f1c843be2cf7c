"""The API and the pools' catalog (shared/queue/pool.py), on the in-process app and real Redis:
a catalog model that no worker holds is listed with its state and its requests wait in its
queue instead of a 404; a failed load ends their waits with an error naming the model; a model
that fits no machine's budget is refused with the setting named. A pool agent is stood in for
by publishing its report, as worker/pool/agent.py does each beat.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from flask.testing import FlaskClient
from redis import Redis

from shared.queue.keys import Keys
from shared.queue.pool import publish_report, record_failure
from shared.wire.fleet.pool import MIB, CatalogEntry, LoadFailure, ModelCost, PoolReport
from tests.support import CHAT, MESSAGES, assert_openai_error, rq_queue
from worker.ops.cluster import wait_until

MACHINE = "mac-a"
BEAT_S = 0.1


def entry(name: str, total_mb: int, kind: str = "chat") -> CatalogEntry:
    cost = ModelCost(
        weight_bytes=total_mb * MIB,
        kv_bytes_per_token=0,
        rows=4,
        kv_tokens=4096,
        prefix_cache_bytes=0,
        headroom_bytes=0,
    )
    return CatalogEntry.model_validate(
        {"name": name, "kind": kind, "created": 1, "cost": cost, "keep_alive_s": 300.0}
    )


REPORT = PoolReport(
    machine=MACHINE,
    budget_bytes=1024 * MIB,
    used_bytes=0,
    rss_bytes=0,
    catalog=[entry("alpha", 400), entry("vectors", 100, "embedding"), entry("huge", 4096)],
    held=[],
)


@contextmanager
def pool_beating(redis: Redis, keys: Keys, heartbeat_s: float) -> Iterator[None]:
    """A live pool agent's report, rewritten every BEAT_S until the block ends."""
    stop = threading.Event()

    def beat() -> None:
        while not stop.is_set():
            pipe = redis.pipeline()
            publish_report(pipe, keys, REPORT, heartbeat_s)
            pipe.execute()
            stop.wait(BEAT_S)

    thread = threading.Thread(target=beat, daemon=True)
    thread.start()
    time.sleep(BEAT_S)
    try:
        yield
    finally:
        stop.set()
        thread.join()


def test_models_lists_a_catalog_model_no_worker_holds_as_not_loaded(
    http: FlaskClient, redis: Redis, keys: Keys
) -> None:
    assert http.get("/v1/models/alpha").status_code == 404
    with pool_beating(redis, keys, 0.5):
        listed = {m["id"]: m for m in http.get("/v1/models").get_json()["data"]}
        one = http.get("/v1/models/vectors").get_json()
    assert set(listed) == {"alpha", "vectors", "huge"}
    assert listed["alpha"]["status"] == {
        "value": "not_loaded",
        "workers": [],
        "machines": [MACHINE],
    }
    assert one["status"]["value"] == "not_loaded"


def test_a_chat_for_a_catalog_model_waits_in_its_queue_instead_of_a_404(
    impatient_http: FlaskClient, redis: Redis, keys: Keys
) -> None:
    queue = rq_queue(redis, keys.queue("alpha"))
    replies = []
    body = {"model": "alpha", "messages": MESSAGES, "keep_alive": "10m"}
    with pool_beating(redis, keys, 0.5):
        asking = threading.Thread(
            target=lambda: replies.append(impatient_http.post(CHAT, json=body))
        )
        asking.start()
        wait_until(lambda: bool(replies or queue.get_job_ids()), 5, "the job to be queued")
        assert not replies, replies[0].get_data(as_text=True)
        job = queue.jobs[0].args[0]
        asking.join(timeout=10)
    assert job["keep_alive_s"] == 600.0
    assert replies[0].status_code == 503  # its queue deadline (3 s), not a 404


def test_a_failed_load_ends_the_wait_of_a_job_queued_before_it_naming_the_model(
    http: FlaskClient, redis: Redis, keys: Keys
) -> None:
    queue = rq_queue(redis, keys.queue("alpha"))
    replies = []
    body = {"model": "alpha", "messages": MESSAGES}
    with pool_beating(redis, keys, 0.5):
        asking = threading.Thread(target=lambda: replies.append(http.post(CHAT, json=body)))
        asking.start()
        wait_until(lambda: bool(replies or queue.get_job_ids()), 5, "the job to be queued")
        failure = LoadFailure(model="alpha", machine=MACHINE, at=time.time(), why="bad weights")
        record_failure(redis, keys, failure)
        asking.join(timeout=60)
    assert_openai_error(replies[0], 503, "model")
    error = replies[0].get_json()["error"]
    assert error["code"] == "model_load_failed"
    assert "'alpha'" in error["message"] and "bad weights" in error["message"]
    assert queue.get_job_ids() == []  # taken off its queue


def test_a_model_that_fits_no_pool_budget_is_refused_naming_the_setting(
    http: FlaskClient, redis: Redis, keys: Keys
) -> None:
    with pool_beating(redis, keys, 0.5):
        refused = http.post(CHAT, json={"model": "huge", "messages": MESSAGES})
    assert_openai_error(refused, 400, "model")
    assert "MLXQ_POOL_BUDGET_MB" in refused.get_json()["error"]["message"]


def test_a_keep_alive_that_is_no_duration_is_refused_naming_it(http: FlaskClient) -> None:
    refused = http.post(CHAT, json={"model": "m", "messages": MESSAGES, "keep_alive": "forever"})
    assert_openai_error(refused, 400, "keep_alive")


def test_metrics_show_each_pools_budget_and_what_it_did(
    http: FlaskClient, redis: Redis, keys: Keys
) -> None:
    with pool_beating(redis, keys, 0.5):
        text = http.get("/metrics").get_data(as_text=True)
    assert f'mlxq:pool_budget_bytes{{machine="{MACHINE}"}} 1.073741824e+09' in text
    assert f'mlxq:pool_loads_total{{machine="{MACHINE}"}} 0.0' in text
