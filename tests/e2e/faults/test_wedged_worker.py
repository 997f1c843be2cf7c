"""A worker breaks without dying: one sequence fails, or the engine loop wedges.

Point 2 of the fault contract. The worker runs with fault injection
(worker/engine/doubles/faults.py): a
prompt holding `[[fault:raise]]` makes its own sequence fail at its third token, one holding
`[[fault:wedge]]` blocks the engine loop there while the process and its heartbeat live on. A
bulk job that wedges every worker it runs on is poison: requeued after the first, failed after
the second (worker/runtime/liveness/reaper.py's POISON_DEATHS).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable

import pytest

from api.queue.broker import standalone
from shared.queue.jobs import GenerationJob
from shared.wire.events import DoneEvent, ErrorEvent, RequeuedEvent, decode_event
from shared.wire.generation.sampling import SamplingParams
from tests.e2e.faults.conftest import HEARTBEAT_S, exactly_workers
from tests.support import MODEL, Stream, chat_body, post, rq_job
from worker.engine.doubles.faults import RAISE, WEDGE
from worker.ops.cluster import Cluster, wait_until
from worker.runtime.serve import EXIT_WEDGED

# Well above one step of the real model on a loaded 2-core machine, a fresh worker's first
# included (its prefill and first compiles took 3.7 s once), still quick to fire.
WATCHDOG_S = 6.0
FAULTY = {"MLXQ_FAULT_INJECTION": "true", "MLXQ_WATCHDOG_S": str(WATCHDOG_S)}


@pytest.fixture(scope="module")
def cluster(start_cluster: Callable[..., Cluster]) -> Cluster:
    cluster = start_cluster(env={"MLXQ_BATCH_SIZE": "4"}, **FAULTY)
    post(cluster.api_url, "/v1/chat/completions", chat_body(max_tokens=2))  # warm up
    return cluster


def ask(text: str, **extra: object) -> dict[str, object]:
    return chat_body(messages=[{"role": "user", "content": text}], **extra)


def wedging_job(job_id: str) -> GenerationJob:
    """A bulk job whose sequence wedges its worker's engine loop at its third token."""
    return GenerationJob(
        job_id=job_id,
        model=MODEL,
        prompt=f"Once {WEDGE}",
        max_tokens=6,
        sampling=SamplingParams(temperature=0, logit_bias={2: -100, 0: -100}),  # reaches token 3
        replay_ttl_s=600,
    )


def test_an_exception_in_one_sequence_fails_that_sequence_only(cluster: Cluster) -> None:
    (worker,) = exactly_workers(cluster, 1, **FAULTY)
    healthy = Stream(cluster.api_url, chat_body(max_tokens=24))
    healthy.read_tokens(1)
    broken = Stream(cluster.api_url, ask(f"Tell me a story. {RAISE}", max_tokens=24))

    error = json.loads(broken.rest()[-1])
    assert error["error"]["code"] == "generation_failed"
    assert "injected fault" in error["error"]["message"]
    rest = healthy.rest()
    assert rest[-1] == "[DONE]"
    assert json.loads(rest[-2])["choices"][0]["finish_reason"] in ("stop", "length")
    after = post(cluster.api_url, "/v1/chat/completions", chat_body(max_tokens=4))
    assert after.status == 200
    assert worker.proc.poll() is None


def test_a_wedged_loop_is_caught_by_the_watchdog_its_jobs_handed_on_and_the_worker_exits(
    cluster: Cluster,
) -> None:
    (worker,) = exactly_workers(cluster, 1, **FAULTY)
    redis = cluster.redis()
    stream = Stream(cluster.api_url, chat_body(max_tokens=2000))
    stream.read_tokens(2)
    bulk = wedging_job("resp_wedge")
    standalone(cluster.settings()).submit_bulk([bulk])
    wedge_from = time.monotonic()

    error = json.loads(stream.rest()[-1])
    assert error["error"]["code"] == "worker_lost"
    # The bulk job's prefill and two steps come first: on a loaded machine, seconds of them.
    assert time.monotonic() - wedge_from < WATCHDOG_S + 4 * HEARTBEAT_S + 8
    assert worker.proc.wait(timeout=10) == EXIT_WEDGED
    assert rq_job(redis, bulk.job_id).get_status() == "queued"  # handed back, not lost

    cluster.start_worker(MLXQ_FAULT_INJECTION="false")  # what its supervisor would do
    wait_until(lambda: rq_job(redis, bulk.job_id).get_status() == "finished", 60, "the bulk job")
    events = [decode_event(e) for e in redis.lrange(cluster.keys.replay(bulk.job_id), 0, -1)]
    assert events[0] == RequeuedEvent(attempt=2)
    assert sum(isinstance(e, DoneEvent) for e in events) == 1


def test_a_bulk_job_that_wedges_each_worker_it_runs_on_is_failed_after_its_second(
    cluster: Cluster,
) -> None:
    (first,) = exactly_workers(cluster, 1, **FAULTY)
    redis = cluster.redis()
    poison = wedging_job("resp_poison")
    standalone(cluster.settings()).submit_bulk([poison], retries=5)  # retries are not what ends it
    assert first.proc.wait(timeout=WATCHDOG_S + 60) == EXIT_WEDGED
    job = rq_job(redis, poison.job_id)
    assert job.get_status() == "queued" and job.meta["deaths"] == 1

    second = cluster.start_worker(**FAULTY)  # its supervisor's restart: the job wedges it too
    assert second.proc.wait(timeout=WATCHDOG_S + 90) == EXIT_WEDGED
    assert rq_job(redis, poison.job_id).get_status() == "failed"
    last = decode_event(redis.lrange(cluster.keys.replay(poison.job_id), -1, -1)[0])
    assert isinstance(last, ErrorEvent) and last.error.code == "worker_lost"
    assert "2 workers died running it" in last.error.message
