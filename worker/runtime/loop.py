"""The engine loop: the one thread that owns the engine and drives every running job, whatever
kind of engine it is (the generation batch or the embedding encoder).

Each turn runs the same phases in a fixed order, one method each:
admit (wait for work only when idle, then gather the jobs arriving right behind it) -> step ->
publish the step's events in one Redis pipeline -> apply cancellations -> retire finished jobs
(wake their RQ slot threads). Nothing on this path logs, validates JSON schemas or makes a Redis
round trip per token.

The loop is generic over what its engine takes (`P`, a prepared job) and what a step gives
(`O`, one output per sequence or input). What those outputs mean (the events they publish, the
progress they count on a job's `Admission`, how a job they end ends) is the engine kind's
`StepReader` (worker/runtime/kinds/generation_kind.py, worker/runtime/kinds/embedding_kind.py).
Admission, cancellation, failing the running jobs when a step fails, and retiring are this module's
alone.

Jobs arrive through `submit` from RQ slot threads (worker/runtime/job_function.py) and
cancellations through `cancel` from the cancel listener (or a job at its run limit); both are
thread-safe hand-offs. `turns` counts the loop's turns and `steps` the engine steps it has
completed: a step completing is what the progress watchdog (worker/runtime/liveness/watchdog.py)
counts as progress, and `stepping_since` says since when the step under way runs. `generated` counts
the tokens each step worked on, as the kind counts them, for the heartbeat's tokens/s. All are
plain fields set once per turn.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Generic, NamedTuple, Protocol, TypeVar

from shared.queue.jobs import JobOutcome
from shared.wire.errors import GenerationError
from shared.wire.events import ALIVE_S, AliveEvent, ErrorEvent, Event, StartedEvent
from worker.runtime.publish import EventSink, Route

log = logging.getLogger(__name__)

# An idle loop that got a job waits for more while they keep coming this close together.
GATHER_GAP_S = 0.004
GATHER_MAX_S = 0.04


class Prepared(Protocol):
    """A job as its engine takes it."""

    @property
    def job_id(self) -> str: ...

    @property
    def prompt_tokens(self) -> int: ...

    @property
    def reasons(self) -> bool:
        """Whether its output may carry reasoning: its started event says so."""
        ...


class Output(Protocol):
    """What one step gave one job; the job has ended with the output that `ends_job`."""

    @property
    def job_id(self) -> str: ...

    @property
    def ends_job(self) -> bool: ...


A = TypeVar("A")
P = TypeVar("P", bound=Prepared)
O = TypeVar("O", bound=Output)  # noqa: E741
P_contra = TypeVar("P_contra", bound=Prepared, contravariant=True)


class SteppedEngine(Protocol[P_contra, O]):
    """What the loop needs of an engine: mlx-lm BatchGenerator's shape."""

    def insert(self, prepared: P_contra) -> None: ...

    def step(self) -> list[O]: ...

    def remove(self, job_ids: list[str]) -> None: ...


@dataclass
class Admission(Generic[P]):
    """A job handed to the loop, the future its slot thread waits on, and the figures of its
    outcome so far (counted by its kind's `StepReader`)."""

    prepared: P
    route: Route
    outcome: Future[JobOutcome] = field(default_factory=Future)
    cancelled: bool = False
    completion_tokens: int = 0
    cached_tokens: int = 0
    first_token_at: float | None = None  # unix s, when its first step's output was published


class Ending(NamedTuple):
    """How a job that a step ended ends: its finish reason, and why it failed if it did."""

    finish_reason: str
    error: str | None = None


class StepReader(Protocol[P, O]):
    """What an engine kind's step outputs mean to the loop."""

    @property
    def failure(self) -> str:
        """What a failed step is called in its jobs' error ("generation failed")."""
        ...

    def worked(self, outputs: list[O], running: Mapping[str, Admission[P]]) -> int:
        """The tokens a step worked on, for the heartbeat's tokens/s."""
        ...

    def events(
        self, outputs: list[O], running: Mapping[str, Admission[P]]
    ) -> list[tuple[Route, Event]]:
        """A step's events, in order; each job's progress is counted on its admission."""
        ...

    def ending(self, out: O) -> Ending:
        """How the job that `out` ends (`out.ends_job`) ends."""
        ...


class DrivenLoop(Protocol):
    """What the rest of a worker (slots' drain, watchdog, heartbeat, cancel listener) sees of
    its engine loop."""

    turns: int
    steps: int
    stepping_since: float | None  # time.monotonic() when the step under way began; None: none
    generated: int

    @property
    def busy(self) -> bool: ...

    def cancel(self, job_id: str) -> None: ...

    def run(self, stop: threading.Event) -> None: ...


