"""The core every interactive endpoint shares: run a job and read its events.

`start` admits the job (api/queue/admission.py), queues it and waits for its first event, so
that anything the worker refuses (a prompt too long for the context window, say) still becomes
a proper HTTP error before a stream has begun. `RunningJob.updates` then yields the job's
events in groups, one tagged union (`Relayed`): the tokens, a keep-alive after a silence, the
final event. Closing a job that has not finished cancels it: that is how a client that went
away frees its slot.
A job that is not started by its queue deadline is withdrawn and answered 503 `queue_timeout`;
a job whose worker is lost is ended by the job watch (api/queue/watch.py).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Literal, TypeVar

from opentelemetry.trace import Span

from api.http.auth import owner_id
from api.http.hangup import hung_up
from api.http.sse import DONE, KEEPALIVE, frame
from api.limits.open_requests import open_requests
from api.limits.shares import release_hold
from api.queue.admission import Admitted, admit
from api.queue.broker import Broker
from api.queue.relay import Subscription
from shared.observe import tracing
from shared.observe.logs import log_event
from shared.queue.jobs import QueuedJob
from shared.wire.chat.answers import Transcripts
from shared.wire.errors import (
    BackendUnavailableError,
    ClientClosedError,
    GenerationError,
    MLXQError,
    QueueTimeoutError,
    error_from_detail,
)
from shared.wire.events import (
    AliveEvent,
    ChoiceEndEvent,
    DoneEvent,
    EmbeddingEvent,
    ErrorEvent,
    Event,
    EventDecodeError,
    StartedEvent,
    TokenEvent,
    decode_event,
)

R = TypeVar("R")  # a request's validated body
A = TypeVar("A")  # the answer built for it

request_log = logging.getLogger("mlxq.request")  # one structured line per request
# How often a waiting stream wakes up to send a keepalive comment.
KEEPALIVE_S = 5.0
# How long past its queue deadline a request still waits for a worker that took the job just in
# time (and is tokenizing its prompt) before giving up.
START_GRACE_S = 1.0
# How often a request waiting for its job's start checks that its client is still there.
HANGUP_CHECK_S = 1.0


@dataclass(frozen=True)
class KeepaliveEvent:
    """Nothing arrived for KEEPALIVE_S: a stream writes what keeps its line open. Made here,
    by the API, never sent by a worker."""

    type: Literal["keepalive"] = "keepalive"


# What a job's stream carries to its reader, each member tagged by its `type`: its output,
# keep-alives while it is silent, then its end (an error is raised instead). Readers dispatch
# by class: on the per-token path `isinstance(event, TokenEvent)` costs 20-30 ns less per token
# than `event.type == "token"`, a pydantic field read (measured, 4-token groups).
Relayed = TokenEvent | ChoiceEndEvent | EmbeddingEvent | KeepaliveEvent | DoneEvent


@dataclass
class RunningJob:
    job: QueuedJob
    started: StartedEvent
    sub: Subscription
    broker: Broker
    early: list[Event] = field(default_factory=list)  # events that came with the start
    finished: bool = False
    # For the request's log line: who asked, and when it was sent, started, first answered.
    owner: str = ""
    submitted_at: float = 0.0
    started_at: float = 0.0
    first_token_at: float | None = None
    done: DoneEvent | None = None
    error_code: str | None = None
    span: Span | None = None  # the request's trace span, when tracing is on
    place: str | None = None  # the owner whose open-request place it holds (None: none)

    def updates(self) -> Iterator[list[Relayed]]:
        """Tokens as they arrive, in groups of whatever is waiting, the last ending with the
        DoneEvent; a group of one KeepaliveEvent after a silence; raises the job's error if it
        fails, after the tokens that arrived before it."""
        if self.early:
            yield from self._take(self.early)
        timeout_s = self.broker.settings.event_timeout_s
        deadline = time.monotonic() + timeout_s
        while not self.finished:
            events = _next_events(self.sub, deadline, KEEPALIVE_S)
            if not events:
                yield [KeepaliveEvent()]
                continue
            deadline = time.monotonic() + timeout_s  # an AliveEvent counts: the worker spoke
            yield from self._take(events)

    def _take(self, events: list[Event]) -> Iterator[list[Relayed]]:
        """`events` as one group. An error among them ends the job: it is raised after the
        group of the events that came before it."""
        if self.first_token_at is None and not isinstance(events[0], AliveEvent):
            self.first_token_at = time.time()
        batch: list[Relayed] = []
        for event in events:
            if isinstance(event, TokenEvent | ChoiceEndEvent | EmbeddingEvent | DoneEvent):
                batch.append(event)
                if isinstance(event, DoneEvent):
                    self.finished, self.done = True, event
            elif isinstance(event, AliveEvent):
                continue  # the job is still running: it kept the wait's deadline off
            else:
                self.finished = True
                err = _as_error(event)
                self.error_code = err.code
                if batch:
                    yield batch
                raise err
        yield batch or [KeepaliveEvent()]

    def close(self) -> None:
        self.broker.relay.unsubscribe(self.sub)
        if not self.finished:
            # If Redis is gone, the job ends on its own (max_tokens, run limit).
            with contextlib.suppress(BackendUnavailableError):
                self.broker.cancel(self.job.job_id)
        with contextlib.suppress(BackendUnavailableError):
            open_requests().give_back(self.place, self.job.job_id)
        self._log()
        tracing.end_request(
            self.span, self.job.job_id, self.started.prompt_tokens, self.done, self.error_code
        )

    def _log(self) -> None:
        usage = self.done.usage if self.done is not None else None
        reason = self.done.finish_reason if self.done is not None else None
        cached = usage.prompt_tokens_details.cached_tokens if usage is not None else None
        first = self.first_token_at
        log_event(
            request_log,
            "request",
            job_id=self.job.job_id,
            model=self.job.model,
            owner=self.owner,
            worker=self.started.worker,
            finish_reason=reason or self.error_code or "cancelled",
            prompt_tokens=self.started.prompt_tokens,
            completion_tokens=usage.completion_tokens if usage is not None else None,
            cached_tokens=cached,
            queue_s=self.started_at - self.submitted_at,
            ttft_s=None if first is None else first - self.submitted_at,
            duration_s=time.time() - self.submitted_at,
        )


def start(broker: Broker, job: QueuedJob) -> RunningJob:
    """Admit the job, queue it and wait for its worker's first event; it holds one of its
    key's open requests (api/limits/open_requests.py) until it is closed."""
    submitted_at = time.time()
    span = tracing.request_span(job)
    places = open_requests()
    try:
        holder = places.take(job.job_id)
    except BaseException as err:
        tracing.end_request(span, job.job_id, 0, None, getattr(err, "code", "error"))
        raise
    try:
        running = _started(broker, admit(broker, job, tracing.traceparent(span)))
    except BaseException as err:
        with contextlib.suppress(BackendUnavailableError):
            places.give_back(holder, job.job_id)
        tracing.end_request(span, job.job_id, 0, None, getattr(err, "code", "error"))
        raise
    running.submitted_at, running.span, running.place = submitted_at, span, holder
    return running


