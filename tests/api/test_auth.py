"""API keys, owners and isolation, through the Flask app on the real Redis (no worker needed)."""

from __future__ import annotations

import hashlib
import re

import pytest
from flask import Blueprint, Flask, Response, jsonify
from flask.testing import FlaskClient
from pydantic import SecretStr, ValidationError
from redis import Redis

from api import create_app
from api.http import auth
from api.http.auth import (
    ANONYMOUS,
    ApiKeys,
    OwnerSecret,
    owner_id,
    owner_of_key,
    require_owner,
)
from shared.queue.config import KeyLimits, Settings
from shared.queue.jobs import GenerationJob, job_for
from shared.queue.keys import Keys, is_valid_id
from shared.queue.prefix.cache_scope import SCOPE_PATTERN
from shared.wire.chat.completions import ChatCompletionRequest
from tests.support import assert_openai_error

KEYS = ("sk-first-0123456789", "sk-second-9876543210")
CHAT = "/v1/chat/completions"
BODY = {"model": "no-such-model", "messages": [{"role": "user", "content": "hi"}]}


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


# A stand-in for the stored resources (responses, batches, files): each record is stamped with
# owner_id() when created and read back through require_owner, exactly as those routes do.
notes = Blueprint("notes", __name__)


def _note(note_id: str) -> tuple[Redis, str]:
    from api.queue.broker import broker

    return broker().redis, f"{broker().keys.ns}:note:{note_id}"


@notes.post("/v1/test-notes/<note_id>")
def create_note(note_id: str) -> Response:
    redis, key = _note(note_id)
    redis.hset(key, "owner", owner_id())
    return jsonify(id=note_id)


@notes.get("/v1/test-notes/<note_id>")
def get_note(note_id: str) -> Response:
    redis, key = _note(note_id)
    owner = redis.hget(key, "owner")
    require_owner(owner.decode() if owner else None, "note", note_id)
    return jsonify(id=note_id)


@pytest.fixture
def keyed_app(app_settings: Settings) -> Flask:
    app = create_app(app_settings.model_copy(update={"api_keys": Settings(api_keys=KEYS).api_keys}))
    app.register_blueprint(notes)
    return app


@pytest.fixture
def keyed(keyed_app: Flask) -> FlaskClient:
    return keyed_app.test_client()


def test_missing_key_is_a_401_invalid_api_key(keyed: FlaskClient) -> None:
    response = keyed.post(CHAT, json=BODY)
    assert_openai_error(response, 401)
    assert response.get_json()["error"]["code"] == "invalid_api_key"
    assert "Authorization" in response.get_json()["error"]["message"]


@pytest.mark.parametrize(
    "header",
    [
        "Bearer sk-wrong",
        "Bearer ",
        "Basic c2stZmlyc3Q=",
        f"Bearer {KEYS[0]}x",
        KEYS[0],
        "Bearer \u00e9",
    ],
)
def test_wrong_key_is_a_401_that_does_not_echo_it(keyed: FlaskClient, header: str) -> None:
    response = keyed.post(CHAT, json=BODY, headers={"Authorization": header})
    assert_openai_error(response, 401)
    assert response.get_json()["error"]["code"] == "invalid_api_key"
    assert "sk-" not in response.get_data(as_text=True)


@pytest.mark.parametrize("key", KEYS)
def test_each_configured_key_is_let_in(keyed: FlaskClient, key: str) -> None:
    response = keyed.post(CHAT, json=BODY, headers=bearer(key))
    assert_openai_error(response, 404)  # past the key check: the model has no worker
    assert response.get_json()["error"]["code"] == "model_not_found"
    assert keyed.get("/v1/models", headers={"Authorization": f"bearer {key}"}).status_code == 200


@pytest.mark.parametrize(
    ("method", "path"),
    [("get", "/v1/models"), ("get", "/v1/models/x"), ("post", "/v1/completions"),
     ("get", "/v1/nothing-here"), ("delete", CHAT)],
)  # fmt: skip
def test_every_v1_route_needs_a_key_even_unknown_ones(
    keyed: FlaskClient, method: str, path: str
) -> None:
    assert_openai_error(getattr(keyed, method)(path), 401)


