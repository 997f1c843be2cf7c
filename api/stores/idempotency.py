"""Idempotency-Key: a POST that creates something, sent again, creates it once.

A caller that sends `Idempotency-Key: <key>` (1 to 255 printable ASCII characters) on a route
wrapped in `idempotent` (file uploads, batches, responses, chat and text completions; not
streamed ones, which answer 400) claims the key with one `SET NX`
before the route runs, so of two tries arriving together exactly one runs. For 24 hours after,
the same key from the same caller (the owner, api/http/auth.py; keys of different callers never
meet) gets:
- the same request (method, path and body; a multipart body by its fields and files, whatever
  its boundary): the first answer again, with `Idempotent-Replayed: true`;
- while the first try still runs: 409 `idempotency_key_in_use` with `Retry-After`, which the
  OpenAI SDK retries by itself;
- another request: 422 `idempotency_key_reused`.
Only a successful (2xx) answer is kept: a try that failed (a validation error, a full queue, an
outage) releases the key, so the corrected request can use it. A claim whose API process died
mid-request lapses after `claim_ttl_s`. Each record, claimed or kept, takes a place in its
owner's quota (api/limits/quotas.py), a kept one its answer's bytes too: a new key claimed
beyond either is a 429 and not held.
"""

from __future__ import annotations

import functools
import hashlib
import re
from collections.abc import Callable

from flask import Response, request
from pydantic import BaseModel
from redis import Redis

from api.backend import backend
from api.http.auth import owner_id
from api.limits.quotas import Quotas, Usage, quotas
from shared.queue.keys import Keys
from shared.wire.errors import (
    IdempotencyKeyInUseError,
    IdempotencyKeyReusedError,
    InvalidRequestError,
)

HEADER = "Idempotency-Key"
REPLAYED_HEADER = "Idempotent-Replayed"
RECORD_TTL_S = 24 * 3600
# A stream's tokens are not kept (a plain chat's nowhere; a stored response's in its event log,
# which GET /v1/responses/{id}?stream=true replays), so a streamed answer cannot be replayed.
STREAMED = (
    "a streamed answer cannot be replayed. Send it without stream, or create a background "
    "response and stream it with GET /v1/responses/{id}?stream=true."
)
_VALID_KEY = re.compile(r"[\x21-\x7e][\x20-\x7e]{0,254}")
_CHUNK = 1 << 20


class Answer(BaseModel):
    """What a key holds: the request's fingerprint and, once answered, the answer."""

    fingerprint: str
    status: int | None = None  # None: the first try is still running
    body: str = ""
    mimetype: str = "application/json"


class IdempotencyStore:
    """The keys of one owner in Redis."""

    def __init__(
        self, redis: Redis, keys: Keys, owner: str, claim_ttl_s: int, quotas: Quotas | None = None
    ):
        self._redis = redis
        self._keys = keys
        self._owner = owner
        self._claim_ttl_s = claim_ttl_s
        self._quotas = quotas  # None: the records are not counted

    def _key(self, key: str) -> str:
        return self._keys.idempotency(self._owner, _digest(key))

    def claim(self, key: str, fingerprint: str) -> Answer | None:
        """None if this request now holds `key`; else what an earlier one left there."""
        pending = Answer(fingerprint=fingerprint).model_dump_json()
        for _ in range(3):  # an earlier claim may lapse between SET and GET
            if self._redis.set(self._key(key), pending, nx=True, ex=self._claim_ttl_s):
                self._take_place(key)
                return None
            raw = self._redis.get(self._key(key))
            if raw is not None:
                return Answer.model_validate_json(raw)
        raise IdempotencyKeyInUseError(f"The {HEADER} is in use; retry.", param=HEADER)

    def keep(self, key: str, answer: Answer) -> None:
        record = answer.model_dump_json()
        self._redis.set(self._key(key), record, ex=RECORD_TTL_S)
        if self._quotas is not None:  # its place and bytes, for as long as the answer is kept
            usage = self._usage(key, RECORD_TTL_S, size=len(record.encode()))
            self._quotas.count(self._owner, usage)

    def release(self, key: str) -> None:
        self._redis.delete(self._key(key))
        if self._quotas is not None:
            self._quotas.release(self._owner, self._usage(key, RECORD_TTL_S))

    def _take_place(self, key: str) -> None:
        """A new claim's place in its owner's quota, or the claim given up and the 429 raised."""
        if self._quotas is None:
            return
        try:
            self._quotas.take(self._owner, self._usage(key, self._claim_ttl_s))
        except BaseException:
            self._redis.delete(self._key(key))
            raise

    def _usage(self, key: str, hold_s: int, size: int = 0) -> Usage:
        return Usage("idempotency", _digest(key), size=size, hold_s=hold_s)


