"""Who is calling and whether they may: API keys, operators and the owner of stored resources.
Where a server without keys may be reached from is api/http/exposure.py's.

With keys configured (`MLXQ_API_KEYS`, and the operators' `MLXQ_ADMIN_KEYS`, comma-separated),
every route but `PUBLIC_PATHS` (and the page's static files) needs `Authorization: Bearer <key>`
(or `x-api-key: <key>`, as Anthropic's SDK sends it); a missing or wrong key is a 401
`invalid_api_key`. The presented key is compared with every configured key in constant time
(`hmac.compare_digest`, no early exit), and is never logged or echoed. The check is one
`before_request` hook (`init_app`).

A key may carry limits (`sk-key:rpm=60:tpm=40000`, shared/queue/config.py): `key_limits()`
gives them to the rate limiter (api/limits/rates.py). An operator key is a key like any
other (its own owner, its own limits) that also sees the whole fleet (`is_operator()`); without
any key the one local user is the operator.

Each key is its own owner: `owner_id()` is an HMAC-SHA256 of the key under the owner secret
(`OwnerSecret`), truncated to 128 bits of hex, so safe inside Redis keys; without the secret an
owner id seen in the fleet view or a log cannot confirm a guessed key offline, as a plain hash
with a public salt could. Stored resources (responses, batches, files) are stamped with it when
created, listed filtered by it, and read through `require_owner`, which answers another owner's
resource exactly like a missing one (404). Without keys every caller is the same owner,
"anonymous".

Each key is also its own prefix cache scope (shared/queue/prefix/cache_scope.py): its requests reuse
only what its own requests left in the workers' caches. Keys an operator lists with the same
`:cache=NAME` share one scope (a team's keys); without keys, the one local user has one.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections.abc import Iterable
from dataclasses import dataclass

from flask import Flask, g, request
from redis import Redis

from shared.queue.config import ApiKey, KeyLimits, Settings
from shared.queue.connection import redis_errors_as_503
from shared.queue.keys import Keys
from shared.wire.errors import AuthenticationError, NotFoundError

ANONYMOUS = "anonymous"
# Liveness probes, the API description and the page's static files carry nothing private (the
# page asks for a key itself; /metrics and /v1/fleet need one, as /v1 does).
PUBLIC_PATHS = frozenset({"/health", "/openapi.json", "/"})
PUBLIC_PREFIXES = ("/static/",)
_BEARER = "bearer "
# How often a process reads the shared owner secret again: should Redis lose it (a Redis
# without persistence, restarted), the processes agree again on whichever one is written first.
SECRET_RECHECK_S = 60.0


def owner_of_key(key: str, secret: bytes) -> str:
    """The owner id of an API key under `secret`: not reversible, [0-9a-f]{32}."""
    return hmac.new(secret, key.encode(), hashlib.sha256).hexdigest()[:32]


class OwnerSecret:
    """The secret owner ids are derived with: `MLXQ_OWNER_SECRET`, or else a random one kept
    in Redis (`Keys.owner_secret`), written by the first API process that needs it, so every
    process derives the same ids. Read at the first keyed request, not at start: the API
    starts while Redis is down, and a request then gets the 503 every other route gives."""

    def __init__(self, settings: Settings, redis: Redis):
        configured = settings.owner_secret
        self._fixed = configured.get_secret_value().encode() if configured else None
        self._redis, self._key = redis, Keys(settings.namespace).owner_secret()
        self._shared: bytes | None = None
        self._read_at = 0.0

    def get(self) -> bytes:
        if self._fixed is not None:
            return self._fixed
        if self._shared is None or time.monotonic() - self._read_at > SECRET_RECHECK_S:
            candidate = self._shared or secrets.token_hex(32).encode()
            with redis_errors_as_503():
                pipe = self._redis.pipeline(transaction=False)
                pipe.set(self._key, candidate, nx=True)
                pipe.get(self._key)
                _, stored = pipe.execute()
            self._shared, self._read_at = bytes(stored), time.monotonic()
        return self._shared


@dataclass(frozen=True)
class Caller:
    """Who a key is: its owner id, its limits, whether it is an operator's, and its prefix cache
    scope (shared/queue/prefix/cache_scope.py)."""

    owner: str
    limits: KeyLimits
    operator: bool
    cache_scope: str


def scope_of_key(owner: str, cache: str | None, secret: bytes) -> str:
    """A key's cache scope: its owner id, or for keys an operator names together
    (`:cache=NAME`), one scope derived from the name under `secret` (no key's owner id)."""
    if cache is None:
        return owner
    return hmac.new(secret, f"cache scope\0{cache}".encode(), hashlib.sha256).hexdigest()[:32]


class ApiKeys:
    """The configured keys, the operators' among them; `caller` finds who presented a key, in
    constant time."""

    def __init__(self, keys: Iterable[ApiKey], admin_keys: Iterable[ApiKey], secret: OwnerSecret):
        entries = [(key, False) for key in keys] + [(key, True) for key in admin_keys]
        self._keys = [
            (key.key.get_secret_value().encode(), key, operator) for key, operator in entries
        ]
        self._secret = secret

    def __bool__(self) -> bool:
        return bool(self._keys)

    def caller(self, presented: str) -> Caller | None:
        given = presented.encode("utf-8", "surrogateescape")
        found: tuple[bytes, ApiKey, bool] | None = None
        operator = False
        for entry in self._keys:  # every key compared, whichever matches
            if hmac.compare_digest(entry[0], given):
                found = found or entry
                operator = operator or entry[2]  # a key listed in both is an operator's
        if found is None:
            return None
        secret = self._secret.get()
        owner = owner_of_key(found[0].decode("utf-8", "surrogateescape"), secret)
        scope = scope_of_key(owner, found[1].cache, secret)
        return Caller(owner=owner, limits=found[1].limits, operator=operator, cache_scope=scope)


def _presented_key() -> str | None:
    header = request.headers.get("Authorization", "")
    if header[: len(_BEARER)].lower() != _BEARER:
        return request.headers.get("x-api-key", "").strip() or None
    return header[len(_BEARER) :].strip() or None


def _check_key(keys: ApiKeys) -> None:
    if request.path in PUBLIC_PATHS or request.path.startswith(PUBLIC_PREFIXES):
        return
    presented = _presented_key()
    if presented is None:
        raise AuthenticationError(
            "You didn't provide an API key. Provide it in an Authorization header using Bearer "
            "auth (i.e. Authorization: Bearer YOUR_KEY), or in an x-api-key header."
        )
    found = keys.caller(presented)
    if found is None:
        raise AuthenticationError("Incorrect API key provided.")
    g.mlxq_owner, g.mlxq_limits, g.mlxq_operator = found.owner, found.limits, found.operator
    g.mlxq_cache_scope = found.cache_scope


def _local_operator() -> None:
    g.mlxq_operator = True


def init_app(app: Flask, settings: Settings, redis: Redis) -> None:
    """Check keys on every request (`redis` keeps the shared owner secret); without any key,
    the one local caller is the operator."""
    keys = ApiKeys(settings.api_keys, settings.admin_keys, OwnerSecret(settings, redis))
    if keys:
        app.before_request(lambda: _check_key(keys))
    else:
        app.before_request(_local_operator)


def owner_id() -> str:
    """The current request's owner id (safe to use inside Redis keys)."""
    owner: str = g.get("mlxq_owner", ANONYMOUS)
    return owner


def cache_scope() -> str:
    """The current request's prefix cache scope: its key's (`scope_of_key`); without keys, the
    one local user's, "anonymous"."""
    scope: str = g.get("mlxq_cache_scope", ANONYMOUS)
    return scope


def is_operator() -> bool:
    """Whether the current caller sees the whole fleet: an operator key, or no keys at all."""
    return bool(g.get("mlxq_operator", False))


def key_limits() -> KeyLimits | None:
    """The current request's key's requests and tokens per minute; None: no limits."""
    limits: KeyLimits | None = g.get("mlxq_limits")
    return limits if limits else None


def is_owner(owner: str | None, caller: str) -> bool:
    """Whether `caller` owns a resource stamped `owner` (None: no resource), in constant time."""
    return owner is not None and hmac.compare_digest(owner.encode(), caller.encode())


def require_owner(owner: str | None, kind: str, resource_id: str) -> None:
    """Raise 404 unless the current caller owns the resource (`owner` None: it does not exist).

    Another owner's resource gets the very answer a missing one gets, so ids cannot be probed.
    """
    if owner is None or not hmac.compare_digest(owner.encode(), owner_id().encode()):
        raise NotFoundError(f"No {kind} found with id '{resource_id}'.", param=None)
