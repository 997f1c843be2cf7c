"""Fault injection, for the fault tests only: a worker started with MLXQ_FAULT_INJECTION=true
fails on demand, so that tests can prove what happens when a sequence or the loop breaks.

A job whose prompt contains `[[fault:raise]]` gets a text decoder that raises at its third
token (one sequence's own work fails: the rest of the batch must go on); `[[fault:wedge]]` one
that blocks forever there (the engine loop wedges while it holds work: the watchdog must see
it). `[[fault:raise-job]]` makes the job itself raise as it is prepared, out of the job function
and into RQ, with the job's prompt in the exception's text: the worst an exception can carry,
which no log may show (shared/observe/logs.py). With the setting off (the default) serve.py uses
the plain `Engine` and none of this runs.
"""

from __future__ import annotations

import threading
from functools import cached_property

from typing_extensions import override

from shared.queue.jobs import GenerationJob
from worker.engine.generation.engine import Engine
from worker.engine.prepare import PreparedJob
from worker.engine.sequence.detokenize import TextDecoder

RAISE = "[[fault:raise]]"
WEDGE = "[[fault:wedge]]"
RAISE_JOB = "[[fault:raise-job]]"
FAULT_AT_TOKEN = 3


class InjectedFault(RuntimeError):
    """The failure a test asked for."""


class FaultyDecoder:
    def __init__(self, inner: TextDecoder, fault: str):
        self._inner = inner
        self._fault = fault
        self._tokens = 0

    def add(self, token: int) -> str:
        self._tokens += 1
        if self._tokens == FAULT_AT_TOKEN:
            if self._fault == WEDGE:
                threading.Event().wait()  # forever: a deadlock inside the engine loop
            raise InjectedFault("injected fault in one sequence")
        return self._inner.add(token)

    def finish(self) -> str:
        return self._inner.finish()


class FaultyEngine(Engine):
    """The engine, but jobs that ask for a fault get a faulty text decoder."""

    @cached_property
    def _armed(self) -> dict[str, str]:
        """Job id -> the fault its prompt asked for, from `prepare` until its decoder is made."""
        return {}

    @override
    def prepare(self, job: GenerationJob) -> PreparedJob:
        texts = _texts(job)
        if any(RAISE_JOB in text for text in texts):
            raise InjectedFault(f"injected fault in the job, whose prompt is {texts!r}")
        prepared = super().prepare(job)
        fault = _fault_in(job)
        if fault is not None:
            self._armed[job.job_id] = fault
        return prepared

    @override
    def _new_decoder(self, prepared: PreparedJob) -> TextDecoder:
        decoder = super()._new_decoder(prepared)
        fault = self._armed.pop(prepared.job_id, None)
        return FaultyDecoder(decoder, fault) if fault is not None else decoder


def _texts(job: GenerationJob) -> list[str]:
    texts = [m.text() for m in job.messages or []]
    return texts + [i for i in job.prompt_items() if isinstance(i, str)]


def _fault_in(job: GenerationJob) -> str | None:
    texts = _texts(job)
    for fault in (RAISE, WEDGE):
        if any(fault in text for text in texts):
            return fault
    return None
