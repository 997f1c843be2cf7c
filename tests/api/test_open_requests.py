"""Open requests per key (api/limits/open_requests.py), on the real Redis: a key with `:open=N`
holds a place per open request, the N+1th is refused with a 429 until one ends, and a place an
API process never gave back ends with its life."""

from __future__ import annotations

import time

import pytest
from flask import Flask, g
from redis import Redis

from api.limits.open_requests import OpenRequests, open_requests
from shared.queue.config import KeyLimits, Settings
from shared.queue.keys import Keys
from shared.wire.errors import RateLimitError


def _as_key(limits: KeyLimits | None, owner: str = "owner1") -> None:
    g.mlxq_limits, g.mlxq_owner = limits, owner


def test_a_key_holds_at_most_its_open_requests_until_one_ends(app: Flask) -> None:
    with app.test_request_context():
        _as_key(KeyLimits(open=2))
        places = open_requests()
        held = [places.take("job-a"), places.take("job-b")]
        with pytest.raises(RateLimitError) as refused:
            places.take("job-c")
        assert refused.value.status == 429 and refused.value.type == "open_requests"
        assert "Retry-After" in refused.value.headers()
        _as_key(KeyLimits(open=2), owner="owner2")  # another key: places of its own
        assert places.take("job-d") == "owner2"
        _as_key(KeyLimits(open=2))
        places.give_back(held[0], "job-a")
        assert places.take("job-c") == "owner1"


def test_a_key_without_the_limit_takes_nothing(
    app: Flask, app_settings: Settings, redis: Redis
) -> None:
    with app.test_request_context():
        _as_key(KeyLimits(rpm=5))
        assert open_requests().take("job-a") is None
        _as_key(None)
        assert open_requests().take("job-b") is None
    assert not list(redis.scan_iter(f"{Keys(app_settings.namespace).ns}:open:*"))


def test_a_place_never_given_back_ends_with_its_life(app_settings: Settings, redis: Redis) -> None:
    keys = Keys(app_settings.namespace)
    places = OpenRequests(redis, keys, life_s=0.2, retry_after_s=1)
    with Flask(__name__).test_request_context():
        _as_key(KeyLimits(open=1))
        places.take("job-lost")  # its API process died: never given back
        with pytest.raises(RateLimitError):
            places.take("job-next")
        time.sleep(0.3)
        assert places.take("job-next") == "owner1"
    assert 0 < redis.pttl(keys.open_requests("owner1")) <= 200
