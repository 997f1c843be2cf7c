"""When a worker counts as alive: the one rule the API and the workers both apply.

A worker process is alive while both hold:
- its heartbeat in `{ns}:workers:{model}` is younger than LIVE_FACTOR intervals (a process
  that hangs, or a Mac that sleeps, stops beating), and
- it is subscribed to its presence channel `{ns}:presence:{worker_id}` (a process that
  crashes or is killed loses its connection at once, so `PUBSUB NUMSUB` reads 0 long before
  its heartbeat ages).

The first catches a silent worker within LIVE_FACTOR intervals, the second a dead process
within one poll. Nothing here talks to Redis: callers read the scores and subscriber counts
(in one pipeline) and judge them with `alive`.
"""

from __future__ import annotations

# A worker is live while its last heartbeat is younger than this many intervals.
LIVE_FACTOR = 3


def horizon(now: float, heartbeat_s: float) -> float:
    """The oldest heartbeat (unix s) that still counts as alive."""
    return now - LIVE_FACTOR * heartbeat_s


def alive(heartbeat: float | None, subscribers: int, now: float, heartbeat_s: float) -> bool:
    return heartbeat is not None and heartbeat >= horizon(now, heartbeat_s) and subscribers > 0


def worker_of(slot_name: str) -> str:
    """The worker id (`{hostname}.{pid}`) of one of its RQ slots (`{hostname}.{pid}.{i}`)."""
    return slot_name.rsplit(".", 1)[0]


def slot_name(worker_id: str, index: int) -> str:
    return f"{worker_id}.{index}"
