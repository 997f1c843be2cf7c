"""The abuse suite's fuzzing with keys on (issue 32, point 11): schemathesis fuzzes every route of
/openapi.json as key A while key B owns one of everything a key keeps, and A can neither see nor
change any of it.

Before the fuzzing, B stores a file (with an Idempotency-Key), a batch over it, a background
response (with another Idempotency-Key) and a message batch, and the fleet records a failed job
of B's. B's model is served by a stand-in worker that never takes a job (tests/support.py), so
B's objects stay queued and nothing generates; every model A's generated requests name is
unknown (404), so none of them waits on a queue. Schemathesis's flatmap hooks aim B's ids at
every id the fuzzer draws (path parameters, list cursors, `input_file_id`,
`previous_response_id`), B's first, and B's Idempotency-Keys at A's headers.

Every answer A gets: is no 5xx; if an error, has the route's own shape (OpenAI's
`{"error": {...}}`, Anthropic's on /v1/messages*); shows nothing of B's (ids, owner id, file
lines, metadata, the job's error) that A did not send itself. A request that names B's objects
gets exactly the answer (status and body) that the same request naming missing ids of the same
form gets, and after it B reads each of its objects and listings back as they were. B's
Idempotency-Keys are new to A: never replayed to it, never refused as used.

On the in-process app (Flask test client) and the session's real Redis, under a namespace of its
own: no worker process is needed for any of this.
"""

from __future__ import annotations

import io
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import schemathesis
from flask import Flask
from flask.testing import FlaskClient
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from pydantic import SecretStr
from redis import Redis
from schemathesis.checks import not_a_server_error
from schemathesis.core.transport import Response as FuzzedResponse
from schemathesis.hooks import HookContext

from api import create_app
from api.http.auth import owner_of_key
from api.routes.openapi import document
from shared.observe.metrics import JobRecord, record_job
from shared.queue.config import Settings
from shared.queue.keys import Keys
from shared.wire.ids import new_id
from tests.support import flush_namespace, stand_in_worker

KEY_A, KEY_B = "sk-abuse-a-0123456789", "sk-abuse-b-9876543210"
SECRET = "the abuse suite's owner secret"
NAMESPACE = "mlxqabuse"
B_MODEL = "b-private-model"
B_IDEMPOTENCY_KEYS = ("b-file-upload-1", "b-background-response-1")
# Per operation; derandomized, so every run draws the same examples (CI must not need luck).
# The routes that take B's ids get more; the others (generation, models, metrics) are fuzzed at
# length without keys' concerns by tests/api/test_openapi.py, and their bodies are slow to draw.
EXAMPLES_AIMED = 20
EXAMPLES_ELSEWHERE = 6
ANTHROPIC_PATHS = "/v1/messages"


@dataclass
class Owned:
    """What B keeps: its ids by the parameter names that carry them, the text only B may read,
    the missing id of the same form for each of its ids, and what B read back before the fuzz."""

    ids: dict[str, list[str]] = field(default_factory=dict)
    secrets: set[str] = field(default_factory=set)
    missing: dict[str, str] = field(default_factory=dict)
    views: dict[str, tuple[int, str]] = field(default_factory=dict)


# Filled by the `b_owns` fixture before the first example is drawn: the hooks, registered at
# import, read it at draw time.
B = Owned()


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def _upload(http: FlaskClient, data: bytes) -> Any:
    form = {"purpose": "batch", "file": (io.BytesIO(data), "b.jsonl")}
    headers = {**bearer(KEY_B), "Idempotency-Key": B_IDEMPOTENCY_KEYS[0]}
    return _ok(
        http.post("/v1/files", data=form, content_type="multipart/form-data", headers=headers)
    )


def _ok(response: Any) -> Any:
    assert response.status_code == 200, response.get_data(as_text=True)
    return response.get_json()


