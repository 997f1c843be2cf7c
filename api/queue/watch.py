"""The job watch: ends the waits of this API process's jobs that can no longer finish.

An open request waits on its job's channel; if the worker running the job dies, nothing will
ever arrive there. One daemon thread per API process polls every half heartbeat interval, only
while requests are open, in three round trips: one pipelined HMGET of RQ's record per open job,
then the live workers of the models involved (shared/queue/liveness.py, the rule admission and
`/v1/models` use; nothing per token).
- a job started by a worker that is no longer alive (shared/queue/liveness.py) -> WorkerLostError;
- a job still queued while no live worker serves its model -> ModelNotFoundError (and the job
  is taken off the queue), unless a live pool may load its model (shared/queue/pool.py): then
  it waits, and ModelLoadError ends it if that model's load failed after it was queued;
- a job RQ records as failed (its job function crashed) -> GenerationError.
The error enters the request's subscription like any event from the channel: a stream ends
with an OpenAI error object in `data:`, a request that has not answered yet answers 5xx/404.
A killed worker is seen within one poll (its presence channel empties when its process dies),
a hung or sleeping one within LIVE_FACTOR heartbeats. Putting the job's records right (RQ
registries, replay log) and retrying bulk jobs is the live workers' business
(worker/runtime/liveness/reaper.py).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from redis import Redis
from redis.exceptions import RedisError
from rq.job import Job

from api.queue.relay import Subscription
from shared.queue.keys import Keys
from shared.queue.liveness import live_workers, worker_of
from shared.queue.pool import read_catalog, read_failures
from shared.wire.errors import (
    BackendUnavailableError,
    GenerationError,
    MLXQError,
    ModelNotFoundError,
    WorkerLostError,
)
from shared.wire.events import ErrorEvent, encode_event
from shared.wire.fleet.pool import LoadFailure

log = logging.getLogger(__name__)

_WAITING = {"queued", "deferred", "scheduled"}


@dataclass(frozen=True)
class Watched:
    job_id: str
    model: str
    sub: Subscription
    since: float  # unix s: when it was queued


@dataclass(frozen=True)
class Pools:
    """What the live pools say of the watched jobs' models (shared/queue/pool.py)."""

    models: frozenset[str]  # in a live pool's catalog: a waiting job waits for its load
    failures: dict[str, LoadFailure]


@dataclass(frozen=True)
class Record:
    """What RQ says of one watched job."""

    status: str | None
    worker: str | None


class JobWatch:
    def __init__(
        self,
        redis: Redis,
        keys: Keys,
        heartbeat_s: float,
        is_open: Callable[[Subscription], bool],
        withdraw: Callable[[str, str], None],
    ):
        self._redis = redis
        self._keys = keys
        self._heartbeat_s = heartbeat_s
        self._is_open = is_open
        self._withdraw = withdraw
        self._lock = threading.Lock()
        self._open: dict[str, Watched] = {}
        self._failing: set[str] = set()
        self._thread: threading.Thread | None = None

    def add(self, job_id: str, model: str, sub: Subscription) -> None:
        with self._lock:
            self._open[job_id] = Watched(job_id, model, sub, time.time())
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="job-watch", daemon=True)
                self._thread.start()

    def _run(self) -> None:
        while True:
            time.sleep(self._heartbeat_s / 2)
            try:
                self.poll()
            except (RedisError, BackendUnavailableError) as err:  # the relay ends the streams
                log.debug("job watch could not poll: %s", err)

    def poll(self) -> None:
        """One look at every open job; ends those that cannot finish."""
        with self._lock:
            for job_id in [j for j, w in self._open.items() if not self._is_open(w.sub)]:
                del self._open[job_id]
                self._failing.discard(job_id)
            watched = list(self._open.values())
        if not watched:
            return
        records, live = self._read(watched)
        pools = self._pools(watched, records, live)
        for w, record in zip(watched, records, strict=True):
            err = self._verdict(w, record, live.get(w.model, set()), pools)
            if err is not None:
                self._end(w, err)

    def _read(self, watched: list[Watched]) -> tuple[list[Record], dict[str, set[str]]]:
        """RQ's record of each job, and the live workers of each model involved."""
        pipe = self._redis.pipeline(transaction=False)
        for w in watched:
            pipe.hmget(Job.key_for(w.job_id), ["status", "worker_name"])
        records = [_record(reply) for reply in pipe.execute()]
        models = sorted({w.model for w in watched})
        return records, live_workers(self._redis, self._keys, models, self._heartbeat_s)

    def _pools(
        self, watched: list[Watched], records: list[Record], live: dict[str, set[str]]
    ) -> Pools:
        """The pools' word on the models of waiting jobs no live worker serves; nothing is read
        while every waiting job's model is served."""
        unserved = sorted(
            {
                w.model
                for w, r in zip(watched, records, strict=True)
                if r.status in _WAITING and not live.get(w.model)
            }
        )
        if not unserved:
            return Pools(frozenset(), {})
        catalog = read_catalog(self._redis, self._keys, self._heartbeat_s)
        failures = read_failures(self._redis, self._keys, unserved)
        return Pools(frozenset(catalog.models()), failures)

    def _verdict(
        self, w: Watched, record: Record, live: set[str], pools: Pools
    ) -> MLXQError | None:
        if record.status is None:
            return BackendUnavailableError("The job's record was lost (did Redis lose its data?).")
        if record.status == "started" and record.worker is not None and record.worker not in live:
            return WorkerLostError(
                "The worker running this job stopped (it crashed, hung or was shut down) "
                "before the job finished; retry the request."
            )
        if record.status in _WAITING and not live:
            return self._unserved(w, pools)
        if record.status == "failed":
            # Whoever failed it usually published why: give that event one poll to arrive.
            if w.job_id in self._failing:
                return GenerationError("The job failed on the worker.")
            self._failing.add(w.job_id)
        return None

    def _unserved(self, w: Watched, pools: Pools) -> MLXQError | None:
        """A waiting job whose model no live worker serves: it waits on while a live pool may
        load its model, unless that model's load failed after the job was queued; else it is
        taken off its queue."""
        failure = pools.failures.get(w.model)
        if failure is not None and failure.at >= w.since:
            self._withdraw(w.job_id, w.model)
            return failure.error()
        if w.model in pools.models:
            return None
        self._withdraw(w.job_id, w.model)
        return ModelNotFoundError(
            f"No live worker serves the model '{w.model}' any more.", param="model"
        )

    def _end(self, w: Watched, err: MLXQError) -> None:
        with self._lock:
            self._open.pop(w.job_id, None)
            self._failing.discard(w.job_id)
        log.warning("ending job %s: %s", w.job_id, err.message)
        w.sub.inbox.put(encode_event(ErrorEvent.from_error(err)))


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _record(reply: list[bytes | None]) -> Record:
    status, worker_name = reply
    return Record(
        status=_text(status) if status else None,
        worker=worker_of(_text(worker_name)) if worker_name else None,
    )