def test_health_stays_public(keyed: FlaskClient) -> None:
    assert keyed.get("/health").status_code == 200


def test_without_keys_every_caller_is_anonymous(app: Flask) -> None:
    with app.test_request_context("/v1/models"):
        assert owner_id() == ANONYMOUS


def test_owner_ids_are_per_key_fixed_and_safe_in_redis_keys(redis: Redis) -> None:
    settings = Settings(api_keys=",".join(KEYS), owner_secret="s3cret-for-owners")
    secret = OwnerSecret(settings, redis)
    keys = ApiKeys(settings.api_keys, (), secret)
    found, other = keys.caller(KEYS[0]), keys.caller(KEYS[1])
    assert found is not None and other is not None
    first, second = found.owner, other.owner
    assert first != second
    again = ApiKeys(reversed(settings.api_keys), (), secret).caller(KEYS[0])
    assert again is not None and (again.owner, again.limits) == (first, KeyLimits())
    assert re.fullmatch("[0-9a-f]{32}", first) and is_valid_id(first)
    assert KEYS[0] not in first
    assert keys.caller("sk-") is None and not ApiKeys([], [], secret)


def test_an_owner_id_cannot_be_derived_from_the_key_alone() -> None:
    """A guessed key is confirmed against an owner id seen in the fleet view or a log only
    with the secret: the id is an HMAC under it, not a hash with a public salt."""
    key = KEYS[0]
    public = hashlib.sha256(b"mlxq-owner\0" + key.encode()).hexdigest()[:32]  # the old scheme
    ids = {owner_of_key(key, b"one secret"), owner_of_key(key, b"another secret"), public}
    assert len(ids) == 3


def test_every_api_process_derives_the_same_owners_from_the_secret_kept_in_redis(
    app_settings: Settings, redis: Redis
) -> None:
    keyed = app_settings.model_copy(update={"api_keys": Settings(api_keys=KEYS).api_keys})
    first, second = (create_app(keyed) for _ in range(2))
    for app in (first, second):
        app.register_blueprint(notes)
    assert redis.get(Keys(keyed.namespace).owner_secret()) is None  # made when first needed
    made = first.test_client().post("/v1/test-notes/n1", headers=bearer(KEYS[0]))
    assert made.status_code == 200
    secret = redis.get(Keys(keyed.namespace).owner_secret())
    assert secret is not None and len(secret) == 64
    assert second.test_client().get("/v1/test-notes/n1", headers=bearer(KEYS[0])).status_code == 200
    # A process with a secret of its own derives other owners: the note is another's.
    own_secret = SecretStr("an operator's own secret")
    own = create_app(keyed.model_copy(update={"owner_secret": own_secret}))
    own.register_blueprint(notes)
    assert_openai_error(own.test_client().get("/v1/test-notes/n1", headers=bearer(KEYS[0])), 404)


