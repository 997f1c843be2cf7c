"""The fence: a worker that was frozen does not publish over work that was handed on.

A worker can stop without dying: SIGSTOP, a debugger, a Mac that sleeps. After LIVE_FACTOR
heartbeats the others declare it dead, take over its jobs and leave it a tombstone
(worker/runtime/reaper.py). When it wakes, its heartbeat thread finds the tombstone within one beat,
but its engine loop may step first. So the sink that publishes the loop's events looks at the
wall clock: after a gap long enough for this worker to have been declared dead, it checks for
the tombstone before it publishes, and on finding it calls `on_buried` (which ends the process)
instead. A running worker sends every step, so the check costs one EXISTS after an idle spell.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from redis import Redis

from shared.queue.keys import Keys
from shared.wire.events import Event
from worker.runtime.publish import EventSink, Route


class FencedSink(EventSink):
    def __init__(
        self,
        redis: Redis,
        replay_ttl_s: int,
        keys: Keys,
        worker_id: str,
        gap_s: float,
        on_buried: Callable[[], None],
    ):
        super().__init__(redis, replay_ttl_s)
        self._fence_redis = redis
        self._tombstone = keys.dead(worker_id)
        self._gap_s = gap_s
        self._on_buried = on_buried
        self._last = time.time()

    def send(self, events: list[tuple[Route, Event]]) -> None:
        now = time.time()
        frozen = now - self._last > self._gap_s
        self._last = now
        if events and frozen and self._fence_redis.exists(self._tombstone):
            self._on_buried()
            return
        super().send(events)