def _b_creates_one_of_everything(http: FlaskClient, redis: Redis, keys: Keys) -> None:
    line = {
        "custom_id": "b-line-secret",
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {"model": B_MODEL, "messages": [{"role": "user", "content": "b-prompt-secret"}]},
    }
    file = _upload(http, json.dumps(line).encode() + b"\n")
    batch_body = {
        "input_file_id": file["id"],
        "endpoint": "/v1/chat/completions",
        "completion_window": "24h",
        "metadata": {"note": "b-metadata-secret"},
    }
    batch = _ok(http.post("/v1/batches", json=batch_body, headers=bearer(KEY_B)))
    response_body = {"model": B_MODEL, "input": "b-input-secret", "background": True}
    headers = {**bearer(KEY_B), "Idempotency-Key": B_IDEMPOTENCY_KEYS[1]}
    response = _ok(http.post("/v1/responses", json=response_body, headers=headers))
    request = {"model": B_MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": "x"}]}
    messages = {"requests": [{"custom_id": "b-message-secret", "params": request}]}
    message_batch = _ok(http.post("/v1/messages/batches", json=messages, headers=bearer(KEY_B)))
    owner = owner_of_key(KEY_B, SECRET.encode())
    pipe = redis.pipeline()
    record_job(pipe, keys, _failed_job(response["id"], owner))
    pipe.execute()
    assert _taken_in(http, batch["id"]) == _taken_in(http, message_batch["id"]) == "in_progress"
    assert response["status"] == "queued"
    B.ids = {
        "file_id": [file["id"]],
        "input_file_id": [file["id"]],
        "batch_id": [batch["id"], message_batch["id"]],
        "response_id": [response["id"]],
        "previous_response_id": [response["id"]],
        "after": [file["id"], batch["id"]],
        "after_id": [message_batch["id"]],
    }
    ids = {i for found in B.ids.values() for i in found}
    B.missing = {i: new_id(i[: -len(new_id(""))]) for i in ids}
    B.secrets = ids | {owner, "b-line-secret", "b-prompt-secret", "b-metadata-secret"}
    B.secrets |= {"b-input-secret", "b-message-secret", "b-job-error-secret"}


def _taken_in(http: FlaskClient, batch_id: str, timeout_s: float = 30) -> str:
    """The batch's status once its lines were checked (it may answer `validating` first); a
    message batch's too, as the Batch API shows it to its owner."""
    deadline = time.monotonic() + timeout_s
    while True:
        status: str = _ok(http.get(f"/v1/batches/{batch_id}", headers=bearer(KEY_B)))["status"]
        if status != "validating" or time.monotonic() > deadline:
            return status
        time.sleep(0.05)


def _failed_job(job_id: str, owner: str) -> JobRecord:
    """A job of B's as its worker records it when it ends: in the fleet's recent jobs."""
    return JobRecord(
        job_id=job_id,
        model=B_MODEL,
        lane="background",
        worker="stand-in.1",
        owner=owner,
        finish_reason="error",
        prompt_tokens=3,
        completion_tokens=0,
        cached_tokens=0,
        enqueued_at=time.time() - 2,
        started_at=time.time() - 1,
        first_token_at=None,
        ended_at=time.time(),
        error="b-job-error-secret",
    )


def _b_reads(http: FlaskClient) -> dict[str, tuple[int, str]]:
    """Each of B's objects and listings, as B reads them."""
    file_id, response_id = B.ids["file_id"][0], B.ids["response_id"][0]
    batch_id, message_batch_id = B.ids["batch_id"]
    paths = [
        f"/v1/files/{file_id}",
        f"/v1/files/{file_id}/content",
        f"/v1/batches/{batch_id}",
        f"/v1/responses/{response_id}",
        f"/v1/messages/batches/{message_batch_id}",
        "/v1/files",
        "/v1/batches",
        "/v1/messages/batches",
    ]
    read = {path: http.get(path, headers=bearer(KEY_B)) for path in paths}
    return {path: (r.status_code, r.get_data(as_text=True)) for path, r in read.items()}


@pytest.fixture(scope="module")
def keyed_app(settings: Settings, redis: Redis) -> Iterator[Flask]:
    """The app with keys A and B on the session's Redis, after B stored one of everything."""
    flush_namespace(redis, NAMESPACE)
    keys = Keys(NAMESPACE)
    update = {
        "namespace": NAMESPACE,
        "api_keys": Settings(api_keys=f"{KEY_A},{KEY_B}").api_keys,
        "owner_secret": SecretStr(SECRET),
    }
    app = create_app(settings.model_copy(update=update))
    with stand_in_worker(redis, keys, B_MODEL):
        _b_creates_one_of_everything(app.test_client(), redis, keys)
        B.views = _b_reads(app.test_client())
        yield app
    flush_namespace(redis, NAMESPACE)


# Schemathesis's hooks: each id the fuzzer draws may be swapped for one of B's.


def _aimed(values: Any, targets: dict[str, list[str]]) -> st.SearchStrategy[Any]:
    if not isinstance(values, dict):
        return st.just(values)
    # B's ids first: the examples hypothesis tries first and shrinks towards name them.
    choices = {
        name: st.sampled_from([*targets[name], value])
        for name, value in values.items()
        if targets.get(name)
    }
    if not choices:
        return st.just(values)
    return st.fixed_dictionaries(choices).map(lambda drawn: {**values, **drawn})


schema = schemathesis.openapi.from_dict(document())
schema.config.generation.update(allow_extra_parameters=False)  # as in tests/api/test_openapi.py
# No coverage phase (its boundary values, hundreds of cases for a generation route's body): that
# is tests/api/test_openapi.py's; here what counts is where B's ids land.
schema.config.phases.update(phases=["examples", "fuzzing"])


@schema.hook("flatmap_path_parameters")
def _b_path_ids(context: HookContext, path_parameters: dict[str, Any]) -> st.SearchStrategy[Any]:
    return _aimed(path_parameters, B.ids)


@schema.hook("flatmap_query")
def _b_cursors(context: HookContext, query: dict[str, Any]) -> st.SearchStrategy[Any]:
    return _aimed(query, B.ids)


@schema.hook("flatmap_body")
def _b_body_ids(context: HookContext, body: Any) -> st.SearchStrategy[Any]:
    return _aimed(body, B.ids)


@schema.hook("flatmap_headers")
def _b_idempotency_keys(context: HookContext, headers: Any) -> st.SearchStrategy[Any]:
    drawn = st.sampled_from([None, *B_IDEMPOTENCY_KEYS])
    return drawn.map(lambda key: {**(headers or {}), **({"Idempotency-Key": key} if key else {})})


# The checks on every answer A gets (schemathesis's check signature: ctx, response, case).


def its_own_error_shape(ctx: Any, response: FuzzedResponse, case: Any) -> None:
    """An error is OpenAI's `{"error": {...}}`, or Anthropic's on /v1/messages*."""
    if response.status_code < 400:
        return
    body = json.loads(response.content)
    if case.path.startswith(ANTHROPIC_PATHS):
        assert set(body) == {"type", "error"} and body["type"] == "error", body
        assert set(body["error"]) == {"type", "message"}, body
    else:
        assert set(body) == {"error"}, body
        assert set(body["error"]) == {"message", "type", "param", "code"}, body
    assert body["error"]["message"], body


def _sent(response: FuzzedResponse) -> str:
    request = response.request
    body = request.body or b""
    text = body.decode("utf-8", "replace") if isinstance(body, bytes) else str(body)
    return f"{request.url}\n{dict(request.headers)}\n{text}"


def shows_nothing_of_bs(ctx: Any, response: FuzzedResponse, case: Any) -> None:
    """No answer to A holds anything of B's that A did not send itself."""
    shown = response.content.decode("utf-8", "replace")
    sent = _sent(response)
    leaked = sorted(s for s in B.secrets if s in shown and s not in sent)
    assert not leaked, f"A's answer shows B's {leaked}: {shown[:500]}"


CHECKS = [not_a_server_error, its_own_error_shape, shows_nothing_of_bs]


def _as_missing(value: Any) -> Any:
    """`value` with each of B's ids swapped for a missing id of the same form."""
    if isinstance(value, str):
        for owned, missing in B.missing.items():
            value = value.replace(owned, missing)
        return value
    if isinstance(value, dict):
        return {k: _as_missing(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_as_missing(v) for v in value]
    return value


def _names_bs_objects(case: Any) -> bool:
    sent = json.dumps([case.path_parameters, case.query, case.body], default=str)
    return any(owned in sent for owned in B.missing)


def _same_as_for_missing_ids(case: Any, response: FuzzedResponse) -> None:
    """The same request naming missing ids instead gets the very same answer."""
    twin = case.derive(keep_auth=True)
    twin.path_parameters = _as_missing(case.path_parameters)
    twin.query = _as_missing(case.query)
    twin.body = _as_missing(case.body)
    answer = twin.call(headers=bearer(KEY_A), buffered=True)
    expected = _as_missing(response.content.decode("utf-8", "replace"))
    assert (response.status_code, expected) == (
        answer.status_code,
        answer.content.decode("utf-8", "replace"),
    ), "B's object answered unlike a missing one"


# The Idempotency-Keys A got a 2xx with: only those may answer A as already used or replayed.
A_KEPT_KEYS: set[str] = set()
_KEY_IN_USE = {"idempotency_key_reused", "idempotency_key_in_use"}


def _only_its_own_idempotency_keys(case: Any, response: FuzzedResponse) -> None:
    """B's Idempotency-Keys are new to A: never replayed, never refused as used."""
    key = case.headers.get("Idempotency-Key")
    if key is None or key in A_KEPT_KEYS:
        return
    if case.method == "POST" and 200 <= response.status_code < 300:  # only POSTs keep keys
        assert "idempotent-replayed" not in response.headers, "A got B's answer replayed"
        A_KEPT_KEYS.add(key)
    elif response.status_code in (409, 422):
        code = json.loads(response.content).get("error", {}).get("code")
        assert code not in _KEY_IN_USE, f"A's new Idempotency-Key {key!r} is B's: {code}"


def _fuzz_as_a(case: Any, app: Flask) -> None:
    case.operation.app = case.operation.schema.app = app
    response = case.call(headers=bearer(KEY_A), buffered=True)
    case.validate_response(response, checks=CHECKS)
    _only_its_own_idempotency_keys(case, response)
    if _names_bs_objects(case):
        _same_as_for_missing_ids(case, response)
        assert _b_reads(app.test_client()) == B.views, "A's request changed B's objects"


def _fuzzing(examples: int) -> settings:
    return settings(
        max_examples=examples,
        deadline=None,
        derandomize=True,
        suppress_health_check=list(HealthCheck),
    )


# The routes that store, list or take an id of what a key keeps, and the fleet view.
AIMED = r"\{|^/v1/(files|batches|messages/batches|fleet)$"


@schema.include(path_regex=AIMED).parametrize()
@_fuzzing(EXAMPLES_AIMED)
def test_key_a_never_sees_or_changes_key_bs_objects(case: Any, keyed_app: Flask) -> None:
    _fuzz_as_a(case, keyed_app)


@schema.exclude(path_regex=AIMED).parametrize()
@_fuzzing(EXAMPLES_ELSEWHERE)
def test_key_a_gets_no_5xx_and_sees_nothing_of_bs_on_every_other_route(
    case: Any, keyed_app: Flask
) -> None:
    _fuzz_as_a(case, keyed_app)
