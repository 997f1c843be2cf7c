"""Placement acts on SYNTHETIC workers that model prefill
(worker/engine/doubles/synthetic_prefill.py), as
on real ones: they publish the default model's tokenizer and what their cache holds, so a
conversation's next turn runs on the worker that holds its history, and starts sooner there.
This is what lets `bench placement --engine synthetic` measure placement apart from CPU.

A request's `prompt_cache_key` steers it the same way, within its caller's scope only.

Its own cluster: two synthetic workers (a 10 ms step, 2 ms per uncached prompt token), behind an
API with two keys.
"""

from __future__ import annotations

import secrets
import threading
from collections.abc import Callable

import openai
import pytest

from tests.e2e.faults.test_placement import ask, next_turn, opening, record
from tests.support import MODEL
from worker.ops.cluster import Cluster, wait_until

ALPHA, BETA = "sk-hint-alpha-1", "sk-hint-beta-2"

SYNTHETIC = {
    "MLXQ_ENGINE": "synthetic",
    "MLXQ_SYNTHETIC_STEP_S": "0.01",
    "MLXQ_SYNTHETIC_PREFILL_S_PER_TOKEN": "0.002",
    "MLXQ_API_KEYS": f"{ALPHA},{BETA}",
}


@pytest.fixture(scope="module")
def cluster(start_cluster: Callable[..., Cluster]) -> Cluster:
    return start_cluster(workers=2, env=SYNTHETIC)


def test_a_conversations_next_turn_runs_where_its_history_is_cached_and_starts_sooner(
    cluster: Cluster,
) -> None:
    client = caller(cluster, ALPHA)
    for _ in range(3):  # by chance alone, three conversations stay put one time in eight
        messages = opening()
        reply = ask(client, messages)
        first = record(cluster, reply)
        later = record(cluster, ask(client, next_turn(messages, reply)))
        assert later.worker == first.worker
        assert later.cached_tokens >= first.prompt_tokens - 8
        assert first.ttft_s is not None and later.ttft_s is not None
        assert later.ttft_s < first.ttft_s / 2


def caller(cluster: Cluster, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{cluster.api_url}/v1", api_key=key, max_retries=0)


def hinted(client: openai.OpenAI, key: str) -> object:
    """A one-message prompt no earlier request began with, under `prompt_cache_key` `key`."""
    messages = [{"role": "user", "content": f"{secrets.token_hex(8)} Say hello."}]
    return client.chat.completions.create(
        model=MODEL,
        messages=messages,  # type: ignore[arg-type]
        max_tokens=4,
        prompt_cache_key=key,
    )


def test_a_prompt_cache_key_steers_its_callers_requests_to_one_worker_and_no_one_elses(
    cluster: Cluster,
) -> None:
    alpha, beta = caller(cluster, ALPHA), caller(cluster, BETA)
    redis, keys = cluster.redis(), cluster.keys
    workers = [bytes(w).decode() for w in redis.zrange(keys.workers(MODEL), 0, -1)]
    # Both workers idle place a new prompt on the same one each time (most free slots, then the
    # first): so first make the key's worker the other one, by a long job on the first.
    replies: list[object] = []
    busy = threading.Thread(target=lambda: replies.append(ask(alpha, opening(), max_tokens=300)))
    busy.start()
    wait_until(lambda: any(redis.llen(keys.taking(w)) for w in workers), 10, "the long job")
    first = record(cluster, hinted(alpha, "session-1"))
    busy.join()
    default = record(cluster, replies[0]).worker
    assert first.worker != default
    wait_until(lambda: not any(redis.llen(keys.taking(w)) for w in workers), 10, "idle workers")
    # Both idle again: another prompt with the key follows it; the other caller's identical key,
    # and a request without one, go where placement puts a new prompt.
    assert record(cluster, hinted(alpha, "session-1")).worker == first.worker
    assert record(cluster, hinted(beta, "session-1")).worker == default
    assert record(cluster, hinted(alpha, "session-2")).worker == default
