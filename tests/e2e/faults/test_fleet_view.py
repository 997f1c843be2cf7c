"""Seeing the fleet: /metrics from any API process and `mlxq status` show every worker and every
request, from Redis; a killed worker drops out of both at once and is never shown busy.

Its own cluster: two workers on the real model, the API under two gunicorn processes.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Callable

import pytest

from shared.observe.fleet import FleetSnapshot
from tests.e2e.faults.conftest import HEARTBEAT_S, holder
from tests.support import MODEL, NO_END, Stream, chat_body, post
from worker.ops.cluster import ROOT, Cluster, wait_until

LONG = 2000


@pytest.fixture(scope="module")
def cluster(start_cluster: Callable[..., Cluster]) -> Cluster:
    return start_cluster(workers=2, env={"MLXQ_BATCH_SIZE": "4", "MLXQ_API_WORKERS": "2"})


def scrape(cluster: Cluster) -> dict[str, float]:
    """One /metrics scrape: `name{labels}` -> value."""
    with urllib.request.urlopen(f"{cluster.api_url}/metrics", timeout=10) as response:
        text = response.read().decode()
    return {
        line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line and not line.startswith("#")
    }


def total(figures: dict[str, float], name: str) -> float:
    return sum(v for k, v in figures.items() if re.fullmatch(rf"{re.escape(name)}(\{{.*\}})?", k))


def status(cluster: Cluster) -> FleetSnapshot:
    out = subprocess.run(
        [sys.executable, "-m", "worker.ops.cli", "status", "--json"],
        env=cluster.environment(),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return FleetSnapshot.model_validate_json(out.stdout)


def test_every_scrape_and_mlxq_status_show_both_workers_and_a_killed_one_is_never_busy(
    cluster: Cluster,
) -> None:
    assert len(cluster.api_worker_pids()) == 2
    body = chat_body(max_tokens=LONG, logit_bias=NO_END)
    streams = [Stream(cluster.api_url, body) for _ in range(3)]
    try:
        _see_three_then_kill_one(cluster, [stream.read_tokens(2) for stream in streams])
    finally:
        for stream in streams:
            stream.close()


def _see_three_then_kill_one(cluster: Cluster, ids: list[str]) -> None:
    victim = holder(cluster, ids[0])
    slots_used = "mlxq:worker_slots_used"
    # Workers report their slots with each heartbeat: the last admitted may not be in it yet.
    wait_until(lambda: total(scrape(cluster), slots_used) == 3, 3 * HEARTBEAT_S, "3 slots used")
    for _ in range(6):  # requests land on either gunicorn process: each sees the whole fleet
        figures = scrape(cluster)
        assert figures[f'mlxq:num_workers{{model_name="{MODEL}"}}'] == 2
        assert total(figures, slots_used) == 3
        running = f'mlxq:num_requests_running{{lane="interactive",model_name="{MODEL}"}}'
        assert figures[running] == 3
    seen = status(cluster)
    assert {w.worker_id for w in seen.workers} == {w.worker_id for w in cluster.workers}
    assert sum(w.slots_used for w in seen.workers) == 3

    held = next(w.slots_used for w in seen.workers if w.worker_id == victim.worker_id)
    cluster.kill_worker(victim, signal.SIGKILL)
    # Its process is gone: within a poll, not after its heartbeat ages.
    wait_until(lambda: len(status(cluster).workers) == 1, 2 * HEARTBEAT_S + 3, "the dead worker")
    figures = scrape(cluster)
    assert figures[f'mlxq:num_workers{{model_name="{MODEL}"}}'] == 1
    assert total(figures, slots_used) == 3 - held
    assert not any(victim.worker_id in key for key in figures)


def test_a_finished_request_adds_its_tokens_reason_and_latencies_to_the_fleets_figures(
    cluster: Cluster,
) -> None:
    # Jobs of the test before (cancelled as their clients left) record their figures first.
    wait_until(lambda: not any(w.slots_used for w in status(cluster).workers), 30, "idle workers")
    before = scrape(cluster)
    reply = post(cluster.api_url, "/v1/chat/completions", chat_body(max_tokens=5))
    assert reply.status == 200
    usage = reply.body["usage"]

    def added(name: str) -> float:
        return total(scrape(cluster), name) - total(before, name)

    wait_until(lambda: added("mlxq:generation_tokens_total") >= 5, 5, "the figures")
    assert added("mlxq:generation_tokens_total") == usage["completion_tokens"]
    assert added("mlxq:prompt_tokens_total") == usage["prompt_tokens"]
    reason = f'mlxq:request_success_total{{finished_reason="length",model_name="{MODEL}"}}'
    assert scrape(cluster)[reason] - before.get(reason, 0) == 1
    for histogram in ("time_to_first_token_seconds", "e2e_request_latency_seconds"):
        assert added(f"mlxq:{histogram}_count") == 1
        assert 0 < added(f"mlxq:{histogram}_sum") < reply.seconds + 1
    last = status(cluster).recent_jobs[0]
    assert (last.job_id, last.status, last.completion_tokens) == (reply.body["id"], "completed", 5)
