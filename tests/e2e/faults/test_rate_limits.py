"""Per-key rate limits across two API processes on one Redis (api/limits/rates.py): keys
with different limits; a burst at a key's limit, spread over both processes, gets exactly the
limit; both processes state the same buckets; tokens are counted at admission as the prompt's
tokens plus max_tokens. Queued tokens (shared/queue/queued_tokens.py), on a synthetic worker of
its own (the generation's content does not matter, its length does): held while a job is queued
or running, given back when it ends or is cancelled, a batch's by its lines; per key."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from typing import Any

import httpx
import openai
import pytest

from api.http.auth import owner_of_key
from tests.support import MESSAGES, MODEL, chat_line, stand_in_worker, start_batch, wait_batch
from worker.ops.cluster import Cluster, wait_until

SLOW, OTHER, TOKENS = "sk-slow", "sk-other", "sk-tokens"
# Each synthetic request below asks at least its max tokens: two of 200 never fit in 300.
QUEUED, QUEUED_TOO = "sk-queued", "sk-queued-too"
LIMIT = 300
KEYS = ",".join(
    [f"{SLOW}:rpm=5", f"{OTHER}:rpm=10", f"{TOKENS}:tpm=500"]
    + [f"{key}:queued={LIMIT}" for key in (QUEUED, QUEUED_TOO)]
)
CHAT = "/v1/chat/completions"
SYNTHETIC = "synthetic"
WORD = [" ", "\n"]  # stop strings that end an answer at its first word
IDLE = "idle-stand-in"  # announced by a stand-in worker that never takes a job
STEP_S = 0.02  # a synthetic job of 200 tokens runs 4 s


@pytest.fixture(scope="module")
def cluster(start_cluster: Callable[..., Cluster]) -> Cluster:
    return start_cluster(env={"MLXQ_API_KEYS": KEYS, "MLXQ_BATCH_SIZE": "8"})


@pytest.fixture(scope="module")
def apis(cluster: Cluster) -> list[str]:
    return [cluster.api_url, cluster.start_api()]


@pytest.fixture(scope="module")
def synthetic(cluster: Cluster, apis: list[str]) -> list[str]:
    """The APIs, with a synthetic worker serving SYNTHETIC beside the real one."""
    cluster.start_worker(
        MLXQ_ENGINE="synthetic", MLXQ_MODEL=SYNTHETIC, MLXQ_SYNTHETIC_STEP_S=str(STEP_S)
    )
    return apis


@pytest.fixture
def settled(cluster: Cluster, synthetic: list[str]) -> list[str]:
    """The APIs, once the queued keys hold nothing (a previous test's last job has ended)."""
    wait_until(lambda: _held(cluster, QUEUED) == _held(cluster, QUEUED_TOO) == 0, 10, "release")
    return synthetic


def _held(cluster: Cluster, key: str) -> int:
    secret: Any = cluster.redis().get(cluster.keys.owner_secret())  # made by the first request
    if secret is None:
        return 0  # no keyed request yet
    entries: Any = cluster.redis().hvals(cluster.keys.queued_tokens(owner_of_key(key, secret)))
    return sum(int(tokens) for tokens in entries)


def _answered(cluster: Cluster, batch_id: str) -> int:
    """The batch's lines answered so far, as the workers count them (reading nothing through the
    API, which would settle the batch)."""
    count: Any = cluster.redis().hget(cluster.keys.batch(batch_id), "completed")
    return int(count or 0)


def _chat(
    api: str, key: str, max_tokens: int = 1, model: str = MODEL, stop: list[str] | None = None
) -> httpx.Response:
    body = {"model": model, "messages": MESSAGES, "max_tokens": max_tokens, "temperature": 0}
    if stop is not None:
        body["stop"] = stop
    auth = {"Authorization": f"Bearer {key}"}
    return httpx.post(f"{api}{CHAT}", json=body, headers=auth, timeout=120)


def _background(api: str, key: str, max_output_tokens: int, model: str = SYNTHETIC) -> str:
    body = {
        "model": model,
        "input": "hi",
        "background": True,
        "max_output_tokens": max_output_tokens,
    }
    answer = httpx.post(
        f"{api}/v1/responses", json=body, headers={"Authorization": f"Bearer {key}"}, timeout=30
    )
    assert answer.status_code == 200, answer.text
    response_id: str = answer.json()["id"]
    return response_id


def _status(api: str, key: str, response_id: str) -> str:
    auth = {"Authorization": f"Bearer {key}"}
    answer = httpx.get(f"{api}/v1/responses/{response_id}", headers=auth, timeout=30)
    status: str = answer.json()["status"]
    return status


def _client(api: str, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{api}/v1", api_key=key, max_retries=0)


def _synthetic_lines(count: int, max_tokens: int) -> list[dict[str, Any]]:
    """A batch's lines for SYNTHETIC, each asking `max_tokens`."""
    return [chat_line(f"l{i}", "hi", model=SYNTHETIC, max_tokens=max_tokens) for i in range(count)]


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
    # Each answer stops at its first word: charged its 200 tokens all the same, and quick, so
    # the bucket (500 a minute, 8 a second) refills little between the three.
    first = _chat(apis[0], TOKENS, max_tokens=200, stop=WORD)
    assert first.status_code == 200
    cost = first.json()["usage"]["prompt_tokens"] + 200
    assert first.headers["x-ratelimit-limit-tokens"] == "500"
    assert first.headers["x-ratelimit-remaining-tokens"] == str(500 - cost)
    assert _chat(apis[1], TOKENS, max_tokens=200, stop=WORD).status_code == 200
    third = _chat(apis[0], TOKENS, max_tokens=200, stop=WORD)
    assert third.status_code == 429
    assert third.json()["error"]["type"] == "tokens"
    assert int(third.headers["Retry-After"]) >= 1


def test_a_key_at_its_queued_limit_waits_for_its_jobs_to_end_and_another_key_does_not(
    settled: list[str], cluster: Cluster
) -> None:
    running = _background(settled[0], QUEUED, 200)
    refused = _chat(settled[1], QUEUED, 200, SYNTHETIC)  # the other API process: fleet-wide
    assert refused.status_code == 429, refused.text
    error = refused.json()["error"]
    assert (error["code"], error["type"]) == ("rate_limit_exceeded", "queued_tokens")
    assert f"Limit {LIMIT}" in error["message"]
    assert int(refused.headers["Retry-After"]) >= 1
    assert not [h for h in refused.headers if h.startswith("x-ratelimit")]  # OpenAI has none
    assert _status(settled[0], QUEUED, running) in ("queued", "in_progress")
    assert _chat(settled[1], QUEUED_TOO, 200, SYNTHETIC).status_code == 200
    ended = ("completed", "incomplete")  # incomplete: it ran to its max_output_tokens
    wait_until(lambda: _status(settled[1], QUEUED, running) in ended, 60, "the response")
    wait_until(lambda: _held(cluster, QUEUED) == 0, 5, "its tokens given back")
    assert _chat(settled[0], QUEUED, 200, SYNTHETIC).status_code == 200


def test_a_cancelled_job_gives_its_tokens_back_at_once(
    settled: list[str], cluster: Cluster
) -> None:
    running = _background(settled[0], QUEUED, 250)  # 5 s if it ran to its end
    assert _chat(settled[1], QUEUED, 100, SYNTHETIC).status_code == 429
    auth = {"Authorization": f"Bearer {QUEUED}"}
    cancel = httpx.post(f"{settled[1]}/v1/responses/{running}/cancel", headers=auth, timeout=30)
    assert cancel.json()["status"] == "cancelled"
    started = time.monotonic()
    wait_until(lambda: _held(cluster, QUEUED) == 0, 2, "the cancelled job's tokens")
    assert time.monotonic() - started < 2
    assert _chat(settled[0], QUEUED, 100, SYNTHETIC).status_code == 200


def test_a_batch_holds_its_lines_tokens_until_they_are_answered(
    settled: list[str], cluster: Cluster
) -> None:
    client = _client(settled[0], QUEUED)
    batch = start_batch(client, _synthetic_lines(2, 100))
    assert batch.status == "in_progress"
    assert 200 < _held(cluster, QUEUED) < LIMIT
    assert _chat(settled[1], QUEUED, 200, SYNTHETIC).status_code == 429
    # Each line gives its share back as its answer is recorded, before anyone reads the batch
    # (reading it would finalize it, which drops whatever is left).
    wait_until(lambda: _answered(cluster, batch.id) == 2, 60, "both lines answered")
    assert _held(cluster, QUEUED) == 0
    assert _chat(settled[1], QUEUED, 200, SYNTHETIC).status_code == 200
    assert wait_batch(client, batch.id).status == "completed"


def test_a_batch_over_the_room_left_or_the_limit_fails_as_openai_fails_it(
    settled: list[str], cluster: Cluster
) -> None:
    client = _client(settled[0], QUEUED)
    batch = start_batch(client, _synthetic_lines(2, 200))  # 400 tokens: more than the limit
    assert batch.status == "failed" and batch.errors is not None and batch.errors.data
    error = batch.errors.data[0]
    assert error.code == "token_limit_exceeded" and "can never run" in (error.message or "")
    # A response no worker takes holds its tokens however long the batch's intake takes to start.
    with stand_in_worker(cluster.redis(), cluster.keys, IDLE):
        waiting = _background(settled[1], QUEUED, 200, model=IDLE)
        late = start_batch(client, _synthetic_lines(1, 150))
        assert late.status == "failed" and late.errors is not None and late.errors.data
        assert late.errors.data[0].code == "token_limit_exceeded"
        assert "Enqueued token limit reached" in (late.errors.data[0].message or "")
        assert _status(settled[1], QUEUED, waiting) == "queued"
        auth = {"Authorization": f"Bearer {QUEUED}"}
        httpx.post(f"{settled[1]}/v1/responses/{waiting}/cancel", headers=auth, timeout=30)


def test_an_anthropic_message_batch_over_the_limit_ends_with_each_request_rate_limited(
    settled: list[str],
) -> None:
    request = {"model": SYNTHETIC, "max_tokens": 200, "messages": MESSAGES}
    body = {"requests": [{"custom_id": f"r{i}", "params": request} for i in range(2)]}
    headers = {"x-api-key": QUEUED, "anthropic-version": "2023-06-01"}
    with httpx.Client(base_url=settled[0], headers=headers, timeout=30) as http:
        created = http.post("/v1/messages/batches", json=body)
        assert created.status_code == 200, created.text  # its intake finds it too large
        batch_id = created.json()["id"]

        def batch() -> dict[str, Any]:
            found: dict[str, Any] = http.get(f"/v1/messages/batches/{batch_id}").json()
            return found

        wait_until(lambda: batch()["processing_status"] == "ended", 30, "the batch's end")
        assert batch()["request_counts"]["errored"] == 2
        lines = http.get(f"/v1/messages/batches/{batch_id}/results").text.splitlines()
    results = [json.loads(line) for line in lines]
    assert [r["custom_id"] for r in results] == ["r0", "r1"]
    for r in results:
        error = r["result"]["error"]["error"]  # Anthropic's error body
        assert (r["result"]["type"], error["type"]) == ("errored", "rate_limit_error")
        assert "can never run" in error["message"]


def test_a_batch_line_over_the_context_window_holds_only_its_prompt_and_fails_alone(
    settled: list[str], cluster: Cluster
) -> None:
    client = _client(settled[0], QUEUED)
    lines = [chat_line("too-long", "hi", max_tokens=100_000), chat_line("fine", "hi", max_tokens=1)]
    batch = start_batch(client, lines)  # the real model's window: 100000 tokens never fit
    assert batch.status == "in_progress"
    ended = wait_batch(client, batch.id)
    assert ended.status == "completed" and ended.request_counts is not None
    assert (ended.request_counts.completed, ended.request_counts.failed) == (1, 1)
    assert _held(cluster, QUEUED) == 0
