"""The cancel listener: job ids published on the cancel channel go to the engine loop.

Its connection also carries the worker's presence: it stays subscribed to the worker's own
presence channel (`{ns}:presence:{worker_id}`), which loses its subscriber the moment the
process dies, so others see a killed worker at once (shared/queue/liveness.py). After a lost
connection it resubscribes to both.
"""

from __future__ import annotations

import logging
import threading

from redis import Redis
from redis.exceptions import RedisError

from shared.queue.keys import Keys
from worker.runtime.loop import DrivenLoop

log = logging.getLogger(__name__)

RETRY_S = 0.25


def listen_for_cancels(
    redis: Redis, keys: Keys, loop: DrivenLoop, worker_id: str, stop: threading.Event
) -> threading.Event:
    """Start the listener; the returned event is set once the worker's presence is visible."""
    present = threading.Event()

    def run() -> None:
        while not stop.is_set():
            try:
                _listen(redis, keys, loop, worker_id, stop, present)
            except RedisError as err:
                log.warning("cancel listener lost Redis (reconnecting): %s", err)
                stop.wait(RETRY_S)

    thread = threading.Thread(target=run, name="cancel-listener", daemon=True)
    thread.start()
    return present


def _listen(
    redis: Redis,
    keys: Keys,
    loop: DrivenLoop,
    worker_id: str,
    stop: threading.Event,
    present: threading.Event,
) -> None:
    cancel_channel = keys.cancel_channel().encode()
    pubsub = redis.pubsub()
    pubsub.subscribe(keys.cancel_channel(), keys.presence(worker_id))
    try:
        while not stop.is_set():
            message = pubsub.get_message(timeout=1.0)
            if message is None:
                continue
            if message["type"] == "subscribe":
                present.set()
            elif message["type"] == "message" and message["channel"] == cancel_channel:
                loop.cancel(message["data"].decode())
    finally:
        pubsub.close()