def test_a_secret_lost_from_redis_is_written_back_and_agreed_on_again(
    app_settings: Settings, redis: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = app_settings.model_copy(update={"api_keys": Settings(api_keys=KEYS).api_keys})
    kept = OwnerSecret(settings, redis)
    before = kept.get()
    redis.delete(Keys(settings.namespace).owner_secret())  # a Redis without persistence restarted
    monkeypatch.setattr(auth, "SECRET_RECHECK_S", 0.0)
    assert kept.get() == before  # this process writes its own back...
    assert OwnerSecret(settings, redis).get() == before  # ...and a new one takes it


def test_a_record_of_another_key_is_404_like_a_missing_one(keyed: FlaskClient) -> None:
    assert keyed.post("/v1/test-notes/n1", headers=bearer(KEYS[0])).status_code == 200
    assert keyed.get("/v1/test-notes/n1", headers=bearer(KEYS[0])).status_code == 200
    foreign = keyed.get("/v1/test-notes/n1", headers=bearer(KEYS[1]))
    missing = keyed.get("/v1/test-notes/n2", headers=bearer(KEYS[1]))
    assert_openai_error(foreign, 404)
    assert foreign.get_json()["error"]["message"] == "No note found with id 'n1'."
    assert missing.get_json()["error"]["message"] == "No note found with id 'n2'."


def test_keys_are_secret_in_settings() -> None:
    settings = Settings(
        api_keys="sk-a-hush, sk-b-hush", admin_keys="sk-op-hush", owner_secret="owner-hush"
    )
    assert (len(settings.api_keys), len(settings.admin_keys)) == (2, 1)
    assert "hush" not in repr(settings) and "hush" not in str(settings.model_dump())


def test_a_key_entry_may_end_in_its_limits_and_a_key_may_hold_colons() -> None:
    settings = Settings(
        api_keys="sk-a:rpm=60:tpm=40000, sk-b:tpm=9, sk:c, sk-d:queued=90000:rpm=5, sk-e:queued=7"
    )
    limits = [(key.key.get_secret_value(), key.limits) for key in settings.api_keys]
    assert limits == [
        ("sk-a", KeyLimits(rpm=60, tpm=40000)),
        ("sk-b", KeyLimits(tpm=9)),
        ("sk:c", KeyLimits()),
        ("sk-d", KeyLimits(rpm=5, queued=90000)),
        ("sk-e", KeyLimits(queued=7)),
    ]
    assert [bool(key.limits) for key in settings.api_keys] == [True, True, False, True, True]
    assert not KeyLimits(queued=7).per_minute  # no x-ratelimit headers, no bucket to peek


def test_a_limit_of_zero_is_refused_at_start() -> None:
    with pytest.raises(ValidationError):
        Settings(api_keys="sk-a:queued=0")


def test_a_key_entry_may_name_the_cache_scope_it_shares_among_its_limits() -> None:
    settings = Settings(api_keys="sk-a:cache=team:rpm=60, sk-b:rpm=5:cache=team, sk-c, sk:cache")
    found = [(k.key.get_secret_value(), k.cache, k.limits) for k in settings.api_keys]
    assert found == [
        ("sk-a", "team", KeyLimits(rpm=60)),
        ("sk-b", "team", KeyLimits(rpm=5)),
        ("sk-c", None, KeyLimits()),
        ("sk:cache", None, KeyLimits()),
    ]


def test_keys_naming_one_cache_share_a_scope_and_every_other_key_has_its_own(
    redis: Redis,
) -> None:
    entries = Settings(api_keys="sk-a:cache=team, sk-b:cache=team, sk-c, sk-d").api_keys
    keys = ApiKeys(entries, (), OwnerSecret(Settings(owner_secret="s"), redis))
    a, b, c, d = (keys.caller(k) for k in ("sk-a", "sk-b", "sk-c", "sk-d"))
    assert a is not None and b is not None and c is not None and d is not None
    assert a.cache_scope == b.cache_scope and a.owner != b.owner
    assert (c.cache_scope, d.cache_scope) == (c.owner, d.owner)  # a key alone: its owner's
    assert a.cache_scope not in {a.owner, b.owner, c.owner, d.owner}
    assert re.fullmatch(SCOPE_PATTERN, a.cache_scope)


def _job(key_scope: str, **fields: object) -> GenerationJob:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], **fields}
    return job_for("j", ChatCompletionRequest.model_validate(body), "o", scope=key_scope)


def test_a_cache_salt_narrows_a_jobs_scope_to_its_key_and_salt() -> None:
    k, other_key = "k" * 32, "l" * 32
    assert _job(k).cache_scope == k
    salted = _job(k, cache_salt="x").cache_scope
    assert salted not in {k, ""}
    assert salted != _job(k, cache_salt="y").cache_scope
    assert salted != _job(other_key, cache_salt="x").cache_scope  # a salt never widens


def test_a_store_false_request_keeps_its_caches_off_disk() -> None:
    assert _job("k").keep_on_disk and _job("k", store=True).keep_on_disk
    assert not _job("k", store=False).keep_on_disk
