"""The embedding worker's engine loop: the one thread that owns the embedding engine.

It has the generation loop's (worker/runtime/loop.py) surface and phases, so the slots, drain,
watchdog, heartbeat and cancel listener drive it unchanged: admit (wait for work only when idle,
then gather the jobs arriving right behind it, so that requests sent together share forwards)
-> step (one padded forward over the next group of inputs, from any jobs) -> publish that
step's vectors in one Redis pipeline -> apply cancellations -> retire finished jobs (wake their
RQ slot threads). `generated` counts the tokens encoded, for the heartbeat's tokens/s.
"""

from __future__ import annotations

import base64
import logging
import queue
import threading
from concurrent.futures import Future
from dataclasses import dataclass, field

from shared.queue.jobs import JobOutcome
from shared.wire.completions import Usage
from shared.wire.errors import GenerationError
from shared.wire.events import DoneEvent, EmbeddingEvent, ErrorEvent, Event, StartedEvent
from worker.engine.embedding.engine import EmbeddingEngine, EmbeddingOutput, PreparedEmbedding
from worker.runtime.loop import gather
from worker.runtime.publish import EventSink, Route

log = logging.getLogger(__name__)


@dataclass
class EmbeddingAdmission:
    """A job handed to the loop, and the future its slot thread waits on."""

    prepared: PreparedEmbedding
    route: Route
    outcome: Future[JobOutcome] = field(default_factory=Future)
    cancelled: bool = False


class EmbeddingLoop:
    def __init__(self, engine: EmbeddingEngine, sink: EventSink, worker_id: str = ""):
        self._engine = engine
        self._sink = sink
        self._worker_id = worker_id or None
        self._inbox: queue.SimpleQueue[EmbeddingAdmission] = queue.SimpleQueue()
        self._cancels: queue.SimpleQueue[str] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._waiting: dict[str, EmbeddingAdmission] = {}
        self._running: dict[str, EmbeddingAdmission] = {}
        self.turns = 0
        self.generated = 0

    def submit(self, prepared: PreparedEmbedding, route: Route) -> Future[JobOutcome]:
        admission = EmbeddingAdmission(prepared, route)
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

    def _started(self, a: EmbeddingAdmission) -> StartedEvent:
        return StartedEvent(prompt_tokens=a.prepared.prompt_tokens, worker=self._worker_id)

    def _step(self) -> list[EmbeddingOutput]:
        try:
            outputs = self._engine.step()
        except Exception as err:  # one failed forward must not take the worker down
            log.exception("embedding step failed; failing the %d running jobs", len(self._running))
            self._fail_running(GenerationError(f"embedding failed: {err}"))
            return []
        self.generated += sum(
            len(self._running[o.job_id].prepared.inputs[o.index]) for o in outputs
        )
        return outputs

    def _fail_running(self, err: GenerationError) -> None:
        failed = list(self._running.values())
        self._engine.remove([a.prepared.job_id for a in failed])
        self._running.clear()
        self._sink.send([(a.route, ErrorEvent.from_error(err)) for a in failed])
        for a in failed:
            a.outcome.set_result(_outcome(a, "error"))

    def _publish(self, outputs: list[EmbeddingOutput]) -> None:
        events: list[tuple[Route, Event]] = []
        for out in outputs:
            route = self._running[out.job_id].route
            data = base64.b64encode(out.vector).decode()
            events.append((route, EmbeddingEvent(index=out.index, data=data)))
            if out.ends_job:
                tokens = out.prompt_tokens
                usage = Usage(prompt_tokens=tokens, completion_tokens=0, total_tokens=tokens)
                events.append((route, DoneEvent(finish_reason="stop", usage=usage)))
        self._sink.send(events)

    def _apply_cancellations(self) -> None:
        while True:
            try:
                job_id = self._cancels.get_nowait()
            except queue.Empty:
                return
            with self._lock:
                waiting = self._waiting.get(job_id)
                if waiting is not None:
                    waiting.cancelled = True
            running = self._running.pop(job_id, None)
            if running is not None:
                self._engine.remove([job_id])
                running.outcome.set_result(_outcome(running, "cancelled"))

    def _retire(self, outputs: list[EmbeddingOutput]) -> None:
        for out in outputs:
            if out.ends_job and (admission := self._running.pop(out.job_id, None)) is not None:
                admission.outcome.set_result(_outcome(admission, "stop"))


def _outcome(admission: EmbeddingAdmission, finish_reason: str) -> JobOutcome:
    return JobOutcome(
        finish_reason=finish_reason,
        prompt_tokens=admission.prepared.prompt_tokens,
        completion_tokens=0,
    )
