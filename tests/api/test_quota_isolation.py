"""The quotas' target (issue 32): a key at its quota cannot make Redis refuse writes for other
keys. On a redis-server of the test's own, small and `noeviction` as mlxq needs it: one key
uploads until it is refused, and is refused by its quota (429), never by a full Redis (503);
another key then still uploads, creates a batch and reads back what it stored."""

from __future__ import annotations

from flask.testing import FlaskClient

from api import create_app
from shared.queue.config import Settings
from tests.support import assert_openai_error, batch_body, post_file
from worker.ops.cluster import free_port, start_redis, stop

MIB = 1024 * 1024
# Files of 256 KiB (below the 500 KB past which werkzeug's test client spools a body to a file it
# leaves open); a Redis this small fills with about 30 of them, a key's quota is 8.
FILE = 256 * 1024
MAXMEMORY = 8 * MIB
QUOTA = 8 * FILE
TRIES = 48
ALICE = {"Authorization": "Bearer sk-alice"}
BOB = {"Authorization": "Bearer sk-bob"}


def _client(app_settings: Settings, port: int) -> FlaskClient:
    settings = app_settings.model_copy(
        update={
            "redis_url": f"redis://127.0.0.1:{port}/0",
            "api_keys": Settings(api_keys="sk-alice,sk-bob").api_keys,
            "quota_file_bytes": QUOTA,
        }
    )
    return create_app(settings).test_client()


def test_a_key_at_its_quota_cannot_make_redis_refuse_writes_for_another_key(
    app_settings: Settings,
) -> None:
    port = free_port()
    server = start_redis(
        port, extra=["--maxmemory", str(MAXMEMORY), "--maxmemory-policy", "noeviction"]
    )
    try:
        http = _client(app_settings, port)
        statuses = [post_file(http, b"x" * FILE, headers=ALICE).status_code for _ in range(TRIES)]
        assert statuses[: QUOTA // FILE] == [200] * (QUOTA // FILE)
        assert set(statuses[QUOTA // FILE :]) == {429}, statuses  # its quota, not Redis's OOM
        refused = post_file(http, b"x" * FILE, headers=ALICE)
        assert_openai_error(refused, 429)
        assert refused.get_json()["error"]["code"] == "insufficient_quota"
        stored = post_file(http, b"x" * FILE, headers=BOB)
        assert stored.status_code == 200, stored.get_data(as_text=True)
        file_id = stored.get_json()["id"]
        batch = http.post("/v1/batches", json=batch_body(file_id), headers=BOB)
        assert batch.status_code == 200, batch.get_data(as_text=True)
        content = http.get(f"/v1/files/{file_id}/content", headers=BOB)
        assert content.data == b"x" * FILE
    finally:
        stop(server)