def _started(broker: Broker, admitted: Admitted) -> RunningJob:
    """Queue the admitted job and wait for its worker's first event."""
    job, sub = admitted.job, admitted.sub
    broker.enqueue(admitted.job, admitted.sub)
    limit_s = broker.settings.queue_timeout_s
    late = QueueTimeoutError(
        f"The job waited in the queue for more than {limit_s:g} s and was not started; "
        "the service is overloaded, retry later."
    )
    deadline = time.monotonic() + limit_s + START_GRACE_S
    try:
        events = _next_events(sub, deadline, HANGUP_CHECK_S, late)
        while not events:
            if hung_up():
                raise ClientClosedError("The client closed its connection while its job waited.")
            events = _next_events(sub, deadline, HANGUP_CHECK_S, late)
        first, *rest = events
    except BaseException:
        broker.relay.unsubscribe(sub)
        _withdraw_quietly(broker, job)
        raise
    if not isinstance(first, StartedEvent):
        broker.relay.unsubscribe(sub)
        raise _as_error(first)
    return RunningJob(
        job=job,
        started=first,
        sub=sub,
        broker=broker,
        early=rest,
        owner=owner_id(),
        started_at=time.time(),
    )


def _withdraw_quietly(broker: Broker, job: QueuedJob) -> None:
    with contextlib.suppress(BackendUnavailableError):
        broker.withdraw(job.job_id, job.model)
        if job.queued_tokens is not None:  # off its queue: no worker will give them back
            release_hold(job.job_id)


