"""RQ slot threads: B non-forking RQ workers in one process, feeding one engine loop.

RQ still owns each job's life (queued, started, finished, failed, registries, `rq info`),
while the model is loaded once per process. Each slot is an RQ `SimpleWorker` running in
its own thread: it takes one job, runs its job function (which blocks until the engine loop
finishes that sequence), and takes the next. B slots = up to B sequences in the continuous
batch. Signals are the main thread's: slots are stopped with `stop_slots`.

Taking a job is an atomic move, not RQ's pop: the job id goes from the first non-empty queue
(interactive before bulk; in a bulk lane, the next caller's turn: shared/queue/turns.py) to the
worker's `{ns}:taking:{worker_id}` list in one step, and
leaves it when the slot is done with the job. A worker killed between taking a job and
starting it so leaves the id where the reaper finds it and puts it back
(worker/runtime/liveness/reaper.py); with a plain pop it would be gone. An idle slot blocks on the
interactive queue for up to TAKE_WAIT_S, so a bulk job arriving at an idle worker waits at most that
long. A slot that takes a job after it was told to stop puts it back at the front of its queue,
untouched. A slot whose RQ loop ends on a Redis outage is started again.
Slots run `FixedJob`s (worker/runtime/intake/fixed_job.py) and refuse any other job before touching
it. The first `MLXQ_INTERACTIVE_SLOTS` slots take interactive jobs only, so a long batch never
holds every slot. An interactive job the API placed on the worker holding its prefix is taken by
that worker first (worker/runtime/intake/placed_take.py owns that rule and its scripts).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from typing import Any

from redis import Redis
from redis.exceptions import ConnectionError, RedisError, TimeoutError
from rq import Queue, SimpleWorker
from rq.exceptions import NoSuchJobError
from rq.job import Job
from rq.job_lifecycle import call_exception_handlers
from rq.serializers import JSONSerializer
from rq.timeouts import TimerDeathPenalty
from rq.worker import WorkerStatus

from shared.queue.keys import Keys
from shared.queue.liveness import report_ttl_ms, slot_name
from worker.runtime.intake.fixed_job import FixedJob, refusal
from worker.runtime.intake.placed_take import CLAIM, POLL_S, SCAN_DEPTH, TAKE, PlacedTake

log = logging.getLogger(__name__)

# RQ's worker record lives this long without a heartbeat; slots beat at least every TAKE_WAIT_S.
SLOT_TTL_S = 30
TAKE_WAIT_S = 1.0
LEAVE_S = TAKE_WAIT_S + 2.0  # the longest a stopped slot should take to leave its wait
RESTART_S = 0.5


class DaemonTimerDeathPenalty(TimerDeathPenalty):
    """RQ's job timeout for threads, on a daemon timer: an exiting worker must not wait for it."""

    def new_timer(self) -> threading.Timer:
        timer: threading.Timer = super().new_timer()
        timer.daemon = True
        return timer


class SlotWorker(SimpleWorker):
    """An RQ SimpleWorker that can live in a thread other than the main one."""

    death_penalty_class = DaemonTimerDeathPenalty
    job_class = FixedJob
    # RQ's description of a job is its call, payload and prompt included.
    log_job_description = False
    current_job_id: str | None = None
    current_queue: str | None = None  # the name of the queue the current job came from
    thread: threading.Thread | None = None
    taking_key: str = ""
    placed: PlacedTake | None = None

    def _install_signal_handlers(self) -> None:
        """Signals belong to the main thread, which stops slots with `stop_slots`."""

    def subscribe(self) -> None:
        """No per-slot command channel: mlxq cancels through its own channel."""

    def unsubscribe(self) -> None:
        """Nothing was subscribed."""

    def handle_exception(self, job: Job, *exc_info: Any) -> None:
        """RQ's own line for a job that raised carries the job's arguments, which are its whole
        payload (prompt included), and the exception's text. The job function has logged the
        failure already, as shared/observe/logs.py writes exceptions; this says which job."""
        log.warning("job %s raised %s", job.id, getattr(exc_info[0], "__name__", "?"))
        call_exception_handlers(self._exc_handlers, job, *exc_info)

    def execute_job(self, job: Job, queue: Queue) -> None:
        """Run a generation job; fail anything else at once, before it is prepared or imported."""
        try:
            reason = refusal(job)
            if reason is None:
                super().execute_job(job, queue)
                return
            log.warning("refused job %s from %s: %s", job.id, queue.name, reason)
            job.retries_left = None  # a refused job is never retried
            self.handle_job_failure(job, queue, exc_string=f"refused: {reason}")
        finally:
            self.current_job_id = None
            self.connection.lrem(self.taking_key, 1, job.id)

    def dequeue_job_and_maintain_ttl(
        self, timeout: int | None, max_idle_time: int | None = None
    ) -> tuple[Job, Queue] | None:
        """Take the next job (module docstring); None once the slot is told to stop."""
        self.set_state(WorkerStatus.IDLE)
        while not self._stop_requested:
            try:
                self.heartbeat()
                taken = self._take()
            except (ConnectionError, TimeoutError) as err:
                log.warning("slot %s cannot reach Redis (retrying): %s", self.name, err)
                time.sleep(1.0)
                continue
            if taken is not None:
                return taken
        return None

    def _take(self) -> tuple[Job, Queue] | None:
        queues = {q.key: q for q in self._ordered_queues}
        found = self._eval_take(list(queues))
        if found == ["", ""]:  # interactive jobs wait for the workers they were placed on
            time.sleep(POLL_S)
            return None
        if found:
            key, job_id = found
        else:
            first = self._ordered_queues[0].key
            moved = self.connection.execute_command(
                "BLMOVE", first, self.taking_key, "LEFT", "RIGHT", TAKE_WAIT_S
            )
            if moved is None:
                return None
            key, job_id = first, bytes(moved).decode()
            if not self._claim(first, job_id):
                return None
        queue = queues[key]
        self.current_job_id = job_id  # busy from here: a draining worker waits for it
        self.current_queue = queue.name
        if self._stop_requested:
            self._put_back(queue, job_id)
            return None
        try:
            job = self.job_class.fetch(
                job_id, connection=self.connection, serializer=self.serializer
            )
        except NoSuchJobError:  # expired or deleted while queued
            self.current_job_id = None
            self.connection.lrem(self.taking_key, 1, job_id)
            return None
        return job, queue

    def _eval_take(self, queues: list[str]) -> list[str] | None:
        keys, args = self._placed().take(queues, self.taking_key, SCAN_DEPTH)
        found = self.connection.eval(TAKE, len(keys), *keys, *args)
        return [bytes(part).decode() for part in found] if found else None

    def _claim(self, queue_key: str, job_id: str) -> bool:
        """Whether this slot may keep a job its blocking wait moved; if not it is back."""
        placed = self._placed()
        keys = [queue_key, self.taking_key, *placed.keys()]
        args: list[str | int] = [job_id, placed.worker_id, placed.blocks_ttl_ms]
        return bool(self.connection.eval(CLAIM, len(keys), *keys, *args))

    def _placed(self) -> PlacedTake:
        if self.placed is None:
            raise RuntimeError("a slot takes jobs only once make_slots has set it up")
        return self.placed

    def _put_back(self, queue: Queue, job_id: str) -> None:
        pipe = self.connection.pipeline(transaction=True)
        pipe.lrem(self.taking_key, 1, job_id)
        pipe.lpush(queue.key, job_id)
        pipe.execute()
        self.current_job_id = None