class EngineLoop(Generic[P, O]):
    def __init__(
        self,
        engine: SteppedEngine[P, O],
        reader: StepReader[P, O],
        sink: EventSink,
        worker_id: str = "",
        alive_s: float = ALIVE_S,
    ):
        self._engine = engine
        self._reader = reader
        self._sink = sink
        self._worker_id = worker_id or None
        self._inbox: queue.SimpleQueue[Admission[P]] = queue.SimpleQueue()
        self._cancels: queue.SimpleQueue[str] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._waiting: dict[str, Admission[P]] = {}
        self._running: dict[str, Admission[P]] = {}
        self.turns = 0
        self.steps = 0
        self.stepping_since: float | None = None
        self.generated = 0
        self._alive_s = alive_s
        self._alive_at = time.monotonic()

    def submit(self, prepared: P, route: Route) -> Future[JobOutcome]:
        admission = Admission(prepared, route)
        with self._lock:
            self._waiting[prepared.job_id] = admission
        self._inbox.put(admission)
        return admission.outcome

    def cancel(self, job_id: str) -> None:
        self._cancels.put(job_id)

    @property
    def busy(self) -> bool:
        return bool(self._running) or bool(self._waiting)

    def first_token_at(self, job_id: str) -> float | None:
        """When the running job's first output was published (unix s); None before, or once
        it has ended. Read by its slot thread: one dictionary read, under the GIL."""
        admission = self._running.get(job_id)
        return admission.first_token_at if admission is not None else None

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            self.turns += 1
            self._admit(block=not self._running)
            if not self._running:
                continue
            outputs = self._step()
            self.generated += self._reader.worked(outputs, self._running)
            self._publish(outputs)
            self._tell_alive()
            self._apply_cancellations()
            self._retire(outputs)

    def _admit(self, block: bool) -> None:
        admitted = gather(self._inbox, block)
        with self._lock:
            for a in admitted:
                self._waiting.pop(a.prepared.job_id, None)
        started = [a for a in admitted if not a.cancelled]
        for a in started:
            self._engine.insert(a.prepared)
            self._running[a.prepared.job_id] = a
        for a in admitted:
            if a.cancelled:
                a.outcome.set_result(_outcome(a, "cancelled"))
        self._sink.send([(a.route, self._started(a)) for a in started])

    def _started(self, a: Admission[P]) -> StartedEvent:
        prepared = a.prepared
        reasoning = prepared.reasons or None
        return StartedEvent(
            prompt_tokens=prepared.prompt_tokens, worker=self._worker_id, reasoning=reasoning
        )

    def _step(self) -> list[O]:
        self.stepping_since = time.monotonic()
        try:
            return self._engine.step()
        except Exception as err:  # one failed step must not take the worker down
            log.exception("engine step failed; failing the %d running jobs", len(self._running))
            # Its type only: the text of an exception in the batch's step may quote any of
            # the batch's jobs, and every one of their callers is told.
            self._fail_running(GenerationError(f"{self._reader.failure}: {type(err).__name__}"))
            return []
        finally:
            self.steps += 1
            self.stepping_since = None

    def _fail_running(self, err: GenerationError) -> None:
        failed = list(self._running.values())
        self._engine.remove([a.prepared.job_id for a in failed])
        self._running.clear()
        self._sink.send([(a.route, ErrorEvent.from_error(err)) for a in failed])
        for a in failed:
            a.outcome.set_result(_outcome(a, "error", err.message))

    def _publish(self, outputs: list[O]) -> None:
        self._sink.send(self._reader.events(outputs, self._running))

    def _tell_alive(self) -> None:
        """Every `alive_s`, an AliveEvent to each running job (shared/wire/events.py)."""
        now = time.monotonic()
        if now - self._alive_at < self._alive_s:
            return
        self._alive_at = now
        self._sink.send([(a.route, AliveEvent()) for a in self._running.values()])

    def _apply_cancellations(self) -> None:
        while True:
            try:
                job_id = self._cancels.get_nowait()
            except queue.Empty:
                return
            self._cancel_one(job_id)

    def _cancel_one(self, job_id: str) -> None:
        with self._lock:
            waiting = self._waiting.get(job_id)
            if waiting is not None:
                waiting.cancelled = True
        running = self._running.pop(job_id, None)
        if running is not None:
            self._engine.remove([job_id])
            running.outcome.set_result(_outcome(running, "cancelled"))

    def _retire(self, outputs: list[O]) -> None:
        for out in outputs:
            if out.ends_job and (admission := self._running.pop(out.job_id, None)) is not None:
                ending = self._reader.ending(out)
                admission.outcome.set_result(_outcome(admission, *ending))


def gather(inbox: queue.SimpleQueue[A], block: bool) -> list[A]:
    """What waits in `inbox`; when `block`, wait for work first, then for the work arriving
    right behind it.

    Requests that come together reach the idle loop a few milliseconds apart (each slot
    thread has its own Redis round trips); one prefill (or forward) for all of them costs about
    what one for one costs, so they are admitted together.
    """
    admitted: list[A] = []
    if block:
        try:
            admitted.append(inbox.get(timeout=0.2))
        except queue.Empty:
            return []
        until = time.monotonic() + GATHER_MAX_S
        while (left := until - time.monotonic()) > 0:
            try:
                admitted.append(inbox.get(timeout=min(GATHER_GAP_S, left)))
            except queue.Empty:
                break
        return admitted
    try:
        while True:
            admitted.append(inbox.get_nowait())
    except queue.Empty:
        return admitted


def _outcome(admission: Admission[P], finish_reason: str, error: str | None = None) -> JobOutcome:
    return JobOutcome(
        error=error,
        finish_reason=finish_reason,
        prompt_tokens=admission.prepared.prompt_tokens,
        completion_tokens=admission.completion_tokens,
        cached_tokens=admission.cached_tokens,
        first_token_at=admission.first_token_at,
    )
