"""The stack exactly as the README's run command starts it (`mlxq run`, shipped defaults, the
pool included) serves the default model's whole window and a burst from one engine: a prompt
longer than 4,096 tokens is answered, a burst of 16 streams is served by one worker process,
the pool starting no second one beside it (worker/pool/agent.py), and SIGTERM after the burst
stops the whole stack cleanly within seconds, not at the pool's SIGKILL of a worker that hangs
in its interpreter's finalization (worker/ops/cli.py).

Only what keeps the stack private differs from a user's: its own Redis port, Redis folder,
API port and prefix-cache folder. The models are the user's: the default ones, prepared under
~/.cache/mlxq/models by the test set-up as by the run set-up."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import httpx
import pytest
from redis import Redis

from shared.queue.keys import Keys
from shared.queue.liveness import live_workers
from tests.support import MODEL
from worker.ops.cluster import RUN, free_port, spawn, stop, wait_until

BURST = 16
# The pool waits a stopping worker's drain plus its exit's grace (worker/pool/agent.py) before a
# SIGKILL, 45 s by default; a clean stop of an idle stack takes 5-8 s here.
STOPPED_WITHIN_S = 30
# Distinct words, so the long prompt is no cache hit: 4,129 tokens in its chat, just past 4,096
# (its prefill is most of this module's CPU).
LONG_PROMPT = " ".join(f"item{i}" for i in range(1040))


@dataclass
class Stack:
    proc: subprocess.Popen[bytes]
    api_url: str
    redis: Redis

    def chat(self, content: str, max_tokens: int, timeout: float = 120) -> httpx.Response:
        body = {
            "model": MODEL,
            "messages": [{"role": "user", "content": content}],
            "max_tokens": max_tokens,
            "temperature": 0,
        }
        return httpx.post(f"{self.api_url}/v1/chat/completions", json=body, timeout=timeout)

    def workers(self) -> set[str]:
        """The live workers serving the default model."""
        return live_workers(self.redis, Keys("mlxq"), [MODEL], 2.0).get(MODEL, set())


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    folder = tmp_path_factory.mktemp("shipped")
    redis_port, api_port = free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLXQ_")}
    env.update(
        REDIS_URL=f"redis://127.0.0.1:{redis_port}/0",
        MLXQ_REDIS_DIR=str(folder / "redis"),
        MLXQ_API_BIND=f"127.0.0.1:{api_port}",
        MLXQ_PREFIX_CACHE_DIR=str(folder / "prefix-cache"),
    )
    log = folder / "run.log"
    proc = spawn(RUN, env, log)
    running = Stack(proc, f"http://127.0.0.1:{api_port}", Redis(port=redis_port, socket_timeout=5))

    def answers() -> bool:
        try:
            return running.chat("Hi", 2, timeout=60).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_until(answers, 240, f"the stack as shipped (its log: {log})")
        yield running
    finally:
        stop(proc, timeout_s=90)


def test_a_prompt_longer_than_4096_tokens_is_answered_by_default(stack: Stack) -> None:
    reply = stack.chat(f"Repeat the last item of this list.\n{LONG_PROMPT}", 1, timeout=300)
    assert reply.status_code == 200, reply.text
    assert reply.json()["usage"]["prompt_tokens"] > 4096


def test_a_burst_of_16_is_served_by_one_worker_process(stack: Stack) -> None:
    seen: set[str] = set()

    def one(i: int) -> int:
        reply = stack.chat(f"Write a short poem about the number {i}.", 64, timeout=300)
        return reply.status_code

    with ThreadPoolExecutor(BURST) as clients:
        replies = [clients.submit(one, i) for i in range(BURST)]
        while not all(r.done() for r in replies):
            seen |= stack.workers()
            time.sleep(0.5)
    assert [r.result() for r in replies] == [200] * BURST
    time.sleep(6)  # past the pool's stable window (MLXQ_POOL_STABLE_S): no late replica either
    seen |= stack.workers()
    assert len(seen) == 1, seen


def test_sigterm_after_the_burst_stops_the_stack_cleanly_within_seconds(stack: Stack) -> None:
    started = time.monotonic()
    stack.proc.send_signal(signal.SIGTERM)
    status = stack.proc.wait(timeout=120)
    took = time.monotonic() - started
    assert status == 0
    assert took < STOPPED_WITHIN_S, f"the stack took {took:.1f} s to stop"
