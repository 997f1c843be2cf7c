"""The event relay: one Redis subscriber connection per API process, fanned out to its streams.

A request subscribes to its job's channel (and waits until Redis confirms, so no event can be
published before we listen), then reads raw event bytes from its `Subscription`. One daemon
thread reads the connection and routes each message to the subscription of its channel.
If Redis goes away, every open subscription is ended with an error event and the thread
reconnects.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from dataclasses import dataclass, field

from redis import Redis
from redis.client import PubSub
from redis.exceptions import RedisError

from shared.connection import redis_errors_as_503
from shared.errors import BackendUnavailableError
from shared.events import ErrorEvent, encode_event

log = logging.getLogger(__name__)

_LOST = encode_event(
    ErrorEvent.from_error(BackendUnavailableError("lost the connection to Redis mid-stream"))
)


@dataclass
class Subscription:
    """One job channel's events, as the raw bytes the worker published."""

    channel: str
    ready: threading.Event = field(default_factory=threading.Event)
    inbox: queue.SimpleQueue[bytes] = field(default_factory=queue.SimpleQueue)

    def next_messages(self, timeout: float) -> list[bytes]:
        """Every message waiting now, after waiting up to `timeout` for the first one.

        Taking them together lets a busy stream write many events with one socket write."""
        try:
            messages = [self.inbox.get(timeout=timeout)]
        except queue.Empty:
            return []
        while True:
            try:
                messages.append(self.inbox.get_nowait())
            except queue.Empty:
                return messages


class EventRelay:
    def __init__(self, redis: Redis, confirm_timeout_s: float = 10.0):
        # Generous: a confirmation queues behind every message the thread has yet to route,
        # and an unreachable Redis already fails the subscribe command itself, fast.
        self._redis = redis
        self._confirm_timeout_s = confirm_timeout_s
        self._lock = threading.Lock()
        self._subs: dict[str, Subscription] = {}
        self._pubsub: PubSub | None = None
        self._thread: threading.Thread | None = None

    def subscribe(self, channel: str) -> Subscription:
        sub = Subscription(channel)
        with self._lock:
            pubsub = self._ensure_running()
            self._subs[channel] = sub
            try:
                with redis_errors_as_503():
                    pubsub.subscribe(channel)
            except BackendUnavailableError:
                del self._subs[channel]
                raise
        if not sub.ready.wait(self._confirm_timeout_s):
            self.unsubscribe(sub)
            raise BackendUnavailableError("Redis did not confirm the subscription in time")
        return sub

    def unsubscribe(self, sub: Subscription) -> None:
        with self._lock:
            if self._subs.pop(sub.channel, None) is None or self._pubsub is None:
                return
            # If Redis is gone, the reconnect drops every subscription anyway.
            with contextlib.suppress(RedisError):
                self._pubsub.unsubscribe(sub.channel)

    def is_open(self, sub: Subscription) -> bool:
        """Whether `sub` still receives its channel (it was not unsubscribed or failed)."""
        return self._subs.get(sub.channel) is sub

    def _ensure_running(self) -> PubSub:
        if self._pubsub is None:
            self._pubsub = self._redis.pubsub()
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._run, name="event-relay", daemon=True)
            self._thread.start()
        return self._pubsub

    def _run(self) -> None:
        while True:
            pubsub = self._pubsub
            try:
                assert pubsub is not None
                self._route(pubsub.get_message(timeout=1.0))
            except (RedisError, OSError) as err:
                log.warning("event relay lost Redis: %s", err)
                self._fail_all()
                time.sleep(0.5)

    def _route(self, message: dict[str, object] | None) -> None:
        if message is None:
            return
        channel = message["channel"]
        name = channel.decode() if isinstance(channel, bytes) else str(channel)
        sub = self._subs.get(name)
        if sub is None:
            return
        if message["type"] == "subscribe":
            sub.ready.set()
        elif message["type"] == "message":
            data = message["data"]
            sub.inbox.put(data if isinstance(data, bytes) else str(data).encode())

    def _fail_all(self) -> None:
        with self._lock:
            subs = list(self._subs.values())
            self._subs.clear()
            old, self._pubsub = self._pubsub, self._redis.pubsub()
        if old is not None:
            old.reset()
        for sub in subs:
            sub.inbox.put(_LOST)
