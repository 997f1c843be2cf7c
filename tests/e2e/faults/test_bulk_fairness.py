"""Fair sharing in the batch lane, on a SYNTHETIC worker (worker/engine/doubles/synthetic.py: a
token every 20 ms, no model): key A's batch of 2,000 lines is queued, then key B sends a batch
of 10. B's batch completes while A still has most of its lines to go, within seconds, because
the lane takes the keys in turn (shared/queue/turns.py); in arrival order B's lines would wait
behind A's 2,000 (about 200 s on this worker: two slots, 8 tokens a line).

The issue's target, scaled down: one key's 10 open 50,000-line batches must not make another
key's 10-line batch wait more than 2 minutes. Its own cluster: one worker with two slots, both
taking bulk jobs, and the API with two keys."""

from __future__ import annotations

import time
from collections.abc import Callable

import openai
import pytest

from tests.support import chat_line, start_batch, taken_in, wait_batch
from worker.ops.cluster import Cluster

KEY_A, KEY_B = "sk-mlxq-bulk-alpha-5a1c", "sk-mlxq-bulk-beta-77e0"
A_LINES, B_LINES = 2000, 10
TOKENS = 8
# B's lines take about 2 x 10 turns of two slots (about 0.2 s each); arrival order: 200 s.
B_WITHIN_S = 30


@pytest.fixture(scope="module")
def cluster(start_cluster: Callable[..., Cluster]) -> Cluster:
    env = {
        "MLXQ_API_KEYS": f"{KEY_A},{KEY_B}",
        "MLXQ_ENGINE": "synthetic",
        "MLXQ_SYNTHETIC_STEP_S": "0.02",
        "MLXQ_BATCH_SIZE": "2",
        "MLXQ_INTERACTIVE_SLOTS": "0",
    }
    return start_cluster(env=env)


def sdk(cluster: Cluster, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{cluster.api_url}/v1", api_key=key, max_retries=0)


def lines(tag: str, count: int) -> list[dict[str, object]]:
    return [chat_line(f"{tag}{i}", f"{tag} {i}", max_tokens=TOKENS) for i in range(count)]


def test_another_keys_small_batch_is_not_queued_behind_a_big_one(cluster: Cluster) -> None:
    a, b = sdk(cluster, KEY_A), sdk(cluster, KEY_B)
    big = start_batch(a, lines("a", A_LINES))
    taken_in(cluster.redis(), cluster.keys, big.id, timeout_s=120)  # all of A's lines queued
    sent = time.monotonic()
    small = start_batch(b, lines("b", B_LINES))
    done = wait_batch(b, small.id, timeout_s=240)
    waited = time.monotonic() - sent
    a_done = a.batches.retrieve(big.id).request_counts
    assert done.status == "completed"
    assert done.request_counts is not None and done.request_counts.completed == B_LINES
    assert a_done is not None
    print(f"B's batch took {waited:.1f} s; A had {a_done.completed} of {A_LINES} lines done")
    # In turns, A runs about one line per B line meanwhile, plus what ran while B's queued.
    assert a_done.completed < A_LINES // 4, f"B waited for {a_done.completed} of A's lines"
    assert waited < B_WITHIN_S
