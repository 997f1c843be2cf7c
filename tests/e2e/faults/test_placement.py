"""Prefix-aware placement on two real workers: a conversation's next turn runs on the worker
that holds its history (its usage shows the cached tokens); when that worker is full the turn
goes elsewhere at once, when it is dead after a bounded wait; and a prompt many requests share
does not pin them all on one worker (api/queue/placement.py, worker/runtime/intake/placed_take.py).

Its own cluster: two workers of 4 slots each on the real model, heartbeats every 0.5 s.
"""

from __future__ import annotations

import secrets
import signal
import threading
import time
from collections.abc import Callable

import openai
import pytest
from redis import Redis

from shared.observe.fleet import WorkerStats
from shared.observe.metrics import JobRecord
from shared.queue.keys import Keys
from tests.support import MODEL, NO_END, Stream
from worker.ops.cluster import Cluster, wait_until

SLOTS = 4
# About 400 prompt tokens: several 64-token blocks, a prefill of about 2 s on this CPU.
DOCUMENT = " ".join(
    f"Item {i}: the {w} shipment left the depot on day {i} and arrived intact."
    for i, w in enumerate(["red", "blue", "green", "amber", "violet", "grey"] * 4)
)


@pytest.fixture(scope="module")
def cluster(start_cluster: Callable[..., Cluster]) -> Cluster:
    return start_cluster(workers=2, env={"MLXQ_BATCH_SIZE": str(SLOTS)})


@pytest.fixture(scope="module")
def client(cluster: Cluster) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{cluster.api_url}/v1", api_key="unused", max_retries=0)


def opening() -> list[dict[str, str]]:
    """A conversation's first turn, with a document no other conversation sends."""
    system = f"Notes {secrets.token_hex(4)}. {DOCUMENT}"
    return [
        {"role": "system", "content": system},
        {"role": "user", "content": "Which shipment left first?"},
    ]


def ask(
    client: openai.OpenAI, messages: list[dict[str, str]], max_tokens: int = 8, long: bool = False
) -> object:
    return client.chat.completions.create(
        model=MODEL,
        messages=messages,  # type: ignore[arg-type]
        temperature=0,
        max_tokens=max_tokens,
        logit_bias=NO_END if long else openai.NOT_GIVEN,
    )


def next_turn(messages: list[dict[str, str]], reply: object) -> list[dict[str, str]]:
    answer = reply.choices[0].message.content or ""  # type: ignore[attr-defined]
    return [
        *messages,
        {"role": "assistant", "content": answer},
        {"role": "user", "content": "Why?"},
    ]


def record(cluster: Cluster, reply: object) -> JobRecord:
    """The fleet's record of the job that answered `reply` (written just after its answer)."""
    redis = cluster.redis()
    job_id = reply.id  # type: ignore[attr-defined]
    found: list[JobRecord] = []

    def recorded() -> bool:
        rows = redis.lrange(cluster.keys.recent_jobs(), 0, -1)
        found[:] = [r for r in map(JobRecord.model_validate_json, rows) if r.job_id == job_id]
        return bool(found)

    wait_until(recorded, 10, f"the record of {job_id}")
    return found[0]


def counter(redis: Redis, keys: Keys, name: str) -> int:
    return int(redis.hget(keys.model_metrics(MODEL), name) or 0)


def test_a_conversations_next_turns_run_on_the_worker_that_holds_its_history(
    cluster: Cluster, client: openai.OpenAI
) -> None:
    redis = cluster.redis()
    followed = counter(redis, cluster.keys, "placement_followed")
    for _ in range(3):  # by chance alone, three conversations stay put one time in eight
        messages = opening()
        first = ask(client, messages)
        holder = record(cluster, first).worker
        for _turn in range(2):
            messages = next_turn(messages, first)
            first = ask(client, messages)
            later = record(cluster, first)
            assert later.worker == holder
            assert later.cached_tokens >= 256  # its history came from the cache
    assert counter(redis, cluster.keys, "placement_followed") >= followed + 6


def test_when_the_holder_is_full_the_next_turn_runs_elsewhere_without_waiting(
    cluster: Cluster, client: openai.OpenAI
) -> None:
    redis = cluster.redis()
    messages = opening()
    first = ask(client, messages)
    holder = record(cluster, first).worker
    # Fill every slot of the holder: requests on the same history are placed there, and run
    # their 300 tokens whatever the document (an early end would empty the holder too soon).
    # Streamed, so that once the turn is answered they are cancelled (their clients leave)
    # rather than waited for.
    body = {"model": MODEL, "messages": next_turn(messages, first), "temperature": 0}
    body |= {"max_tokens": 300, "logit_bias": NO_END}
    busy = [Stream(cluster.api_url, body) for _ in range(SLOTS)]
    try:
        assert [stream.status for stream in busy] == [200] * SLOTS
        wait_until(lambda: _slots_used(cluster, holder) == SLOTS, 60, "the holder to be full")
        overridden = counter(redis, cluster.keys, "placement_overridden_busy")
        started = time.monotonic()
        turn = ask(client, next_turn(messages, first))
        took = time.monotonic() - started
    finally:
        for stream in busy:
            stream.close()
    assert record(cluster, turn).worker != holder
    assert counter(redis, cluster.keys, "placement_overridden_busy") == overridden + 1
    assert took < 30
    wait_until(lambda: _slots_used(cluster, holder) == 0, 30, "the holder's slots to free")


def test_many_requests_sharing_one_prompt_spread_over_both_workers(
    cluster: Cluster, client: openai.OpenAI
) -> None:
    messages = opening()
    holder = record(cluster, ask(client, messages)).worker
    replies: list[object] = []
    threads = [
        threading.Thread(target=lambda m=m: replies.append(ask(client, m, 16)))
        for m in [[*messages[:1], {"role": "user", "content": f"Item {i}?"}] for i in range(8)]
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    workers = [record(cluster, r).worker for r in replies]
    assert len(workers) == 8
    # The holder takes at most its slots; the rest go to the idle worker instead of waiting.
    assert 0 < workers.count(holder) <= SLOTS
    assert len(set(workers)) == 2


def test_a_turn_placed_on_a_dead_worker_runs_on_another_after_a_bounded_wait(
    cluster: Cluster, client: openai.OpenAI
) -> None:
    messages = opening()
    first = ask(client, messages)
    holder = cluster.worker_by_id(record(cluster, first).worker)
    cluster.kill_worker(holder, signal.SIGKILL)
    started = time.monotonic()
    turn = ask(client, next_turn(messages, first))
    took = time.monotonic() - started
    assert record(cluster, turn).worker != holder.worker_id
    assert took < 20  # the placement wait is at most 2 s, then prefill and 8 tokens


def _slots_used(cluster: Cluster, worker_id: str) -> int:
    raw = cluster.redis().get(cluster.keys.worker_stats(worker_id))
    if raw is None:
        return 0
    return WorkerStats.model_validate_json(raw).slots_used
