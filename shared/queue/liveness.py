"""When a worker counts as alive: the one rule the API and the workers both apply.

A worker process is alive while both hold:
- its heartbeat in `{ns}:workers:{model}` is younger than LIVE_FACTOR intervals (a process
  that hangs, or a Mac that sleeps, stops beating), and
- it is subscribed to its presence channel `{ns}:presence:{worker_id}` (a process that
  crashes or is killed loses its connection at once, so `PUBSUB NUMSUB` reads 0 long before
  its heartbeat ages).

The first catches a silent worker within LIVE_FACTOR intervals, the second a dead process
within one poll. `live_workers` reads both for some models and judges them with `alive`; the
API's admission, `/v1/models`, `/health` and its job watch all ask it, so a model is listed
exactly while requests for it are admitted. (The fleet snapshot, shared/observe/fleet.py, reads the
same figures with the rest of its data and judges them with `alive` too.)
"""

from __future__ import annotations

import time
from typing import Any

from redis import Redis

from shared.queue.keys import Keys

# A worker is live while its last heartbeat is younger than this many intervals.
LIVE_FACTOR = 3


def horizon(now: float, heartbeat_s: float) -> float:
    """The oldest heartbeat (unix s) that still counts as alive."""
    return now - LIVE_FACTOR * heartbeat_s


def report_ttl_ms(heartbeat_s: float) -> int:
    """A report beside a heartbeat (a worker's, a pool's) lives a little longer than its writer
    counts as alive, so a reader never finds a live one without its report."""
    return int((LIVE_FACTOR + 1) * heartbeat_s * 1000)


def alive(heartbeat: float | None, subscribers: int, now: float, heartbeat_s: float) -> bool:
    return heartbeat is not None and heartbeat >= horizon(now, heartbeat_s) and subscribers > 0


def live_workers(
    redis: Redis, keys: Keys, models: list[str], heartbeat_s: float
) -> dict[str, set[str]]:
    """The live workers of each model: two round trips whatever the number of models."""
    if not models:
        return {}
    now = time.time()
    pipe = redis.pipeline(transaction=False)
    for model in models:
        pipe.zrangebyscore(keys.workers(model), horizon(now, heartbeat_s), "+inf", withscores=True)
    rows: list[Any] = pipe.execute()
    beats = [{bytes(w).decode(): float(s) for w, s in found} for found in rows]
    candidates = sorted(set().union(*beats))
    counts: dict[str, int] = {}
    if candidates:
        replies: Any = redis.pubsub_numsub(*[keys.presence(w) for w in candidates])
        counts = {w: int(n) for w, (_, n) in zip(candidates, replies, strict=True)}
    return {
        model: {w for w, beat in found.items() if alive(beat, counts[w], now, heartbeat_s)}
        for model, found in zip(models, beats, strict=True)
    }


def worker_of(slot_name: str) -> str:
    """The worker id (`{hostname}.{pid}`) of one of its RQ slots (`{hostname}.{pid}.{i}`)."""
    return slot_name.rsplit(".", 1)[0]


def slot_name(worker_id: str, index: int) -> str:
    return f"{worker_id}.{index}"
