"""The engine loop: the one thread that owns the engine and drives every running sequence.

Each turn runs the same phases in a fixed order, one method each:
admit (wait for work only when idle) -> step -> publish the step's events in one Redis
pipeline -> apply cancellations -> retire finished jobs (wake their RQ slot threads).
Nothing on this path logs, validates JSON schemas or makes a Redis round trip per token.

Jobs arrive through `submit` from RQ slot threads (worker/runtime/slots.py) and cancellations
through `cancel` from the cancel listener; both are thread-safe hand-offs. `turns` counts the
loop's turns, for the progress watchdog (worker/runtime/watchdog.py); `generated` counts the
tokens of every step (one per running sequence), for the heartbeat's tokens/s. Both are plain
counters bumped once per turn; a job's first-token time is one comparison per output.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

from shared.queue.jobs import JobOutcome
from shared.queue.keys import Keys
from shared.wire.completions import (
    CompletionTokensDetails,
    FinishReason,
    PromptTokensDetails,
    Usage,
)
from shared.wire.errors import GenerationError
from shared.wire.events import (
    ChoiceEndEvent,
    DoneEvent,
    ErrorEvent,
    Event,
    StartedEvent,
    TokenEvent,
)
from worker.engine.generation import BatchEngine, StepOutput
from worker.engine.prepare import PreparedJob
from worker.runtime.publish import EventSink, Route

log = logging.getLogger(__name__)

# An idle loop that got a job waits for more while they keep coming this close together.
GATHER_GAP_S = 0.004
GATHER_MAX_S = 0.04
A = TypeVar("A")


class DrivenLoop(Protocol):
    """What the rest of a worker (slots' drain, watchdog, heartbeat, cancel listener) sees of
    its engine loop, the generation one or the embedding one."""

    turns: int
    generated: int

    @property
    def busy(self) -> bool: ...

    def cancel(self, job_id: str) -> None: ...

    def run(self, stop: threading.Event) -> None: ...


@dataclass
class Admission:
    """A job handed to the loop, and the future its slot thread waits on."""

    prepared: PreparedJob
    route: Route
    outcome: Future[JobOutcome] = field(default_factory=Future)
    cancelled: bool = False
    completion_tokens: int = 0
    cached_tokens: int = 0
    first_token_at: float | None = None  # unix s, when its first step's output was published


class EngineLoop:
    def __init__(self, engine: BatchEngine, sink: EventSink, keys: Keys, worker_id: str = ""):
        self._engine = engine
        self._worker_id = worker_id or None
        self._sink = sink
        self._keys = keys
        self._inbox: queue.SimpleQueue[Admission] = queue.SimpleQueue()
        self._cancels: queue.SimpleQueue[str] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._waiting: dict[str, Admission] = {}
        self._running: dict[str, Admission] = {}
        self.turns = 0
        self.generated = 0

    def submit(self, prepared: PreparedJob, route: Route) -> Future[JobOutcome]:
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

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            self.turns += 1
            self._admit(block=not self._running)
            if not self._running:
                continue
            outputs = self._step()
            self.generated += len(outputs)
            self._publish(outputs)
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

    def _started(self, a: Admission) -> StartedEvent:
        return StartedEvent(prompt_tokens=a.prepared.prompt_tokens, worker=self._worker_id)

    def _step(self) -> list[StepOutput]:
        try:
            return self._engine.step()
        except Exception as err:  # one failed step must not take the worker down
            log.exception("engine step failed; failing the %d running jobs", len(self._running))
            self._fail_running(GenerationError(f"generation failed: {err}"))
            return []

    def _fail_running(self, err: GenerationError) -> None:
        failed = list(self._running.values())
        self._engine.remove([a.prepared.job_id for a in failed])
        self._running.clear()
        self._sink.send([(a.route, ErrorEvent.from_error(err)) for a in failed])
        for a in failed:
            a.outcome.set_result(_outcome(a, "error", err.message))

    def _publish(self, outputs: list[StepOutput]) -> None:
        events: list[tuple[Route, Event]] = []
        now = time.time()
        for out in outputs:
            admission = self._running[out.job_id]
            admission.completion_tokens = out.completion_tokens
            if admission.first_token_at is None:
                admission.first_token_at = now
            route = admission.route
            if out.text or out.reasoning or out.logprobs or out.call_deltas or out.tool_calls:
                token = TokenEvent(
                    text=out.text,
                    reasoning=out.reasoning or None,
                    logprobs=out.logprobs,
                    call_deltas=out.call_deltas,
                    tool_calls=out.tool_calls,
                    index=out.index or None,
                )
                events.append((route, token))
            if out.finish_reason is None:
                continue
            if len(admission.prepared.choices) > 1 and out.error is None:
                end = ChoiceEndEvent(index=out.index, finish_reason=_reason(out.finish_reason))
                events.append((route, end))
            if out.ends_job:
                admission.cached_tokens = out.cached_tokens
                events.append((route, _final(out)))
        self._sink.send(events)

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

    def _retire(self, outputs: list[StepOutput]) -> None:
        for out in outputs:
            if not out.ends_job:
                continue
            admission = self._running.pop(out.job_id, None)
            if admission is not None:
                reason = out.finish_reason or "error"
                admission.outcome.set_result(_outcome(admission, reason, _error_message(out)))


def _error_message(out: StepOutput) -> str | None:
    return None if out.error is None else f"generation failed: {out.error}"


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


def _final(out: StepOutput) -> DoneEvent | ErrorEvent:
    message = _error_message(out)
    if message is not None:  # this sequence failed, the rest of the batch goes on
        return ErrorEvent.from_error(GenerationError(message))
    usage = Usage(
        prompt_tokens=out.prompt_tokens,
        completion_tokens=out.completion_tokens,
        total_tokens=out.prompt_tokens + out.completion_tokens,
        prompt_tokens_details=PromptTokensDetails(cached_tokens=out.cached_tokens),
        completion_tokens_details=CompletionTokensDetails(reasoning_tokens=out.reasoning_tokens),
    )
    return DoneEvent(
        finish_reason=_reason(out.finish_reason), usage=usage, stop_sequence=out.stop_sequence
    )


def _reason(engine_reason: str | None) -> FinishReason:
    if engine_reason == "tool_calls":
        return "tool_calls"
    return "stop" if engine_reason == "stop" else "length"


def _outcome(admission: Admission, finish_reason: str, error: str | None = None) -> JobOutcome:
    return JobOutcome(
        error=error,
        finish_reason=finish_reason,
        prompt_tokens=admission.prepared.prompt_tokens,
        completion_tokens=admission.completion_tokens,
        cached_tokens=admission.cached_tokens,
        first_token_at=admission.first_token_at,
    )
