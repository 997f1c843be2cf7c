"""Per-key rate limits across two API processes on one Redis (api/queue/rate_limits.py): keys
with different limits; a burst at a key's limit, spread over both processes, gets exactly the
limit; both processes state the same buckets; tokens are counted at admission as the prompt's
tokens plus max_tokens."""

from __future__ import annotations

import threading
from collections.abc import Callable

import httpx
import pytest

from tests.support import MESSAGES, MODEL
from worker.ops.cluster import Cluster

SLOW, OTHER, TOKENS = "sk-slow", "sk-other", "sk-tokens"
KEYS = f"{SLOW}:rpm=5,{OTHER}:rpm=10,{TOKENS}:tpm=500"
CHAT = "/v1/chat/completions"


@pytest.fixture(scope="module")
def apis(start_cluster: Callable[..., Cluster]) -> list[str]:
    cluster = start_cluster(env={"MLXQ_API_KEYS": KEYS, "MLXQ_BATCH_SIZE": "8"})
    return [cluster.api_url, cluster.start_api()]


def _chat(api: str, key: str, max_tokens: int = 1) -> httpx.Response:
    body = {"model": MODEL, "messages": MESSAGES, "max_tokens": max_tokens, "temperature": 0}
    auth = {"Authorization": f"Bearer {key}"}
    return httpx.post(f"{api}{CHAT}", json=body, headers=auth, timeout=120)


def _state(api: str, key: str) -> dict[str, str]:
    answer = httpx.get(f"{api}/v1/models", headers={"Authorization": f"Bearer {key}"}, timeout=10)
    return {k: v for k, v in answer.headers.items() if k.startswith("x-ratelimit")}


def test_a_burst_over_both_processes_gets_exactly_the_limit_and_both_agree(
    apis: list[str],
) -> None:
    answers: list[httpx.Response] = []
    start = threading.Barrier(8)

    def attempt(api: str) -> None:
        start.wait()
        answers.append(_chat(api, SLOW))

    threads = [threading.Thread(target=attempt, args=(apis[i % 2],)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(a.status_code for a in answers) == [200] * 5 + [429] * 3
    for refused in (a for a in answers if a.status_code == 429):
        assert refused.json()["error"]["code"] == "rate_limit_exceeded"
        assert refused.json()["error"]["type"] == "requests"
        assert 1 <= int(refused.headers["Retry-After"]) <= 12
    for api in apis:
        state = _state(api, SLOW)
        assert state["x-ratelimit-limit-requests"] == "5"
        assert state["x-ratelimit-remaining-requests"] == "0"
        assert "x-ratelimit-limit-tokens" not in state  # this key has no token limit


def test_another_key_has_its_own_limits_and_buckets(apis: list[str]) -> None:
    for i in range(3):
        assert _chat(apis[i % 2], OTHER).status_code == 200
    for api in apis:  # one request comes back every 6 s
        state = _state(api, OTHER)
        assert state["x-ratelimit-limit-requests"] == "10"
        assert state["x-ratelimit-remaining-requests"] in ("7", "8")


def test_tokens_are_the_counted_prompt_plus_max_tokens(apis: list[str]) -> None:
    first = _chat(apis[0], TOKENS, max_tokens=200)
    assert first.status_code == 200
    cost = first.json()["usage"]["prompt_tokens"] + 200
    assert first.headers["x-ratelimit-limit-tokens"] == "500"
    assert first.headers["x-ratelimit-remaining-tokens"] == str(500 - cost)
    assert _chat(apis[1], TOKENS, max_tokens=200).status_code == 200
    third = _chat(apis[0], TOKENS, max_tokens=200)
    assert third.status_code == 429
    assert third.json()["error"]["type"] == "tokens"
    assert int(third.headers["Retry-After"]) >= 1
