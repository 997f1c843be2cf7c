"""Who is calling and whether they may: API keys, the owner of stored resources, and the rule
that a server without keys listens on the loopback interface only.

With keys configured (`MLXQ_API_KEYS`, comma-separated), every route but `PUBLIC_PATHS` (and
the page's static files) needs `Authorization: Bearer <key>` (or `x-api-key: <key>`, as
Anthropic's SDK sends it); a missing or wrong key is a 401 `invalid_api_key`. The presented
key is compared with every configured key in constant time (`hmac.compare_digest`, no early
exit), and is never logged or echoed. The check is one `before_request` hook (`init_app`).

A key may carry limits (`sk-key:rpm=60:tpm=40000`, shared/queue/config.py): `key_limits()`
gives them to the rate limiter (api/queue/rate_limits.py).

Each key is its own owner: `owner_id()` is a truncated SHA-256 of the key (128 bits, hex, so
safe inside Redis keys and not reversible to the key). Stored resources (responses, batches,
files) are stamped with it when created, listed filtered by it, and read through
`require_owner`, which answers another owner's resource exactly like a missing one (404).
Without keys every caller is the same owner, "anonymous".
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
from collections.abc import Iterable

from flask import Flask, g, request

from shared.queue.config import ApiKey, KeyLimits, Settings
from shared.wire.errors import AuthenticationError, NotFoundError

ANONYMOUS = "anonymous"
# Liveness probes, the API description and the page's static files carry nothing private (the
# page asks for a key itself; /metrics and /v1/fleet need one, as /v1 does).
PUBLIC_PATHS = frozenset({"/health", "/openapi.json", "/"})
PUBLIC_PREFIXES = ("/static/",)
_BEARER = "bearer "


def owner_of_key(key: str) -> str:
    """The owner id of an API key: not reversible, [0-9a-f]{32}."""
    return hashlib.sha256(b"mlxq-owner\0" + key.encode()).hexdigest()[:32]


class ApiKeys:
    """The configured keys; `owner` finds the owner of a presented key, and its limits, in
    constant time."""

    def __init__(self, keys: Iterable[ApiKey]):
        secrets = [(key.key.get_secret_value(), key.limits) for key in keys]
        self._keys = [(secret.encode(), owner_of_key(secret)) for secret, _ in secrets]
        self._limits = {owner_of_key(secret): limits for secret, limits in secrets}

    def __bool__(self) -> bool:
        return bool(self._keys)

    def owner(self, presented: str) -> tuple[str, KeyLimits] | None:
        given = presented.encode("utf-8", "surrogateescape")
        found = None
        for key, owner in self._keys:  # every key compared, whichever matches
            if hmac.compare_digest(key, given):
                found = owner
        return None if found is None else (found, self._limits[found])


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
    found = keys.owner(presented)
    if found is None:
        raise AuthenticationError("Incorrect API key provided.")
    g.mlxq_owner, g.mlxq_limits = found


def init_app(app: Flask, settings: Settings) -> None:
    keys = ApiKeys(settings.api_keys)
    if keys:
        app.before_request(lambda: _check_key(keys))


def owner_id() -> str:
    """The current request's owner id (safe to use inside Redis keys)."""
    owner: str = g.get("mlxq_owner", ANONYMOUS)
    return owner


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


class OpenBindError(SystemExit):
    """The API was asked to listen beyond loopback without API keys."""


def _bind_host(bind: str) -> str:
    if bind.startswith("["):  # [::1]:8000
        return bind[1 : bind.find("]")]
    if bind.count(":") > 1:  # a bare IPv6 address
        return bind
    return bind.rsplit(":", 1)[0]


def _is_loopback(bind: str) -> bool:
    if bind.startswith("unix:"):
        return True
    host = _bind_host(bind)
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_bind(binds: Iterable[str], keys_configured: bool) -> str | None:
    """The line to log about exposure, or OpenBindError for a non-loopback bind without keys."""
    if keys_configured:
        return None
    open_binds = [bind for bind in binds if not _is_loopback(bind)]
    if open_binds:
        raise OpenBindError(
            f"mlxq: refusing to listen on {', '.join(open_binds)} without API keys: set "
            "MLXQ_API_KEYS, or bind to 127.0.0.1 (MLXQ_API_BIND)."
        )
    return "mlxq: no API keys set (MLXQ_API_KEYS): listening on the loopback interface only"
