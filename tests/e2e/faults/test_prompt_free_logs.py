"""Logs never hold a prompt or an output, whatever raises (shared/observe/logs.py), on real
processes: a worker with fault injection (worker/engine/doubles/faults.py) whose job raises out
of the job function and into RQ with its prompt in the exception's text, the worst an exception
can carry. RQ would log the job's arguments (its whole payload) and the exception's text; the
formatters would write every extra field. Each log format runs its own cluster."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support import CHAT, chat_body, post
from worker.engine.doubles.faults import RAISE_JOB
from worker.ops.cluster import Cluster, wait_until

SECRET = "quokka-tangerine-77"


@pytest.fixture(scope="module", params=["text", "json"])
def cluster(request: pytest.FixtureRequest, start_cluster: Callable[..., Cluster]) -> Cluster:
    env = {"MLXQ_LOG_FORMAT": request.param}
    return start_cluster(env=env, MLXQ_FAULT_INJECTION="true")


def logged(cluster: Cluster) -> str:
    assert cluster.logs is not None
    return "".join(p.read_text(errors="replace") for p in sorted(Path(cluster.logs).glob("*.log")))


def rq_said_so(text: str) -> bool:
    return "raised InjectedFault" in text or "exception raised while executing" in text


def test_a_job_that_raises_with_its_prompt_in_the_exception_logs_no_prompt(
    cluster: Cluster,
) -> None:
    body = chat_body(
        messages=[{"role": "user", "content": f"Repeat after me: {SECRET} {RAISE_JOB}"}],
        max_tokens=8,
    )
    reply = post(cluster.api_url, CHAT, body)
    assert reply.status == 500, reply.body
    assert reply.body["error"]["message"] == "the job failed: InjectedFault"
    # The job function's traceback, then the slot's line for the failed job (ours, or RQ's own
    # when RQ's handler writes it).
    wait_until(lambda: rq_said_so(logged(cluster)), 10, "the slot's line for the job")
    text = logged(cluster)
    assert "worker.engine.doubles.faults.InjectedFault" in text and "prepare" in text
    assert SECRET not in text
    assert "Repeat after me" not in text
