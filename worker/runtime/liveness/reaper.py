"""The reaper: live workers take over the jobs of dead ones.

Every heartbeat interval each worker reads RQ's started-job registries of its model's two
queues, the worker that runs each execution, the model's workers zset, and the liveness of all
those workers (shared/queue/liveness.py), in a few pipelined round trips. A worker found not alive
on two sweeps in a row (one that reconnects is not buried by one unlucky poll) is dead, and:
1. the jobs it had taken but not started (its `{ns}:taking:{worker_id}` list,
worker/runtime/intake/slots.py)
   go back to the front of their queue, atomically (no two reapers put one back twice);
2. each execution it had started is claimed (`SET NX` on `{ns}:reaped:{execution}`, one reaper
   acts however many run) and, while the job's record still names that worker (WATCHed):
   - a bulk job (background response, batch line) with retries left (RQ's `Retry` on the job)
     goes back to the front of its queue, its replay log reset to a `RequeuedEvent`: it runs
     again from scratch on a live worker and finishes exactly once;
   - but a job whose worker died under it once before is poison (a job that kills whichever
     worker runs it would otherwise take down one worker per retry): its RQ meta counts the
     deaths it was running through (`deaths`), and at POISON_DEATHS it fails with an error that
     says so instead of running again. A worker that stops on request (a drain) or a job lost
     track of in a Redis outage is no death: those are handed back without counting;
   - any other job (interactive, out of retries, or poison) fails: an `ErrorEvent`
     (`worker_lost`) on its channel and replay log, RQ's record in the failed registry; a batch
     line that fails also gets its 500 error line in its batch (worker/runtime/kinds/batch_lines.py,
     first write wins). A client waiting on an interactive job was told already by its API process
     (api/queue/watch.py);
3. it gets a tombstone and leaves the workers zset: should it come back (a Mac that slept),
   its heartbeat finds the tombstone and the process exits instead of finishing work that was
   handed on (worker/runtime/liveness/heartbeat.py).
After a Redis outage every heartbeat looks old, so a reaper that lost Redis judges no one until
LIVE_FACTOR intervals after it is back.

`hand_back(worker_id)` does 1 and 2 at once for one worker's jobs: the watchdog of a wedged
worker (a death: its jobs count it) and the drain of a stopping one (no death) call it on their
own jobs before they exit.

Each sweep also looks at this worker's own jobs. An interactive job whose channel has had no
subscriber on two sweeps has nobody waiting for it (the API's cancel was lost in a Redis
outage, or its API process died) and is cancelled, so it does not hold a slot for nothing.
A job Redis says this worker has (started, or taken) while none of its slots holds it, on two
sweeps, was lost track of in a Redis outage (the slot could not record its end): it is taken
over as if this worker were dead, so that it is neither stuck nor lost.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from redis import Redis
from redis.client import Pipeline
from redis.exceptions import RedisError, WatchError
from rq import Queue
from rq.exceptions import NoSuchJobError
from rq.executions import Execution
from rq.job import Job, JobStatus
from rq.job_lifecycle import record_job_failure
from rq.serializers import JSONSerializer
from rq.worker import Worker as RQWorker
from rq.worker_registration import REDIS_WORKER_KEYS, WORKERS_BY_QUEUE_KEY

from shared.queue import queued_tokens
from shared.queue.keys import Keys
from shared.queue.liveness import LIVE_FACTOR, alive, worker_of
from shared.wire.errors import WorkerLostError
from shared.wire.events import ErrorEvent, RequeuedEvent
from worker.runtime.kinds.batch_lines import BatchLines, server_error
from worker.runtime.liveness.job_records import announce, generation_job, queued_job, route_of

log = logging.getLogger(__name__)

CLAIM_TTL_S = 24 * 3600
# The worker deaths a job may run through: at the second it is failed, not requeued again.
POISON_DEATHS = 2

# KEYS: a worker's taking list, the job's hash, its queue. ARGV: job id. 1 if put back.
PUT_BACK = """
if redis.call('HGET', KEYS[2], 'status') ~= 'queued' then return 0 end
if redis.call('LREM', KEYS[1], 1, ARGV[1]) == 0 then return 0 end
redis.call('LREM', KEYS[3], 0, ARGV[1])
redis.call('LPUSH', KEYS[3], ARGV[1])
return 1
"""


@dataclass(frozen=True)
class Started:
    """One execution in a started-job registry, and the worker RQ says runs it."""

    queue: Queue
    job_id: str
    execution_id: str
    worker: str | None

    @property
    def execution(self) -> str:
        return f"{self.job_id}:{self.execution_id}"


class Reaper:
    def __init__(
        self,
        redis: Redis,
        keys: Keys,
        model: str,
        worker_id: str,
        heartbeat_s: float,
        replay_ttl_s: int,
        held: Callable[[], dict[str, str]],
        cancel: Callable[[str], None],
    ):
        self._redis = redis
        self._keys = keys
        self._model = model
        self._worker_id = worker_id
        self._heartbeat_s = heartbeat_s
        self._replay_ttl_s = replay_ttl_s
        self._queues = [
            Queue(name, connection=redis, serializer=JSONSerializer) for name in keys.lanes(model)
        ]
        self._bulk = {q.name for q in self._queues[1:]}  # no client waits: retried, not failed
        self._held = held
        self._cancel = cancel
        self._suspects: set[str] = set()
        self._unheard: set[str] = set()
        self._adrift: set[str] = set()
        self._put_back = redis.register_script(PUT_BACK)

    def run(self, stop: threading.Event) -> threading.Thread:
        def loop() -> None:
            quiet_until = 0.0
            while not stop.wait(self._heartbeat_s):
                if time.monotonic() < quiet_until:
                    continue
                try:
                    self.sweep()
                except RedisError as err:
                    log.debug("reaper could not sweep: %s", err)
                    # After an outage every heartbeat looks old: judge no one until they beat.
                    quiet_until = time.monotonic() + LIVE_FACTOR * self._heartbeat_s
                    self._suspects, self._adrift, self._unheard = set(), set(), set()

        thread = threading.Thread(target=loop, name="reaper", daemon=True)
        thread.start()
        return thread

    def sweep(self) -> None:
        """Take over the jobs of workers found dead on this sweep and the one before."""
        self._cancel_unheard()
        started = self._started()
        self._reclaim_adrift(started)
        known = self._redis.zrange(self._keys.workers(self._model), 0, -1)
        workers = {s.worker for s in started if s.worker} | {_text(n) for n in known}
        dead = self._dead(sorted(workers - {self._worker_id}))
        confirmed = dead & self._suspects
        self._suspects = dead
        for worker in sorted(confirmed):
            why = f"its worker {worker} is gone"
            self._return_taken(worker)
            for s in started:
                if s.worker == worker:
                    self._take_over(s, why, died=True)
            self._bury(worker)

    def _cancel_unheard(self) -> None:
        interactive = self._queues[0].name
        mine = [job_id for job_id, queue in self._held().items() if queue == interactive]
        if not mine:
            self._unheard = set()
            return
        jobs = zip(mine, self._fetch(mine), strict=True)
        channels = [route_of(self._keys, job_id, job).channel for job_id, job in jobs]
        counts = self._redis.pubsub_numsub(*channels)
        unheard = {j for j, (_, n) in zip(mine, counts, strict=True) if int(n) == 0}
        for job_id in sorted(unheard & self._unheard):
            log.warning("cancelling job %s: nobody listens to it any more", job_id)
            self._cancel(job_id)
        self._unheard = unheard

    def _reclaim_adrift(self, started: list[Started]) -> None:
        held = self._held()
        taken = self._redis.lrange(self._keys.taking(self._worker_id), 0, -1)
        adrift = {s.execution for s in started if s.worker == self._worker_id}
        adrift |= {f"{_text(i)}:taken" for i in taken}
        adrift = {a for a in adrift if a.rsplit(":", 1)[0] not in held}
        confirmed = adrift & self._adrift
        self._adrift = adrift
        if not confirmed:
            return
        why = "its worker lost track of it (Redis went away)"
        for s in started:
            if s.execution in confirmed:
                self._take_over(s, why, died=False)
        if any(a.endswith(":taken") for a in confirmed):
            self._return_taken(self._worker_id, keep=set(self._held()))

    def hand_back(
        self, worker_id: str, why: str, *, died: bool, interactive_only: bool = False
    ) -> int:
        """Take over the jobs of `worker_id` now; returns how many were taken. `died`: the
        worker is dying under them (wedged), which counts towards each job's POISON_DEATHS.

        A bulk job is requeued, so it must be handed back only once no take of the exiting
        process can get it again; interactive jobs are failed, which is safe at any time.
        """
        mine = [s for s in self._started() if s.worker == worker_id]
        if interactive_only:
            mine = [s for s in mine if s.queue.name not in self._bulk]
            return sum(self._take_over(s, why, died) for s in mine)
        returned = self._return_taken(worker_id)
        return returned + sum(self._take_over(s, why, died) for s in mine)

    def _return_taken(self, worker_id: str, keep: set[str] | None = None) -> int:
        """Put the jobs `worker_id` took but never started (but `keep`) back in their queue."""
        taking = self._keys.taking(worker_id)
        ids = [_text(i) for i in self._redis.lrange(taking, 0, -1)]
        ids = [i for i in ids if i not in (keep or set())]
        if not ids:
            return 0
        pipe = self._redis.pipeline(transaction=False)
        for job_id in ids:
            pipe.hget(Job.key_for(job_id), "origin")
        origins = pipe.execute()
        returned = 0
        for job_id, origin in zip(ids, origins, strict=True):
            queue = next((q for q in self._queues if origin and q.name == origin.decode()), None)
            if queue is not None:
                keys = [taking, Job.key_for(job_id), queue.key]
                returned += int(self._put_back(keys=keys, args=[job_id]))
        if returned:
            log.warning("put back %d jobs %s had taken but not started", returned, worker_id)
        return returned

    def _started(self) -> list[Started]:
        entries = [
            (queue, job_id, execution_id)
            for queue in self._queues
            for job_id, execution_id in queue.started_job_registry.get_job_and_execution_ids(
                cleanup=False
            )
        ]
        if not entries:
            return []
        pipe = self._redis.pipeline(transaction=False)
        for _, job_id, execution_id in entries:  # which worker runs this very execution
            pipe.hget(Execution(execution_id, job_id, self._redis).key, "worker_name")
            pipe.hget(Job.key_for(job_id), "worker_name")  # if the execution's record expired
        names = pipe.execute()
        return [
            Started(queue, job_id, execution_id, _worker(names[2 * i] or names[2 * i + 1]))
            for i, (queue, job_id, execution_id) in enumerate(entries)
        ]

    def _dead(self, workers: list[str]) -> set[str]:
        if not workers:
            return set()
        pipe = self._redis.pipeline(transaction=False)
        pipe.zmscore(self._keys.workers(self._model), workers)
        pipe.pubsub_numsub(*[self._keys.presence(w) for w in workers])
        scores, counts = pipe.execute()
        now = time.time()
        return {
            w
            for w, score, (_, n) in zip(workers, scores, counts, strict=True)
            if not alive(score, int(n), now, self._heartbeat_s)
        }

    def _take_over(self, s: Started, why: str, died: bool) -> bool:
        """Requeue or fail one started execution of a lost worker (module docstring).

        Only while the job is still that execution's: the job's record is WATCHed from the
        check to the write, so a job that ended or moved on meanwhile is left alone.
        """
        claim = self._keys.reaped(s.execution)
        if not self._redis.set(claim, 1, nx=True, ex=CLAIM_TTL_S):
            return False  # another reaper has it
        try:
            job = Job.fetch(s.job_id, connection=self._redis, serializer=JSONSerializer)
        except NoSuchJobError:
            job = None
        with self._redis.pipeline(transaction=True) as pipe:
            try:
                if job is not None:
                    pipe.watch(job.key)
                if job is None or not self._still_held_by(pipe, job, s.worker):
                    pipe.multi()
                    pipe.zrem(s.queue.started_job_registry.key, s.execution)
                    pipe.execute()
                    return False
                pipe.multi()
                pipe.zrem(s.queue.started_job_registry.key, s.execution)
                if s.worker is not None:
                    pipe.lrem(self._keys.taking(s.worker), 0, s.job_id)
                failed = self._requeue_or_fail(pipe, s, job, why, died)
                pipe.execute()
            except WatchError:  # the job changed meanwhile: let a later sweep look again
                self._redis.delete(claim)
                return False
        if failed:
            self._end_batch_line(job, why)
        return True

    def _still_held_by(self, pipe: Pipeline, job: Job, worker: str | None) -> bool:
        status, name = pipe.hmget(job.key, ["status", "worker_name"])
        holder = worker_of(_text(name)) if name else None
        return status == JobStatus.STARTED.value.encode() and holder == worker

    def _requeue_or_fail(self, pipe: Pipeline, s: Started, job: Job, why: str, died: bool) -> bool:
        """Queue the requeue or the failure on `pipe`; whether the job failed."""
        deaths = int(job.meta.get("deaths", 0)) + died
        if deaths >= POISON_DEATHS:
            why = (
                f"{why}; {deaths} workers died running it, so it is not retried again "
                "(it may be what kills them)"
            )
        elif s.queue.name in self._bulk and job.retries_left:
            attempt = int(job.meta.get("attempt", 1)) + 1
            job.meta["attempt"] = attempt
            job.meta["deaths"] = deaths  # saved with the requeue
            pipe.lrem(s.queue.key, 0, s.job_id)  # never twice in its queue
            job.retry(s.queue, pipe)
            announce(
                pipe,
                self._keys,
                job,
                RequeuedEvent(attempt=attempt),
                self._replay_ttl_s,
                reset=True,
            )
            log.warning("requeued bulk job %s (attempt %d): %s", s.job_id, attempt, why)
            return False
        err = WorkerLostError(f"The worker running this job was lost: {why}.")
        record_job_failure(job, err.message, pipe)
        announce(pipe, self._keys, job, ErrorEvent.from_error(err), self._replay_ttl_s, reset=False)
        queued = queued_job(job)
        if queued is not None:  # its key's queued tokens (shared/queue/queued_tokens.py)
            queued_tokens.release_job(pipe, self._keys, queued)
        log.warning("failed job %s: %s", s.job_id, why)
        return True

    def _end_batch_line(self, job: Job, why: str) -> None:
        """A failed batch line still gets its answer: a 500 error line in its batch."""
        generation = generation_job(job)
        line = generation.batch_line if generation is not None else None
        if generation is not None and line is not None:
            message = (
                f"The worker running this request was lost and it could not be retried: {why}."
            )
            result = server_error(line.custom_id, message)
            BatchLines(self._redis, self._keys).record(generation, result)

    def _fetch(self, job_ids: list[str]) -> list[Job | None]:
        return Job.fetch_many(job_ids, connection=self._redis, serializer=JSONSerializer)

    def _bury(self, worker: str) -> None:
        pipe = self._redis.pipeline(transaction=False)
        pipe.set(self._keys.dead(worker), 1, ex=CLAIM_TTL_S)
        pipe.zrem(self._keys.workers(self._model), worker)
        pipe.delete(self._keys.taking(worker))
        self._forget_slots(pipe, worker)
        pipe.execute()

    def _forget_slots(self, pipe: Pipeline, worker: str) -> None:
        """Take the dead worker's slots out of RQ's worker registry, as each would on a clean
        exit, so that `rq info` stops showing them busy now rather than when their keys
        expire."""
        prefix = f"{RQWorker.redis_worker_namespace_prefix}{worker}."
        members: Any = self._redis.smembers(REDIS_WORKER_KEYS)
        for key in (_text(m) for m in members):
            if key.startswith(prefix):
                pipe.srem(REDIS_WORKER_KEYS, key)
                for queue in self._queues:
                    pipe.srem(WORKERS_BY_QUEUE_KEY % queue.name, key)
                pipe.delete(key)


def _worker(slot: bytes | None) -> str | None:
    return worker_of(slot.decode()) if slot else None


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