def _digest(key: str) -> str:
    """An Idempotency-Key as it is kept: its SHA-256, safe inside a Redis key."""
    return hashlib.sha256(key.encode()).hexdigest()


def presented_key() -> str | None:
    """The request's Idempotency-Key, checked; None if it sent none."""
    key = request.headers.get(HEADER)
    if key is None:
        return None
    if _VALID_KEY.fullmatch(key) is None:
        raise InvalidRequestError(
            f"The {HEADER} header must be 1 to 255 printable ASCII characters.",
            param=HEADER,
            code="invalid_value",
        )
    return key


def refuse_key(reason: str) -> None:
    """Answer 400 to a request that carries an Idempotency-Key this route cannot honour."""
    if request.headers.get(HEADER) is not None:
        raise InvalidRequestError(f"{HEADER} is not supported here: {reason}", param=HEADER)


def _by_name(field: tuple[str | None, str]) -> tuple[str, str]:
    return field[0] or "", field[1]


def fingerprint() -> str:
    """A digest of what the request asks: method, path, query and body. A multipart body is
    taken by its fields and files, since its boundary changes on every try."""
    digest = hashlib.sha256(f"{request.method} {request.full_path}\0".encode())
    if request.mimetype != "multipart/form-data":
        digest.update(request.get_data())
        return digest.hexdigest()
    # A part may come without a name (None): sorted as "", written as "None".
    for name, value in sorted(request.form.items(multi=True), key=_by_name):
        digest.update(f"form\0{name}\0{value}\0".encode())
    for name, upload in sorted(request.files.items(multi=True), key=lambda item: item[0] or ""):
        digest.update(f"file\0{name}\0{upload.filename}\0".encode())
        for chunk in iter(functools.partial(upload.stream.read, _CHUNK), b""):
            digest.update(chunk)
        upload.stream.seek(0)
    return digest.hexdigest()


def _replay(earlier: Answer, fingerprint: str) -> Response:
    if earlier.fingerprint != fingerprint:
        raise IdempotencyKeyReusedError(
            f"This {HEADER} was used with a different request in the last 24 hours; "
            "use a new key for a new request.",
            param=HEADER,
        )
    if earlier.status is None:
        raise IdempotencyKeyInUseError(
            f"A request with this {HEADER} is still being processed; retry shortly.",
            param=HEADER,
        )
    replayed = Response(earlier.body, status=earlier.status, mimetype=earlier.mimetype)
    replayed.headers[REPLAYED_HEADER] = "true"
    return replayed


def _store() -> IdempotencyStore:
    b = backend()
    claim_ttl_s = int(b.settings.queue_timeout_s + b.settings.run_limit_s) + 60
    return IdempotencyStore(b.redis, b.keys, owner_id(), claim_ttl_s, quotas())


def idempotent(view: Callable[[], Response]) -> Callable[[], Response]:
    """Wrap a creating POST route in the Idempotency-Key contract (module docstring)."""

    @functools.wraps(view)
    def wrapped() -> Response:
        key = presented_key()
        if key is None:
            return view()
        asked = fingerprint()
        store = _store()
        earlier = store.claim(key, asked)
        if earlier is not None:
            return _replay(earlier, asked)
        try:
            answer = view()
        except BaseException:
            store.release(key)
            raise
        if 200 <= answer.status_code < 300 and not answer.is_streamed:
            body = answer.get_data(as_text=True)
            kept = Answer(
                fingerprint=asked,
                status=answer.status_code,
                body=body,
                mimetype=answer.mimetype or "application/json",
            )
            store.keep(key, kept)
        else:
            store.release(key)
        return answer

    return wrapped
