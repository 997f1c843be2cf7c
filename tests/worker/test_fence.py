"""The fence (worker/runtime/liveness/fence.py) on a real redis-server of its own, which each test
stops and starts again on the same port: a worker cut off from Redis keeps stepping without raising,
and once Redis answers again it checks its tombstone before it publishes anything."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest
from redis import Redis

from shared.queue.connection import client_for
from shared.queue.keys import Keys
from shared.wire.events import TokenEvent
from worker.ops.cluster import free_port, local_url, start_redis, stop
from worker.runtime.liveness.fence import FencedSink
from worker.runtime.publish import Route

WORKER_ID = "host.1"
KEYS = Keys("fence")
ROUTE = Route.of(KEYS, "job-1", reply_to=None, replayed=True)
STEP = [(ROUTE, TokenEvent(text="x"))]


@dataclass
class Server:
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.proc = start_redis(self.port)

    def stop(self) -> None:
        assert self.proc is not None
        stop(self.proc)

    def client(self) -> Redis:
        return client_for(local_url(self.port), socket_timeout=0.5, socket_connect_timeout=0.5)


@pytest.fixture
def server() -> Iterator[Server]:
    server = Server()
    server.start()
    yield server
    server.stop()


def fenced(server: Server, buried: list[bool], gap_s: float = 60) -> FencedSink:
    def on_buried() -> None:
        buried.append(True)

    return FencedSink(server.client(), 60, KEYS, WORKER_ID, gap_s, on_buried)


def test_a_step_that_cannot_reach_redis_drops_its_events_without_raising(server: Server) -> None:
    buried: list[bool] = []
    sink = fenced(server, buried, gap_s=0)  # every step checks the tombstone
    server.stop()
    assert sink.send(STEP) is False
    assert sink.send(STEP) is False
    assert buried == []


def test_a_worker_cut_off_checks_its_tombstone_before_it_publishes_again(server: Server) -> None:
    buried: list[bool] = []
    sink = fenced(server, buried)  # no freeze: the clock's gap alone would not check
    assert sink.send(STEP) is True
    server.stop()
    assert sink.send(STEP) is False
    server.start()  # empty: the tombstone is all it holds
    server.client().set(KEYS.dead(WORKER_ID), 1)
    assert sink.send([]) is True  # an idle turn does not end the outage for the fence
    assert sink.send(STEP) is False
    assert buried == [True]
    assert server.client().llen(KEYS.replay("job-1")) == 0


def test_a_worker_cut_off_and_not_declared_dead_publishes_again(server: Server) -> None:
    buried: list[bool] = []
    sink = fenced(server, buried)
    server.stop()
    assert sink.send(STEP) is False
    server.start()
    assert sink.send(STEP) is True
    assert buried == []
    assert server.client().llen(KEYS.replay("job-1")) == 1