def make_slots(
    redis: Redis,
    keys: Keys,
    model: str,
    worker_id: str,
    count: int,
    interactive: int,
    heartbeat_s: float = 2.0,
) -> list[SlotWorker]:
    """`count` slots of a worker serving `model`; each takes from the first non-empty lane in
    priority order (`Keys.lanes`: interactive, background, batch), except the first
    `interactive` (at most count - 1), which take interactive jobs only, so that a long batch
    never holds every slot. Taking a job adds its prompt's blocks to the worker's set, which
    lives as long as its report (`heartbeat_s`: worker/runtime/intake/placed_take.py)."""
    reserved = min(interactive, count - 1)
    placed = PlacedTake.of(keys, model, worker_id, report_ttl_ms(heartbeat_s))
    queues = [
        Queue(name, connection=redis, serializer=JSONSerializer) for name in keys.lanes(model)
    ]
    slots = [
        _slot(redis, queues[:1] if i < reserved else queues, slot_name(worker_id, i))
        for i in range(count)
    ]
    for slot in slots:
        slot.taking_key = keys.taking(worker_id)
        slot.placed = placed
    return slots


def start_slots(slots: list[SlotWorker]) -> list[SlotWorker]:
    """Run each slot's RQ loop in a thread of its own."""
    for slot in slots:
        slot.thread = threading.Thread(target=_work, args=(slot,), name=slot.name, daemon=True)
        slot.thread.start()
    return slots


def _slot(redis: Redis, queues: list[Queue], name: str) -> SlotWorker:
    """A slot; RQ names its connection in Redis, so wait for Redis if it is down."""
    while True:
        try:
            return SlotWorker(
                queues,
                name=name,
                connection=redis,
                serializer=JSONSerializer,
                worker_ttl=SLOT_TTL_S,
            )
        except RedisError as err:
            log.warning("waiting for Redis: %s", err)
            time.sleep(1.0)


def _work(slot: SlotWorker) -> Any:
    while not slot._stop_requested:
        try:
            slot.work(logging_level="WARNING")
        except Exception as err:  # RQ's teardown itself fails while Redis is down
            log.warning("slot %s stopped: %s", slot.name, err)
        if slot._stop_requested:
            return
        time.sleep(RESTART_S)
        with contextlib.suppress(RedisError):
            slot.register_death()  # so that register_birth accepts the name again


def stop_slots(slots: list[SlotWorker], wait_s: float = 0.0) -> bool:
    """Stop taking jobs; wait up to `wait_s` for idle slots to leave their wait for a job.

    Returns whether none is still waiting. Before a process requeues its own jobs it must know
    that: a requeued job must not land in a take of the same, exiting process.
    """
    for slot in slots:
        slot._stop_requested = True
    deadline = time.monotonic() + wait_s
    for slot in slots:
        while _waiting(slot) and time.monotonic() < deadline:
            time.sleep(0.05)
    return not any(_waiting(slot) for slot in slots)


def _waiting(slot: SlotWorker) -> bool:
    alive = slot.thread is not None and slot.thread.is_alive()
    return alive and slot.current_job_id is None


def slots_idle(slots: list[SlotWorker]) -> bool:
    return all(slot.current_job_id is None for slot in slots)


def held(slots: list[SlotWorker]) -> dict[str, str]:
    """The jobs the slots hold now: job id -> the name of the queue it came from."""
    holding = [(slot.current_job_id, slot.current_queue) for slot in slots]
    return {job_id: queue or "" for job_id, queue in holding if job_id is not None}
