"""One liveness rule (shared/queue/liveness.py) for `/v1/models`, `/health` and admission, on the
session's real Redis with a stand-in worker: a model is listed exactly while requests for it are
admitted, the moment its worker's process is gone and when its heartbeat ages past the window."""

from __future__ import annotations

import time

from flask.testing import FlaskClient
from redis import Redis

from shared.queue.config import Settings
from shared.queue.keys import Keys
from shared.queue.liveness import LIVE_FACTOR
from tests.support import MODEL, STAND_IN, assert_openai_error, rq_queue, stand_in_worker

BACKGROUND = {"model": MODEL, "input": "hi", "background": True}


def listed(http: FlaskClient) -> tuple[set[str], set[str]]:
    models = {m["id"] for m in http.get("/v1/models").get_json()["data"]}
    return models, set(http.get("/health").get_json()["models"])


def test_a_model_is_listed_while_its_worker_lives_and_unlisted_the_moment_it_dies(
    http: FlaskClient, redis: Redis, app_settings: Settings
) -> None:
    keys = Keys(app_settings.namespace)
    with stand_in_worker(redis, keys) as presence:
        assert listed(http) == ({MODEL}, {MODEL})
        presence.close()  # the worker's process ends: no heartbeat has aged yet
        assert listed(http) == (set(), set())
        assert_openai_error(http.post("/v1/responses", json=BACKGROUND), 404, "model")
        chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
        assert_openai_error(http.post("/v1/chat/completions", json=chat), 404, "model")
    assert rq_queue(redis, keys.queue(MODEL)).count == 0


def test_a_worker_whose_heartbeat_aged_past_the_window_is_not_listed_nor_admitted(
    http: FlaskClient, redis: Redis, app_settings: Settings
) -> None:
    keys = Keys(app_settings.namespace)
    with stand_in_worker(redis, keys):  # still subscribed: a hung process, or a Mac asleep
        old = time.time() - (LIVE_FACTOR + 1) * app_settings.heartbeat_s
        redis.zadd(keys.workers(MODEL), {STAND_IN: old})
        assert listed(http) == (set(), set())
        assert_openai_error(http.post("/v1/responses", json=BACKGROUND), 404, "model")
