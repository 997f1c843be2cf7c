"""Who may reach the API over the network (api/http/exposure.py), through the in-process app on
the real Redis: without keys, only its own machine (the peer, a proxy's forwarded client, the
Host, the Origin of a request that changes state); with keys, any origin and host, unless
MLXQ_ALLOWED_HOSTS names the hosts. Refusals are 403s in OpenAI's shape."""

from __future__ import annotations

import io

import pytest
from flask.testing import FlaskClient
from redis import Redis

from api import create_app
from api.http.exposure import OpenBindError, check_bind
from shared.queue.config import Settings
from shared.queue.keys import Keys
from tests.support import assert_openai_error

KEY = "sk-exposure-5e6f7a"
BODY = {"model": "no-such-model", "messages": [{"role": "user", "content": "hi"}]}
CHAT = "/v1/chat/completions"


def refused(response: object, code: str) -> None:
    assert_openai_error(response, 403)  # type: ignore[arg-type]
    assert response.get_json()["error"]["code"] == code  # type: ignore[attr-defined]


def passed(response: object) -> None:
    """Past every exposure check: the chat request reaches admission (no worker: 404)."""
    assert_openai_error(response, 404)  # type: ignore[arg-type]
    assert response.get_json()["error"]["code"] == "model_not_found"  # type: ignore[attr-defined]


@pytest.fixture
def keyed(app_settings: Settings) -> FlaskClient:
    keys = Settings(api_keys=KEY).api_keys
    return create_app(app_settings.model_copy(update={"api_keys": keys})).test_client()


@pytest.mark.parametrize(
    "bind", ["127.0.0.1:8000", "localhost:9", "[::1]:8000", "unix:/tmp/mlxq.sock", "127.0.0.2"]
)
def test_without_keys_loopback_binds_are_allowed_and_said(bind: str) -> None:
    line = check_bind([bind], keys_configured=False)
    assert line is not None and "loopback" in line and "MLXQ_API_KEYS" in line


@pytest.mark.parametrize("bind", ["0.0.0.0:8000", ":8000", "[::]:8000", "10.1.2.3:80", "host:80"])
def test_without_keys_an_open_bind_is_refused(bind: str) -> None:
    with pytest.raises(OpenBindError, match="MLXQ_API_KEYS"):
        check_bind(["127.0.0.1:8000", bind], keys_configured=False)
    assert check_bind([bind], keys_configured=True) is None


@pytest.mark.parametrize("path", ["/v1/models", "/health", "/", "/v1/fleet"])
def test_without_keys_a_request_from_another_machine_is_refused_whatever_server_runs_the_app(
    http: FlaskClient, path: str
) -> None:
    response = http.get(path, environ_base={"REMOTE_ADDR": "192.168.1.20"})
    refused(response, "loopback_only")


@pytest.mark.parametrize("peer", ["127.0.0.1", "127.9.9.9", "::1", "::ffff:127.0.0.1", ""])
def test_without_keys_a_loopback_peer_or_a_unix_socket_is_served(
    http: FlaskClient, peer: str
) -> None:
    passed(http.post(CHAT, json=BODY, environ_base={"REMOTE_ADDR": peer}))


@pytest.mark.parametrize(
    "header",
    [
        {"X-Forwarded-For": "203.0.113.5"},
        {"X-Forwarded-For": "127.0.0.1, 203.0.113.5"},
        {"Forwarded": 'for="[2001:db8::1]:4711"'},
        {"Forwarded": "for=198.51.100.17;proto=http"},
    ],
)
def test_without_keys_a_request_a_proxy_forwards_for_another_machine_is_refused(
    http: FlaskClient, header: dict[str, str]
) -> None:
    refused(http.post(CHAT, json=BODY, headers=header), "loopback_only")


def test_without_keys_a_proxy_on_the_machine_forwarding_for_the_machine_is_served(
    http: FlaskClient,
) -> None:
    passed(http.post(CHAT, json=BODY, headers={"X-Forwarded-For": "127.0.0.1"}))


@pytest.mark.parametrize("path", ["/v1/models", "/v1/responses/resp_1", "/", "/v1/fleet"])
def test_without_keys_a_foreign_host_name_as_dns_rebinding_sends_it_is_refused(
    http: FlaskClient, path: str
) -> None:
    refused(http.get(path, headers={"Host": "rebind.attacker.example:8000"}), "host_not_allowed")


