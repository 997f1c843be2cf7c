"""A real worker with MLXQ_KV_BITS=8 (worker/engine/batch/quantized_kv.py): it answers, and a
conversation's next turn starts from the prefix cache's quantized copy of the first.

One worker process on the session's Redis under a namespace of its own, its prefix cache's disk
tier on (its files take the quantized layout); requests go through the in-process app, greedy, a
few tokens each.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from flask.testing import FlaskClient

from api import create_app
from shared.queue.config import Settings
from tests.support import CHAT, MODEL, REAL_ENGINE
from worker.ops.cluster import Cluster

HEARTBEAT_S = 0.5
SYSTEM = "You are a geography teacher. You answer in one short sentence, and you never guess."


@dataclass(frozen=True)
class Quantized:
    http: FlaskClient
    log: Path  # the worker's output


@pytest.fixture(scope="module")
def quantized(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Quantized]:
    logs = tmp_path_factory.mktemp("logs")
    disk = {"MLXQ_PREFIX_CACHE_DIR": str(tmp_path_factory.mktemp("prefix-cache"))}
    env = {**REAL_ENGINE, **disk, "MLXQ_PREFIX_CACHE_DISK_MB": "64", "MLXQ_KV_BITS": "8"}
    cluster = Cluster("mlxqkv8", HEARTBEAT_S, MODEL, env=env, logs=logs, url=redis_url)
    settings = Settings(redis_url=redis_url, namespace="mlxqkv8", heartbeat_s=HEARTBEAT_S)
    try:
        cluster.start_worker(MLXQ_BATCH_SIZE="4")
        yield Quantized(create_app(settings).test_client(), logs / "worker.log")
    finally:
        cluster.stop()


def _ask(http: FlaskClient, messages: list[dict[str, str]], max_tokens: int) -> dict[str, Any]:
    body = {"model": MODEL, "messages": messages, "max_tokens": max_tokens, "temperature": 0}
    reply = http.post(CHAT, json=body)
    assert reply.status_code == 200, reply.get_json()
    answer: dict[str, Any] = reply.get_json()
    return answer


def test_a_worker_with_8_bit_kv_answers_in_its_batch(quantized: Quantized) -> None:
    question = [{"role": "user", "content": "What is the capital of France?"}]
    answer = _ask(quantized.http, question, 12)
    # Not the words: 8-bit KV moves this small model's logits by up to ~0.7 (docs/benchmarks.md,
    # "Quantized KV"), which turns a near tie of its first token ("The" or "L'").
    assert answer["choices"][0]["message"]["content"].strip()
    assert answer["usage"]["completion_tokens"] > 0
    assert "KV quantized to 8 bits" in quantized.log.read_text()


def test_the_next_turn_starts_from_the_quantized_cache_of_the_first(quantized: Quantized) -> None:
    said = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Hello."}]
    first = _ask(quantized.http, said, 4)
    reply = first["choices"][0]["message"]["content"]
    more = [*said, {"role": "assistant", "content": reply}, {"role": "user", "content": "Bye."}]
    second = _ask(quantized.http, more, 4)
    cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached >= first["usage"]["prompt_tokens"]
    assert second["choices"][0]["finish_reason"] in ("stop", "length")
