"""The fleet's history (shared/observe/history.py) on the real Redis: each test writes what workers
write, under its own namespace, so the session's worker is unseen (as in test_fleet.py).
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from flask.testing import FlaskClient
from redis import Redis
from rq import Queue
from rq.serializers import JSONSerializer

from api import create_app
from shared.observe.fleet import WorkerStats, publish_stats, read_snapshot
from shared.observe.history import (
    MAX_SAMPLES,
    WINDOW_S,
    FleetSample,
    StoredSample,
    percentile,
    sample_if_due,
    sample_period_s,
    take_sample,
)
from shared.observe.metrics import JobRecord, record_job
from shared.queue.config import Settings
from shared.queue.keys import Keys

MODEL = "history-model"
HEARTBEAT_S = 0.5


@pytest.fixture
def keys(app_settings: Settings) -> Keys:
    """The test's own namespace, empty before and after (tests/conftest.py)."""
    return Keys(app_settings.namespace)


@pytest.fixture
def presence(redis: Redis, keys: Keys) -> Iterator[None]:
    """Worker w1's process is alive (it holds its presence channel)."""
    pubsub = redis.pubsub()
    pubsub.subscribe(keys.presence("w1"))
    yield
    pubsub.close()


def beat(redis: Redis, keys: Keys, at: float, generated: int, started_at: float) -> None:
    """What worker w1's heartbeat writes."""
    stats = WorkerStats(
        worker_id="w1",
        host="host-a",
        model=MODEL,
        batch_size=8,
        running={"interactive": 2, "background": 0, "batch": 1},
        tokens_per_s=0.0,
        generated_tokens=generated,
        started_at=started_at,
    )
    pipe = redis.pipeline()
    pipe.zadd(keys.models(), {MODEL: at})
    pipe.zadd(keys.workers(MODEL), {"w1": at})
    publish_stats(pipe, keys, stats, HEARTBEAT_S)
    pipe.execute()


def ended(redis: Redis, keys: Keys, job_id: str, at: float, queue_s: float, ttft_s: float) -> None:
    """What a worker records as a job ends."""
    job = JobRecord(
        job_id=job_id,
        model=MODEL,
        lane="interactive",
        worker="w1",
        finish_reason="stop",
        prompt_tokens=5,
        completion_tokens=5,
        cached_tokens=0,
        enqueued_at=at - 1.0,
        started_at=at - 1.0 + queue_s,
        first_token_at=at - 1.0 + ttft_s,
        ended_at=at,
    )
    pipe = redis.pipeline()
    record_job(pipe, keys, job)
    pipe.execute()


def test_percentiles_are_nearest_rank() -> None:
    values = [float(v) for v in range(1, 21)]  # 1..20
    assert (percentile(values, 0.5), percentile(values, 0.95)) == (10.0, 19.0)
    assert percentile([3.0], 0.95) == 3.0
    assert percentile([], 0.5) is None


@pytest.mark.usefixtures("presence")
def test_a_sample_holds_tokens_per_s_latency_percentiles_and_queue_depth(
    redis: Redis, keys: Keys
) -> None:
    t0 = time.time()
    beat(redis, keys, t0, generated=1_000, started_at=t0 - 60)
    first = take_sample(read_snapshot(redis, keys, HEARTBEAT_S, now=t0), None, 3.0)
    model = first.sample.models[0]
    assert model.tokens_per_s is None  # nothing to difference against yet
    assert first.generated == {"w1": 1_000}

    Queue(keys.batch_queue(MODEL), connection=redis, serializer=JSONSerializer).enqueue_call(
        "json.dumps", args=(1,)
    )
    ended(redis, keys, "before", t0 - 1, queue_s=9.0, ttft_s=9.0)  # ended before: left out
    for i in range(20):
        ended(redis, keys, f"j{i}", t0 + 1, queue_s=0.01 * (i + 1), ttft_s=0.1 * (i + 1))
    t1 = t0 + 2.5
    beat(redis, keys, t1, generated=1_600, started_at=t0 - 60)
    second = take_sample(read_snapshot(redis, keys, HEARTBEAT_S, now=t1), first, 3.0)
    model = second.sample.models[0]
    assert model.tokens_per_s == pytest.approx(600 / 2.5)
    assert model.jobs == 20
    assert (model.ttft_p50_s, model.ttft_p95_s) == pytest.approx((1.0, 1.9))
    assert (model.queue_p50_s, model.queue_p95_s) == pytest.approx((0.10, 0.19))
    assert model.waiting == {"interactive": 0, "background": 0, "batch": 1}
    assert model.running == {"interactive": 2, "background": 0, "batch": 1}
    assert (second.sample.workers, model.workers, model.slots_used) == (1, 1, 3)


