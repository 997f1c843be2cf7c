"""A large batch created on the real API under gunicorn (gevent) leaves its hub free: the create
call answers `validating` at once and `/health` on the same process answers promptly while the
intake process reads the file. The bounds are generous (a shared, loaded machine); the figures
are `python -m bench intake`'s (docs/benchmarks.md)."""

from __future__ import annotations

import json
import time

import httpx
from redis import Redis

from tests.support import CHAT, stand_in_worker, waiting_in
from worker.ops.cluster import Cluster, wait_until

# A model a stand-in worker announces and never serves: the lines stay queued.
IDLE_MODEL = "intake-stand-in"
LINES = 10_000
WATCH_S = 5.0
# Before the intake moved off the hub, 10,000 lines held /health for several seconds.
PROMPT_S = 1.5


def _input() -> bytes:
    body = {"model": IDLE_MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    rows = (
        {"custom_id": f"l{i}", "method": "POST", "url": CHAT, "body": body} for i in range(LINES)
    )
    return "\n".join(json.dumps(row) for row in rows).encode()


def test_health_answers_promptly_while_a_large_batch_is_validated(
    api_url: str, redis: Redis, stack: Cluster
) -> None:
    with stand_in_worker(redis, stack.keys, IDLE_MODEL), httpx.Client(base_url=api_url) as http:
        upload = http.post(
            "/v1/files", files={"file": ("in.jsonl", _input())}, data={"purpose": "batch"}
        )
        assert upload.status_code == 200, upload.text
        body = {"input_file_id": upload.json()["id"], "endpoint": CHAT, "completion_window": "24h"}
        sent = time.perf_counter()
        created = http.post("/v1/batches", json=body, timeout=60)
        assert time.perf_counter() - sent < PROMPT_S
        assert created.json()["status"] == "validating"
        slowest = 0.0
        while time.perf_counter() - sent < WATCH_S:
            asked = time.perf_counter()
            assert http.get("/health", timeout=60).status_code == 200
            slowest = max(slowest, time.perf_counter() - asked)
            time.sleep(0.05)
        batch_id = created.json()["id"]
        taken = http.get(f"/v1/batches/{batch_id}").json()["request_counts"]["total"]
        assert slowest < PROMPT_S, f"/health took {slowest:.2f} s; {taken} lines were in"
        http.post(f"/v1/batches/{batch_id}/cancel")
        # At once, or after the chunk its intake was queuing meanwhile, which it drops itself.
        wait_until(
            lambda: waiting_in(redis, stack.keys, IDLE_MODEL, "batch") == 0,
            10,
            "the cancelled batch's lines to leave the lane",
        )
