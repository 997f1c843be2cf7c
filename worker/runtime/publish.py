"""Where a job's events go: a pub/sub channel (live readers) and, for a job that is read
back later (`GenerationJob.replayed`: a stored response, a batch line), its replay log.

The channel is the reply channel of the API process waiting on the job (`reply_to`), else the
job's own. Each `send` publishes one frame (shared/wire/events.py) per channel: an API process
relaying 500 streams gets one message per step, not 500.

The replay log is a Redis list with a bounded TTL holding every event of the job in order, so
a reader that comes late (a resumed stream, a poller of a background job, another API
process) can read what it missed, then follow the channel. A plain request writes none: its
reader is subscribed before the job is queued, and Redis keeps nothing of it once it ends.
One pipeline per call: the engine loop calls `send` once per step with every event of that
step.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from redis import Redis
from redis.exceptions import RedisError

from shared.queue.keys import Keys
from shared.wire.events import (
    AliveEvent,
    DoneEvent,
    ErrorEvent,
    Event,
    StartedEvent,
    encode_event,
    encode_frame,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Route:
    """A job's destinations, built once per job rather than once per token."""

    job_id: str
    channel: str
    replay: str | None  # None: the job keeps no replay log
    # A stored response's log lives as long as its record, from its first event on: set only
    # after the job, a reader answered meanwhile would see the shorter default.
    replay_ttl_s: int | None = None

    @classmethod
    def of(
        cls,
        keys: Keys,
        job_id: str,
        reply_to: str | None,
        replayed: bool,
        replay_ttl_s: int | None = None,
    ) -> Route:
        channel = keys.events(job_id) if reply_to is None else keys.reply(reply_to)
        return cls(job_id, channel, keys.replay(job_id) if replayed else None, replay_ttl_s)


class EventSink:
    def __init__(self, redis: Redis, replay_ttl_s: int):
        self._redis = redis
        self._replay_ttl_s = replay_ttl_s

    def send(self, events: list[tuple[Route, Event]]) -> bool:
        """Publish one step's events; False where Redis could not be reached (they are
        dropped: the step does not wait for Redis)."""
        if not events:
            return True
        pipe = self._redis.pipeline(transaction=False)
        frames: dict[str, list[tuple[str, bytes]]] = {}
        for route, event in events:
            data = encode_event(event)
            if route.replay is not None and not isinstance(event, AliveEvent):
                pipe.rpush(route.replay, data)
                if isinstance(event, StartedEvent | DoneEvent | ErrorEvent):
                    pipe.expire(route.replay, route.replay_ttl_s or self._replay_ttl_s)
            frames.setdefault(route.channel, []).append((route.job_id, data))
        for channel, lines in frames.items():
            pipe.publish(channel, encode_frame(lines))
        try:
            pipe.execute()
        except RedisError as err:
            log.warning("could not publish %d events: %s", len(events), err)
            return False
        return True
