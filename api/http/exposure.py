"""Who may reach the API over the network: a server without keys serves its own machine only.

Without keys (`MLXQ_API_KEYS`, `MLXQ_ADMIN_KEYS`) anyone who reaches the API is its user, so
the app itself holds it to the loopback interface, whatever server runs it (`init_app`, one
`before_request` hook), on top of gunicorn's refusal to bind elsewhere (`check_bind`):
- **the peer**: a request from an address that is not loopback, or forwarded by a proxy for
  one (`X-Forwarded-For`, `Forwarded`), is refused (`loopback_only`). A Unix socket is local.
- **the Host**: only the loopback names (`localhost`, `127.0.0.1`, `[::1]`, any port) and
  `MLXQ_ALLOWED_HOSTS`. A web page that rebinds its own DNS name to 127.0.0.1 reaches the
  API under that name, and is refused (`host_not_allowed`).
- **the Origin** of a request that changes state (POST, PUT, PATCH, DELETE): absent (an SDK,
  curl) or one of the allowed hosts, any port (the bundled page, which is same-origin). A page
  elsewhere can post a form or a multipart upload cross-site without a preflight; its browser
  names its origin, or `null` (an https page posting to http, a sandboxed frame), both refused
  (`origin_not_allowed`).

With keys the Origin check is off: a key travels in a header, which no cross-site form or
upload can send, so a request from another origin fails at the key check anyway. The Host
allow-list applies only when `MLXQ_ALLOWED_HOSTS` is set: a keyed deployment answers under
whatever DNS names its operator gave it, and rebinding gains a page nothing without a key.
`/health` is exempt from the Host check: it holds nothing, and load balancers probe it by
address.

Refusals are 403s in OpenAI's shape: the request is well formed and understood, and refused
for where it comes from, which retrying does not change (the SDKs retry neither 400 nor 403).
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable
from urllib.parse import urlsplit

from flask import Flask, request

from shared.queue.config import Settings
from shared.wire.errors import ForbiddenError

LOOPBACK_HOSTS = frozenset({"localhost", "127.0.0.1", "::1"})
STATE_CHANGING = frozenset({"POST", "PUT", "PATCH", "DELETE"})
HOST_EXEMPT = frozenset({"/health"})
# The addresses in a `Forwarded` header (RFC 7239): for=192.0.2.1, for="[2001:db8::1]:80".
_FORWARDED_FOR = re.compile(r'for="?([^";,]+)"?', re.IGNORECASE)


class OpenBindError(SystemExit):
    """The API was asked to listen beyond loopback without API keys."""


def _host_part(address: str) -> str:
    """The host of `host`, `host:port`, `[v6]`, `[v6]:port` or a bare IPv6 address."""
    if address.startswith("["):
        return address[1 : address.find("]")]
    if address.count(":") > 1:
        return address
    return address.rsplit(":", 1)[0]


def _is_loopback_host(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    mapped = getattr(address, "ipv4_mapped", None)  # ::ffff:127.0.0.1, from a dual-stack socket
    return address.is_loopback or (mapped is not None and mapped.is_loopback)


def _is_loopback(bind: str) -> bool:
    return bind.startswith("unix:") or _is_loopback_host(_host_part(bind))


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


def allowed_hosts(settings: Settings) -> frozenset[str]:
    """The names the API answers under, lower-case, without ports or brackets."""
    extra = (_host_part(host.strip()).lower() for host in settings.allowed_hosts)
    return LOOPBACK_HOSTS | frozenset(extra)


def _forwarded_for() -> list[str]:
    """The client addresses a proxy in front says it forwards for."""
    found = [a.strip() for a in request.headers.get("X-Forwarded-For", "").split(",")]
    found += _FORWARDED_FOR.findall(request.headers.get("Forwarded", ""))
    return [_host_part(address) for address in found if address]


def _check_peer() -> None:
    peer = request.remote_addr or ""  # empty on a Unix socket
    if (peer and not _is_loopback_host(peer)) or not all(
        _is_loopback_host(a) for a in _forwarded_for()
    ):
        raise ForbiddenError(
            "This server has no API keys and serves its own machine only; set MLXQ_API_KEYS "
            "to serve others.",
            code="loopback_only",
        )


def _check_host(allowed: frozenset[str]) -> None:
    if request.path in HOST_EXEMPT:
        return
    if _host_part(request.host).lower() not in allowed:
        raise ForbiddenError(
            "This server does not answer under that host name; MLXQ_ALLOWED_HOSTS lists "
            "the names it answers under.",
            code="host_not_allowed",
        )


def _check_origin(allowed: frozenset[str]) -> None:
    origin = request.headers.get("Origin")
    if origin is None or request.method not in STATE_CHANGING:
        return
    parts = urlsplit(origin)
    host = (parts.hostname or "").lower()
    if parts.scheme not in ("http", "https") or host not in allowed:
        raise ForbiddenError(
            "A page of another origin cannot change anything on this server (it has no API "
            "keys); an API client sends no Origin header.",
            code="origin_not_allowed",
        )


def init_app(app: Flask, settings: Settings) -> None:
    """Hold an API without keys to its own machine; with keys, check the Host only where
    `MLXQ_ALLOWED_HOSTS` names the hosts. Registered before the key check, so a refused
    request learns nothing of the keys."""
    allowed = allowed_hosts(settings)
    if not settings.keyed:

        def check_local() -> None:
            _check_peer()
            _check_host(allowed)
            _check_origin(allowed)

        app.before_request(check_local)
    elif settings.allowed_hosts:
        app.before_request(lambda: _check_host(allowed))
