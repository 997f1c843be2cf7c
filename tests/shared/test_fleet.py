"""The fleet snapshot and the fleet's request figures, on the real Redis (no worker process: each
test writes what a worker writes, under its own namespace, so the session's worker is unseen).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from functools import partial

import pytest
from flask.testing import FlaskClient
from redis import Redis
from rq import Queue
from rq.serializers import JSONSerializer

from api import create_app
from shared.observe.fleet import read_snapshot
from shared.observe.metrics import JobRecord, ModelFigures, record_job
from shared.queue.config import Settings
from shared.queue.keys import Keys
from tests.support import announce as announce_worker
from worker.ops.cluster import wait_until

MODEL = "fleet-model"
HEARTBEAT_S = 0.5
announce = partial(announce_worker, heartbeat_s=HEARTBEAT_S, model=MODEL)


@pytest.fixture
def keys(redis: Redis) -> Iterator[Keys]:
    keys = Keys("fleettest")
    yield keys
    for key in redis.scan_iter(f"{keys.ns}*"):
        redis.delete(key)
    for key in redis.scan_iter(f"rq:*{keys.ns}.{MODEL}*"):
        redis.delete(key)


def record(job_id: str, reason: str, ttft: float | None, tokens: int, cached: int) -> JobRecord:
    return JobRecord(
        job_id=job_id,
        model=MODEL,
        lane="interactive",
        worker="host-a.1",
        finish_reason=reason,
        prompt_tokens=10,
        completion_tokens=tokens,
        cached_tokens=cached,
        enqueued_at=100.0,
        started_at=100.5,
        first_token_at=None if ttft is None else 100.0 + ttft,
        ended_at=104.0,
    )


def test_a_live_worker_is_listed_with_its_slots_and_a_dead_one_never_is(
    redis: Redis, keys: Keys
) -> None:
    presence = redis.pubsub()
    presence.subscribe(keys.presence("host-a.1"))
    now = time.time()
    announce(redis, keys, "host-a.1", busy=3, at=now)
    # Nobody holds host-a.2's presence: its process is gone.
    announce(redis, keys, "host-a.2", busy=5, at=now)
    snapshot = read_snapshot(redis, keys, HEARTBEAT_S, now=now)
    assert [(w.worker_id, w.slots_used, w.host) for w in snapshot.workers] == [
        ("host-a.1", 4, "host-a")
    ]
    model = snapshot.models[0]
    assert (model.live_workers, model.slots_used, model.slots_total) == (1, 4, 8)
    assert {lane.lane: lane.running for lane in model.lanes} == {
        "interactive": 3,
        "background": 1,
        "batch": 0,
    }

    presence.close()  # the process dies: its connection closes
    wait_until(
        lambda: read_snapshot(redis, keys, HEARTBEAT_S, now=now).workers == [],
        5,
        "the closed presence to take the worker off the list",
    )
    after = read_snapshot(redis, keys, HEARTBEAT_S, now=now)
    assert after.models[0].slots_used == 0


def test_a_worker_whose_heartbeat_is_old_is_not_listed(redis: Redis, keys: Keys) -> None:
    presence = redis.pubsub()
    presence.subscribe(keys.presence("host-a.1"))
    announce(redis, keys, "host-a.1", busy=2, at=time.time())
    later = time.time() + 4 * HEARTBEAT_S  # three missed beats and more (a hung process)
    assert read_snapshot(redis, keys, HEARTBEAT_S, now=later).workers == []
    presence.close()


def test_queue_depth_and_the_oldest_jobs_age_per_lane(redis: Redis, keys: Keys) -> None:
    redis.zadd(keys.models(), {MODEL: time.time()})
    interactive = Queue(keys.queue(MODEL), connection=redis, serializer=JSONSerializer)
    batch = Queue(keys.batch_queue(MODEL), connection=redis, serializer=JSONSerializer)
    interactive.enqueue_call("json.dumps", args=(1,))
    interactive.enqueue_call("json.dumps", args=(2,))
    batch.enqueue_call("json.dumps", args=(3,))
    waited = time.time() + 30  # read 30 s later
    lanes = {lane.lane: lane for lane in read_snapshot(redis, keys, 1, now=waited).models[0].lanes}
    waiting = {name: lane.waiting for name, lane in lanes.items()}
    assert waiting == {"interactive": 2, "background": 0, "batch": 1}
    assert 29 < (lanes["interactive"].oldest_waiting_s or 0) < 35
    assert 29 < (lanes["batch"].oldest_waiting_s or 0) < 35


def test_job_figures_add_up_across_workers_into_cumulative_histograms(
    redis: Redis, keys: Keys
) -> None:
    for job in (
        record("a", "stop", 0.2, 5, 0),
        record("b", "length", 3.0, 9, 8),
        record("c", "cancelled", None, 0, 0),
    ):
        pipe = redis.pipeline()
        record_job(pipe, keys, job)
        pipe.execute()
    figures = ModelFigures.decode(redis.hgetall(keys.model_metrics(MODEL)))
    assert figures.counters == {
        "prompt_tokens": 30,
        "generation_tokens": 14,
        "prefix_cache_queries": 30,
        "prefix_cache_hits": 8,
        "placement_followed": 0,
        "placement_overridden_busy": 0,
        "placement_overridden_wait": 0,
        "placement_spread": 0,
    }
    assert figures.finished == {"stop": 1, "length": 1, "cancelled": 1}
    ttft = dict(figures.histograms["time_to_first_token_seconds"].cumulative())
    assert (ttft["0.1"], ttft["0.25"], ttft["2.5"], ttft["5.0"], ttft["+Inf"]) == (0, 1, 1, 2, 2)
    assert figures.histograms["time_to_first_token_seconds"].total == pytest.approx(3.2)
    queue = dict(figures.histograms["request_queue_time_seconds"].cumulative())
    assert queue["0.5"] == 3  # every job, cancelled or not, waited 0.5 s
    recent = read_snapshot(redis, keys, HEARTBEAT_S).recent_jobs
    assert [(j.job_id, j.status) for j in recent] == [
        ("c", "cancelled"),
        ("b", "completed"),
        ("a", "completed"),
    ]


def test_metrics_need_an_operators_key_the_fleet_a_key_and_the_page_none(
    settings: Settings,
) -> None:
    keys = Settings(api_keys="sk-k1", admin_keys="sk-op1")
    keyed = settings.model_copy(update={"api_keys": keys.api_keys, "admin_keys": keys.admin_keys})
    http: FlaskClient = create_app(keyed).test_client()
    assert http.get("/metrics").status_code == 401
    assert http.get("/v1/fleet").status_code == 401
    auth, operator = {"Authorization": "Bearer sk-k1"}, {"Authorization": "Bearer sk-op1"}
    refused = http.get("/metrics", headers=auth)
    assert refused.status_code == 403 and refused.json["error"]["code"] == "permission_denied"
    assert http.get("/metrics", headers=operator).status_code == 200
    assert http.get("/v1/fleet", headers=auth).status_code == 200
    # Files are sent from an open file a server closes; `buffered` reads and closes them here.
    page = http.get("/", buffered=True)
    assert page.status_code == 200
    assert http.get("/static/js/main.js", buffered=True).status_code == 200
    csp = page.headers["Content-Security-Policy"]
    assert "script-src 'self';" in csp and "unsafe-inline" not in csp
    assert page.headers["X-Content-Type-Options"] == "nosniff"


def test_a_bad_fleet_query_is_a_400_naming_it(http: FlaskClient) -> None:
    for query, param in (("recent=500", "recent"), ("limit=3", "limit")):
        response = http.get(f"/v1/fleet?{query}")
        assert response.status_code == 400
        assert response.get_json()["error"]["param"] == param


def test_every_429_is_counted_in_redis_and_shown_by_metrics(
    settings: Settings, redis: Redis, keys: Keys
) -> None:
    presence = redis.pubsub()
    presence.subscribe(keys.presence("host-a.1"))
    announce(redis, keys, "host-a.1", busy=0, at=time.time())
    Queue(keys.queue(MODEL), connection=redis, serializer=JSONSerializer).enqueue_call(
        "json.dumps", args=(1,)
    )
    full = settings.model_copy(update={"namespace": keys.ns, "queue_cap": 1})
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
    for _ in range(2):  # two API processes, each refusing one request
        http = create_app(full).test_client()
        assert http.post("/v1/chat/completions", json=body).status_code == 429
    scrape = http.get("/metrics").get_data(as_text=True)
    assert 'mlxq:http_refusals_total{code="queue_full",status="429"} 2.0' in scrape
    presence.close()
