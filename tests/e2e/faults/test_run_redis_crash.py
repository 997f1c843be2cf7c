"""The Redis that `mlxq run` starts keeps its data and is kept up: killed with SIGKILL in the
middle of a batch, supervisord restarts it, it reloads its append-only file, and the batch
finishes with every line answered exactly once (a line whose run ended while Redis was away
lost its end event, and only such a run is made again); an uploaded file and a stored response
read back as they were.

The stack is `mlxq run` itself (no Redis answers at its REDIS_URL, so it starts its own, with
its data under a temporary MLXQ_REDIS_DIR)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import openai
import pytest
from redis import Redis

from tests.support import MODEL, chat_line, lines_of, start_batch, upload, wait_batch
from worker.ops.cluster import RUN, free_port, redis_answers, spawn, stop, wait_until

LINES = 24


@dataclass
class Stack:
    proc: subprocess.Popen[bytes]
    log: Path
    redis_url: str
    client: openai.OpenAI

    def said(self, text: str) -> bool:
        return text in self.log.read_text(errors="replace")

    def runs(self) -> dict[str, list[str]]:
        """How each run of each batch line ended on a worker, in order (the workers' JSON `job`
        log lines' finish reasons)."""
        found: dict[str, list[str]] = {}
        for line in self.log.read_text(errors="replace").splitlines():
            if line.startswith("{") and '"message": "job"' in line:
                record = json.loads(line)
                if record.get("lane") == "batch":
                    found.setdefault(record["job_id"], []).append(record["finish_reason"])
        return found

    def redis_pid(self) -> int:
        redis = Redis.from_url(self.redis_url, socket_timeout=2)
        return int(redis.info("server")["process_id"])


def _answers(base_url: str) -> bool:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
    try:
        return httpx.post(f"{base_url}/chat/completions", json=body, timeout=60).status_code == 200
    except httpx.HTTPError:
        return False


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    folder = tmp_path_factory.mktemp("durable")
    redis_url = f"redis://127.0.0.1:{free_port()}/0"
    api_port = free_port()
    env = dict(
        os.environ,
        REDIS_URL=redis_url,
        MLXQ_REDIS_DIR=str(folder / "redis"),
        MLXQ_NAMESPACE="mlxqdurable",
        MLXQ_MODEL=MODEL,
        MLXQ_EMBEDDING_MODEL="",  # the chat worker alone: the batch is what this test watches
        MLXQ_API_BIND=f"127.0.0.1:{api_port}",
        MLXQ_HEARTBEAT_S="0.5",
        MLXQ_BATCH_SIZE="6",
        MLXQ_LOG_FORMAT="json",
    )
    env.pop("MLXQ_MODELS", None)
    log = folder / "run.log"
    proc = spawn(RUN, env, log)
    base_url = f"http://127.0.0.1:{api_port}/v1"
    client = openai.OpenAI(base_url=base_url, api_key="unused")
    try:
        wait_until(lambda: _answers(base_url), 240, "the stack")
        yield Stack(proc, log, redis_url, client)
    finally:
        # Its keep-alive connections closed first: the API's graceful stop waits for them.
        client.close()
        stop(proc, timeout_s=90)


def test_a_killed_redis_comes_back_with_its_data_and_the_batch_finishes_once(
    stack: Stack,
) -> None:
    assert (Path(stack.log.parent) / "redis" / "appendonlydir").is_dir()
    client = stack.client
    file_id = upload(client, [chat_line("kept", "a file kept as uploaded")])
    kept_file = client.files.content(file_id).content
    stored = client.responses.create(model=MODEL, input="Say hi", max_output_tokens=8)
    lines = [
        chat_line(f"line-{i}", f"Count from {i} to {i + 40}.", max_tokens=40, temperature=0)
        for i in range(LINES)
    ]
    batch = start_batch(client, lines)

    def some_lines_done() -> bool:
        counts = client.batches.retrieve(batch.id).request_counts
        return counts is not None and counts.completed >= 2

    wait_until(some_lines_done, 120, "the first lines of the batch")
    victim = stack.redis_pid()
    os.kill(victim, signal.SIGKILL)
    wait_until(lambda: stack.said("exited: redis (terminated by SIGKILL"), 10, "the exit")
    wait_until(lambda: redis_answers(stack.redis_url), 30, "Redis again")
    assert stack.redis_pid() != victim
    assert client.batches.retrieve(batch.id).request_counts.completed < LINES  # type: ignore[union-attr]

    done = wait_batch(client, batch.id, timeout_s=300)
    assert done.status == "completed"
    assert done.request_counts is not None
    assert (done.request_counts.completed, done.request_counts.failed) == (LINES, 0)
    out = lines_of(client, done.output_file_id)
    assert sorted(line["custom_id"] for line in out) == sorted(f"line-{i}" for i in range(LINES))
    assert all(line["response"]["status_code"] == 200 for line in out)
    assert lines_of(client, done.error_file_id) == []
    runs = stack.runs()
    # A line generated again only where its first run could not give it an answer: it ended
    # while Redis was away, its end event lost (worker/runtime/kinds/batch_lines.py), and that run
    # failed. A run of a line already answered (RQ lost its record of the end) is skipped.
    assert len(runs) == LINES
    generated = {job: [e for e in ends if e != "skipped"] for job, ends in runs.items()}
    assert [job for job, ends in generated.items() if any(e != "error" for e in ends[:-1])] == []
    assert client.files.content(file_id).content == kept_file
    assert client.responses.retrieve(stored.id).model_dump() == stored.model_dump()
