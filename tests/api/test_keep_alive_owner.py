"""A model's lifetime is the operator's (shared/wire/fleet/keep_alive.py, api/queue/admission.py): a
key that is not an operator's gets a 400 naming `keep_alive` for 0 (unload now) or a negative
value (keep loaded), on every generating route, before anything is queued; an operator key
may send them. A stand-in worker serves the model, so a request that passes is queued."""

from __future__ import annotations

import pytest
from flask.testing import FlaskClient
from redis import Redis
from redis.client import PubSub
from werkzeug.test import TestResponse

from api import create_app
from shared.queue.config import Settings
from shared.queue.keys import Keys
from tests.support import CHAT, MODEL, assert_openai_error, rq_queue

KEY, OPERATOR = "sk-tenant-0123456789", "sk-operator-0123456789"


@pytest.fixture
def keyed(app_settings: Settings) -> FlaskClient:
    keys = Settings(api_keys=KEY, admin_keys=OPERATOR)
    update = {"api_keys": keys.api_keys, "admin_keys": keys.admin_keys, "queue_timeout_s": 1.0}
    return create_app(app_settings.model_copy(update=update)).test_client()


def _chat(http: FlaskClient, key: str, keep_alive: object) -> TestResponse:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    return http.post(
        CHAT, json={**body, "keep_alive": keep_alive}, headers={"Authorization": f"Bearer {key}"}
    )


@pytest.mark.parametrize("keep_alive", [0, "0", -1, "-5m"])
def test_a_key_cannot_unload_or_pin_a_shared_model(
    keyed: FlaskClient, redis: Redis, stand_in: tuple[Keys, PubSub], keep_alive: object
) -> None:
    keys, _ = stand_in
    assert_openai_error(_chat(keyed, KEY, keep_alive), 400, param="keep_alive")
    assert rq_queue(redis, keys.queue(MODEL)).count == 0  # refused before it was queued


def test_an_operator_key_may_unload_a_model_and_a_key_may_lengthen_its_stay(
    keyed: FlaskClient, stand_in: tuple[Keys, PubSub]
) -> None:
    for key, keep_alive in ((OPERATOR, 0), (KEY, "10m")):
        reply = _chat(keyed, key, keep_alive)
        assert reply.status_code != 400, reply.get_json()  # queued: the stand-in never answers