@pytest.mark.usefixtures("presence")
def test_a_restarted_or_long_gone_fleet_is_not_averaged_over_the_gap(
    redis: Redis, keys: Keys
) -> None:
    t0 = time.time()
    beat(redis, keys, t0, generated=50, started_at=t0 - 1)  # started after the previous sample
    previous = StoredSample(
        sample=FleetSample(at=t0 - 2, workers=1, models=[]), generated={"gone": 9_999}
    )
    sample = take_sample(read_snapshot(redis, keys, HEARTBEAT_S, now=t0), previous, 3.0)
    assert sample.sample.models[0].tokens_per_s == pytest.approx(50 / 2)
    long_ago = previous.model_copy(update={"sample": FleetSample(at=t0 - 60, workers=0, models=[])})
    sample = take_sample(read_snapshot(redis, keys, HEARTBEAT_S, now=t0), long_ago, 3.0)
    assert sample.sample.models[0].tokens_per_s is None


@pytest.mark.usefixtures("presence")
def test_the_fleet_takes_one_sample_per_period_whichever_worker_beats(
    redis: Redis, keys: Keys
) -> None:
    beat(redis, keys, time.time(), generated=0, started_at=time.time())
    taken = [sample_if_due(redis, keys, worker, HEARTBEAT_S) for worker in ("w1", "w2", "w1")]
    assert taken == [True, False, False]
    assert redis.llen(keys.history()) == 1
    assert 0 < redis.ttl(keys.history()) <= WINDOW_S
    time.sleep(sample_period_s(HEARTBEAT_S) + 0.1)
    beat(redis, keys, time.time(), generated=0, started_at=time.time())
    assert sample_if_due(redis, keys, "w2", HEARTBEAT_S)
    assert redis.llen(keys.history()) == 2
    assert MAX_SAMPLES * sample_period_s(HEARTBEAT_S) >= WINDOW_S  # the list holds the window


def store(redis: Redis, keys: Keys, *ats: float) -> None:
    for at in ats:
        stored = StoredSample(sample=FleetSample(at=at, workers=1, models=[]), generated={})
        redis.lpush(keys.history(), stored.model_dump_json())


def test_the_history_route_gives_the_windows_samples_oldest_first(
    redis: Redis, keys: Keys, http: FlaskClient, settings: Settings
) -> None:
    now = time.time()
    store(redis, keys, now - WINDOW_S - 10, now - 30, now - 20, now - 10)
    body = http.get("/v1/fleet/history").get_json()
    assert [round(now - s["at"]) for s in body["samples"]] == [30, 20, 10]
    assert body["window_s"] == WINDOW_S
    assert body["sample_s"] == sample_period_s(settings.heartbeat_s)
    assert "generated" not in body["samples"][0]  # the counters stay in Redis
    after = http.get(f"/v1/fleet/history?since={now - 25}").get_json()
    assert [round(now - s["at"]) for s in after["samples"]] == [20, 10]


def test_a_bad_history_query_is_a_400_naming_it(http: FlaskClient) -> None:
    for query, param in (("since=-1", "since"), ("since=nan", "since"), ("limit=3", "limit")):
        response = http.get(f"/v1/fleet/history?{query}")
        assert response.status_code == 400, query
        assert response.get_json()["error"]["param"] == param


def test_the_history_needs_the_key(settings: Settings) -> None:
    keyed = settings.model_copy(update={"api_keys": Settings(api_keys="sk-k1").api_keys})
    http: FlaskClient = create_app(keyed).test_client()
    assert http.get("/v1/fleet/history").status_code == 401
    auth = {"Authorization": "Bearer sk-k1"}
    assert http.get("/v1/fleet/history", headers=auth).status_code == 200
