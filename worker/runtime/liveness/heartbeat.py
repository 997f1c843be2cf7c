"""The worker's announcement in Redis: which model it serves, refreshed while it lives.

A worker is live while its heartbeat is younger than `LIVE_FACTOR` intervals and its presence
channel has a subscriber (shared/queue/liveness.py); a model is served while any worker serving it
is live. The API reads the same zsets (keys.py). Each beat also looks for the worker's tombstone:
if another worker declared this one dead and took over its jobs (it hung, or its Mac slept),
it must not finish them too, so `on_tombstone` is called (it ends the process). Each beat also
publishes the worker's report (slots in use, tokens/s: shared/observe/fleet.py) in the same
pipeline, so the fleet view costs the worker nothing between beats, and the block hashes of
what its prefix cache holds (worker/runtime/prefix/prefix_report.py). After a beat, the worker
takes the fleet's history sample if it is its turn (shared/observe/history.py: one worker per
sample period, a few round trips), on this thread, never on the engine's.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from redis import Redis
from redis.exceptions import RedisError

from shared.observe.fleet import WorkerStats, publish_stats
from shared.observe.history import sample_if_due
from shared.queue.keys import Keys
from shared.queue.liveness import report_ttl_ms
from shared.wire.fleet.catalog import ModelKind
from worker.runtime.prefix.prefix_report import PrefixReport

log = logging.getLogger(__name__)

RETRY_S = 0.25


def beat(
    redis: Redis,
    keys: Keys,
    model: str,
    worker_id: str,
    stats: WorkerStats,
    interval_s: float,
    prefixes: PrefixReport | None = None,
) -> bool:
    """Announce the worker and its report; False if it finds its tombstone instead."""
    now = time.time()
    pipe = redis.pipeline(transaction=False)
    pipe.exists(keys.dead(worker_id))
    pipe.zadd(keys.models(), {model: now})
    pipe.zadd(keys.workers(model), {worker_id: now})
    publish_stats(pipe, keys, stats, interval_s)
    if prefixes is not None:
        prefixes.publish(pipe, report_ttl_ms(interval_s))
    buried, *_ = pipe.execute()
    return not buried


def born(redis: Redis, keys: Keys, worker_id: str, model: str, kind: ModelKind) -> None:
    """Clear a tombstone an earlier process with the same id (hostname and pid) left, and say
    what kind of model the worker serves (the catalog tells chat models from embedders)."""
    pipe = redis.pipeline(transaction=False)
    pipe.delete(keys.dead(worker_id))
    pipe.hset(keys.model_kinds(), model, kind)
    pipe.execute()


def retire(redis: Redis, keys: Keys, model: str, worker_id: str) -> None:
    """Leave: the worker no longer serves, and holds no job."""
    pipe = redis.pipeline(transaction=False)
    pipe.zrem(keys.workers(model), worker_id)
    pipe.delete(keys.taking(worker_id), keys.worker_stats(worker_id))
    pipe.delete(keys.prefix_blocks(worker_id))
    pipe.execute()


def _sample(redis: Redis, keys: Keys, worker_id: str, interval_s: float) -> None:
    """The fleet's history sample, if it is this worker's turn. Whatever goes wrong costs the
    sample only: the heartbeat thread must outlive it, or the worker would be judged dead."""
    try:
        sample_if_due(redis, keys, worker_id, interval_s)
    except RedisError as err:
        log.warning("could not take the fleet's history sample: %s", err)
    except Exception:
        log.exception("the fleet's history sample failed")


def keep_beating(
    redis: Redis,
    keys: Keys,
    model: str,
    worker_id: str,
    interval_s: float,
    stop: threading.Event,
    on_tombstone: Callable[[], None],
    report: Callable[[], WorkerStats],
    prefixes: PrefixReport | None = None,
) -> threading.Thread:
    def run() -> None:
        while not stop.is_set():
            try:
                if not beat(redis, keys, model, worker_id, report(), interval_s, prefixes):
                    on_tombstone()
                    return
            except RedisError as err:
                log.warning("heartbeat failed (will retry): %s", err)
                stop.wait(RETRY_S)  # back as soon as Redis is, before anyone judges it
                continue
            _sample(redis, keys, worker_id, interval_s)
            stop.wait(interval_s)

    thread = threading.Thread(target=run, name="heartbeat", daemon=True)
    thread.start()
    return thread
