"""Placement acts on SYNTHETIC workers that model prefill
(worker/engine/doubles/synthetic_prefill.py), as
on real ones: they publish the default model's tokenizer and what their cache holds, so a
conversation's next turn runs on the worker that holds its history, and starts sooner there.
This is what lets `bench placement --engine synthetic` measure placement apart from CPU.

Its own cluster: two synthetic workers (a 10 ms step, 2 ms per uncached prompt token).
"""

from __future__ import annotations

from collections.abc import Callable

import openai
import pytest

from tests.e2e.faults.test_placement import ask, next_turn, opening, record
from worker.ops.cluster import Cluster

SYNTHETIC = {
    "MLXQ_ENGINE": "synthetic",
    "MLXQ_SYNTHETIC_STEP_S": "0.01",
    "MLXQ_SYNTHETIC_PREFILL_S_PER_TOKEN": "0.002",
}


@pytest.fixture(scope="module")
def cluster(start_cluster: Callable[..., Cluster]) -> Cluster:
    return start_cluster(workers=2, env=SYNTHETIC)


def test_a_conversations_next_turn_runs_where_its_history_is_cached_and_starts_sooner(
    cluster: Cluster,
) -> None:
    client = openai.OpenAI(base_url=f"{cluster.api_url}/v1", api_key="unused", max_retries=0)
    for _ in range(3):  # by chance alone, three conversations stay put one time in eight
        messages = opening()
        reply = ask(client, messages)
        first = record(cluster, reply)
        later = record(cluster, ask(client, next_turn(messages, reply)))
        assert later.worker == first.worker
        assert later.cached_tokens >= first.prompt_tokens - 8
        assert first.ttft_s is not None and later.ttft_s is not None
        assert later.ttft_s < first.ttft_s / 2