def test_without_keys_health_answers_under_any_host_name(http: FlaskClient) -> None:
    assert http.get("/health", headers={"Host": "10.0.0.5:8000"}).status_code == 200


@pytest.mark.parametrize("host", ["localhost", "LocalHost:1234", "127.0.0.1:8000", "[::1]:8000"])
def test_without_keys_the_loopback_names_are_answered_on_any_port(
    http: FlaskClient, host: str
) -> None:
    passed(http.post(CHAT, json=BODY, headers={"Host": host}))


def test_allowed_hosts_extend_the_loopback_names(app_settings: Settings) -> None:
    settings = app_settings.model_copy(update={"allowed_hosts": ("mlxq.lan", "[fd00::2]")})
    http = create_app(settings).test_client()
    for host in ("mlxq.lan:8000", "MLXQ.LAN", "[fd00::2]:80", "localhost:8000"):
        passed(http.post(CHAT, json=BODY, headers={"Host": host}))
    refused(http.post(CHAT, json=BODY, headers={"Host": "other.lan"}), "host_not_allowed")
    assert Settings(allowed_hosts="a.lan, b.lan").allowed_hosts == ("a.lan", "b.lan")


@pytest.mark.parametrize(
    "origin", ["https://attacker.example", "http://attacker.example:8000", "null", "file://"]
)
def test_without_keys_a_page_of_another_origin_cannot_change_anything(
    http: FlaskClient, redis: Redis, app_settings: Settings, origin: str
) -> None:
    headers = {"Origin": origin}
    refused(http.post(CHAT, json=BODY, headers=headers), "origin_not_allowed")
    # A cross-site multipart upload needs no preflight: refused before anything is stored.
    upload = {"purpose": "batch", "file": (io.BytesIO(b"{}\n"), "in.jsonl")}
    refused(http.post("/v1/files", data=upload, headers=headers), "origin_not_allowed")
    assert not list(redis.scan_iter(f"{Keys(app_settings.namespace).ns}:file*"))
    refused(http.delete("/v1/files/file-abc", headers=headers), "origin_not_allowed")
    # Reading is the browser's to refuse (no CORS); only a state change is refused here.
    assert http.get("/v1/models", headers=headers).status_code == 200


@pytest.mark.parametrize(
    "origin", [None, "http://127.0.0.1:8000", "http://localhost:5173", "http://[::1]:8000"]
)
def test_without_keys_an_sdk_and_the_pages_own_origin_may_change_state(
    http: FlaskClient, origin: str | None
) -> None:
    headers = {} if origin is None else {"Origin": origin}
    passed(http.post(CHAT, json=BODY, headers=headers))


def test_with_keys_any_host_origin_and_peer_reach_the_key_check(keyed: FlaskClient) -> None:
    away = {
        "headers": {"Host": "api.example.com", "Origin": "https://app.example.com"},
        "environ_base": {"REMOTE_ADDR": "203.0.113.5"},
    }
    assert_openai_error(keyed.post(CHAT, json=BODY, **away), 401)  # type: ignore[arg-type]
    headers = {**away["headers"], "Authorization": f"Bearer {KEY}"}
    passed(keyed.post(CHAT, json=BODY, headers=headers, environ_base=away["environ_base"]))


def test_with_keys_and_allowed_hosts_another_host_is_refused_before_the_key_check(
    app_settings: Settings,
) -> None:
    update = {"api_keys": Settings(api_keys=KEY).api_keys, "allowed_hosts": ("api.example.com",)}
    http = create_app(app_settings.model_copy(update=update)).test_client()
    auth = {"Authorization": f"Bearer {KEY}"}
    passed(http.post(CHAT, json=BODY, headers={**auth, "Host": "api.example.com"}))
    refused(http.post(CHAT, json=BODY, headers={"Host": "rebind.example"}), "host_not_allowed")
    assert http.get("/health", headers={"Host": "10.0.0.5"}).status_code == 200


def test_without_keys_anthropics_routes_refuse_another_origin_in_anthropics_shape(
    http: FlaskClient,
) -> None:
    body = {"model": "no-such-model", "max_tokens": 8, "messages": BODY["messages"]}
    response = http.post(
        "/v1/messages",
        json=body,
        headers={"Origin": "https://attacker.example", "anthropic-version": "2023-06-01"},
    )
    assert response.status_code == 403
    assert response.get_json()["error"]["type"] == "permission_error"
