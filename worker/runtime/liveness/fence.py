"""The fence: a worker that was frozen or cut off does not publish over work that was handed on.

A worker can stop without dying (SIGSTOP, a debugger, a Mac that sleeps), or lose its link to
Redis while it keeps running. After LIVE_FACTOR heartbeats the others declare it dead, take
over its jobs and leave it a tombstone (worker/runtime/liveness/reaper.py). When it wakes, or its
link comes back, its heartbeat thread finds the tombstone within one beat, but its engine loop may
step first. So the sink that publishes the loop's events checks for the tombstone before it
publishes, and on finding it calls `on_buried` (which ends the process) instead, in two cases:
- after a gap in the wall clock long enough for this worker to have been declared dead (a
  freeze);
- after a step whose events could not be sent (a partition: its steps go on, Redis unreachable).

A check that cannot reach Redis drops the step's events, as a failed publish does, and the next
step checks again: the loop never waits on, or fails with, an unreachable Redis. A running
worker sends every step, so the check costs one EXISTS after an idle spell or an outage.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from redis import Redis
from redis.exceptions import RedisError

from shared.queue.keys import Keys
from shared.wire.events import Event
from worker.runtime.publish import EventSink, Route

log = logging.getLogger(__name__)


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
        self._last = time.time()  # when a step last reached Redis
        self._cut_off = False  # the last step's events could not be sent

    def send(self, events: list[tuple[Route, Event]]) -> bool:
        now = time.time()
        if not events:  # an idle turn: nothing to fence, but time passing is not a freeze
            if not self._cut_off:
                self._last = now
            return True
        if self._cut_off or now - self._last > self._gap_s:
            try:
                buried = bool(self._fence_redis.exists(self._tombstone))
            except RedisError as err:
                self._cut_off = True
                log.warning("could not publish %d events: %s", len(events), err)
                return False
            if buried:
                self._on_buried()
                return False
        self._cut_off = not super().send(events)
        if not self._cut_off:
            self._last = now
        return not self._cut_off