def _next_events(
    sub: Subscription, deadline: float, wake_s: float | None, late: MLXQError | None = None
) -> list[Event]:
    """The events waiting (at least one); [] after `wake_s` of silence; `late` (an error, by
    default a GenerationError) past `deadline`."""
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise late or GenerationError("the worker sent nothing in time", code="timeout")
        messages = sub.next_messages(min(left, wake_s) if wake_s else left)
        if messages:
            return _decoded(messages)
        if wake_s is not None and time.monotonic() < deadline:
            return []


def _decoded(messages: list[bytes]) -> list[Event]:
    """The messages as events. One that cannot be decoded becomes an error event that ends the
    list, so the events before it still reach the client and the stream ends with an error."""
    events: list[Event] = []
    for message in messages:
        try:
            events.append(decode_event(message))
        except EventDecodeError as err:
            events.append(ErrorEvent.from_error(err))
            break
    return events


def _as_error(event: Event | None) -> MLXQError:
    if isinstance(event, ErrorEvent):
        return error_from_detail(event.status, event.error)
    return GenerationError(f"unexpected event from the worker: {event!r}")


@dataclass(frozen=True)
class Collected:
    got: Transcripts
    done: DoneEvent


def collect(running: RunningJob) -> Collected:
    """Run a job to its end and gather what it produced (the non-streaming responses)."""
    got = Transcripts()
    try:
        for batch in running.updates():
            for event in batch:
                if isinstance(event, TokenEvent | ChoiceEndEvent):
                    got.add(event)
                elif isinstance(event, DoneEvent):
                    return Collected(got, event)
    finally:
        running.close()
    raise GenerationError("the job ended without a final event")


def collect_answer(
    running: RunningJob, req: R, build: Callable[[R, str, int, Transcripts, DoneEvent], A]
) -> A:
    """Run a job to its end and answer it with `build`, one of shared/wire/chat/answers.py's
    answer builders (`chat_completion`, `text_completion`), created now."""
    result = collect(running)
    return build(req, running.job.job_id, int(time.time()), result.got, result.done)


def stream_frames(
    running: RunningJob,
    opening: list[bytes],
    token_frame: Callable[[TokenEvent], bytes],
    done_frames: Callable[[DoneEvent], list[bytes]],
    end_frame: Callable[[ChoiceEndEvent], bytes] | None = None,
) -> Iterator[bytes]:
    """A job's SSE stream: opening frames, one frame per token, a keep-alive comment while it is
    silent, the closing frames, [DONE].

    A failure after the stream began is sent as an OpenAI error object in a `data:` frame.
    The `finally` runs when the client goes away too, and then cancels the job.
    """
    try:
        yield from opening
        for batch in running.updates():
            yield b"".join(_frames(batch, token_frame, done_frames, end_frame))
        yield DONE
    except MLXQError as err:
        yield frame(err.body())
    finally:
        running.close()


def _frames(
    batch: list[Relayed],
    token_frame: Callable[[TokenEvent], bytes],
    done_frames: Callable[[DoneEvent], list[bytes]],
    end_frame: Callable[[ChoiceEndEvent], bytes] | None,
) -> Iterator[bytes]:
    for event in batch:
        if isinstance(event, TokenEvent):
            yield token_frame(event)
        elif isinstance(event, KeepaliveEvent):
            yield KEEPALIVE
        elif isinstance(event, DoneEvent):
            yield from done_frames(event)
        elif isinstance(event, ChoiceEndEvent) and end_frame is not None:
            yield end_frame(event)
