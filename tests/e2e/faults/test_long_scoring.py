"""No request holds the engine past its step budget (issue 42, point 1): a text completion that
echoes and scores several long prompts is computed a budget's worth a step, so the worker's
watchdog, set low here, never sees a step run past it, and another key's chat sent meanwhile is
answered between those steps.

Before scoring was staged (worker/engine/staged_prompt.py) every prompt of such a job was scored
in one step, then prefilled again in the batch: these prompts took one step of about 20 s here,
and the watchdog below ended the worker, failing both requests with `worker_lost`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from tests.e2e.faults.conftest import exactly_workers, started_ids
from tests.support import MODEL, chat_body
from worker.ops.cluster import Cluster, wait_until

# Low enough that one step scoring the prompts below trips it on this machine, with room over
# a budgeted step: MLXQ_PREFILL_TOKENS (what a step prefills with nothing decoding) of 128
# takes 1-4 s here on a loaded machine, a fresh worker's first step included.
WATCHDOG_S = 8.0
LOW = {"MLXQ_WATCHDOG_S": str(WATCHDOG_S), "MLXQ_PREFILL_TOKENS": "128"}
KEYS = ("sk-mlxq-test-scorer-3c9e1a", "sk-mlxq-test-chatter-8f04d2")
PROMPTS = 3
CHAT_S = 15.0  # the 5 s target's machine is quieter than this shared 2-core one


@pytest.fixture(scope="module")
def cluster(start_cluster: Callable[..., Cluster]) -> Cluster:
    cluster = start_cluster(env={"MLXQ_API_KEYS": ",".join(KEYS), "MLXQ_BATCH_SIZE": "4"}, **LOW)
    _post(cluster, KEYS[1], "/v1/chat/completions", chat_body(max_tokens=2))  # warm up
    return cluster


def _post(cluster: Cluster, key: str, path: str, body: dict[str, Any]) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"}
    return httpx.post(f"{cluster.api_url}{path}", json=body, headers=headers, timeout=300)


def _long_prompt(k: int) -> str:
    """About 600 tokens, its own text (nothing for a prefix cache to share)."""
    return " ".join(f"Line {i} of list {k}: the {k}th river meets the sea." for i in range(35))


def test_scoring_long_prompts_keeps_the_worker_up_and_another_keys_chat_answered(
    cluster: Cluster,
) -> None:
    (worker,) = exactly_workers(cluster, 1, **LOW)
    scored = {
        "model": MODEL,
        "prompt": [_long_prompt(k) for k in range(PROMPTS)],
        "echo": True,
        "logprobs": 1,
        "max_tokens": 1,
        "temperature": 0,
    }
    with ThreadPoolExecutor(1) as pool:
        big = pool.submit(_post, cluster, KEYS[0], "/v1/completions", scored)
        wait_until(lambda: started_ids(cluster, worker), 60, "the scoring job to run")
        time.sleep(1.0)  # its prompts are being scored
        sent = time.monotonic()
        chat = _post(cluster, KEYS[1], "/v1/chat/completions", chat_body(max_tokens=8))
        chat_s = time.monotonic() - sent
        reply = big.result(timeout=300)
        big_ended = time.monotonic()

    assert chat.status_code == 200, chat.text
    assert chat.json()["usage"]["completion_tokens"] >= 1
    assert reply.status_code == 200, reply.text
    assert chat_s < CHAT_S
    assert sent + chat_s < big_ended - 2.0, "the chat waited for the scoring to end"
    choices = reply.json()["choices"]
    assert len(choices) == PROMPTS
    prompt_tokens = reply.json()["usage"]["prompt_tokens"]
    echoed = sum(len(c["logprobs"]["token_logprobs"]) - 1 for c in choices)  # less each answer
    assert echoed == prompt_tokens > PROMPTS * 500
    assert all(c["logprobs"]["token_logprobs"][0] is None for c in choices)
    assert worker.proc.poll() is None, "the worker exited"
