"""The RQ job class slots run: data only, one fixed function, nothing imported by name.

RQ's own `Job` resolves `func_name` with `import_attribute`, and its callbacks the same way,
so whoever can write a job into Redis could make a stock RQ worker import and call anything.
A slot (worker/runtime/intake/slots.py) runs `FixedJob`s instead, and refuses a job before doing
anything with it unless its data decodes as JSON (RQ's JSON serializer: nothing is unpickled), it
names `shared.queue.jobs.JOB_FUNCTION` or `EMBEDDING_JOB_FUNCTION`, it has no instance, one dict
argument and no keyword arguments, and it carries no callbacks. Even then the function is this
module's own reference to `run_generation` or `run_embedding` (worker/runtime/job_function.py,
which refuses a job of the kind its worker does not serve), never a name looked up at run time.
Webhooks in a job record are ignored.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rq.exceptions import DeserializationError
from rq.job import Job

from shared.queue.jobs import EMBEDDING_JOB_FUNCTION, JOB_FUNCTION


class RefusedJobError(Exception):
    """A job on the queue that a worker must not run (wrong function, not JSON, callbacks)."""


def refusal(job: Job) -> str | None:
    """Why `job` must not run, or None when it is a well-formed generation job."""
    try:
        func_name, instance, args, kwargs = job.func_name, job.instance, job.args, job.kwargs
    except DeserializationError:
        return "its data is not JSON"
    if func_name not in (JOB_FUNCTION, EMBEDDING_JOB_FUNCTION):
        return f"it names the function {str(func_name)[:100]!r}, not {JOB_FUNCTION!r}"
    one_object = isinstance(args, list | tuple) and len(args) == 1 and isinstance(args[0], dict)
    if instance is not None or kwargs != {} or not one_object:
        return "its arguments are not one JSON object"
    if job._success_callback_name or job._failure_callback_name or job._stopped_callback_name:
        return "it carries callbacks"
    return None


class FixedJob(Job):
    """An RQ job that can only ever call mlxq's two job functions."""

    @property
    def func(self) -> Callable[..., Any]:
        reason = refusal(self)
        if reason is not None:
            raise RefusedJobError(f"job {self.id} refused: {reason}")
        from worker.runtime.job_function import run_embedding, run_generation

        return run_embedding if self.func_name == EMBEDDING_JOB_FUNCTION else run_generation

    @property
    def success_callback(self) -> None:
        return None

    @property
    def failure_callback(self) -> None:
        return None

    @property
    def stopped_callback(self) -> None:
        return None

    def send_webhooks(self, status: Any, *, exc_string: str | None = None) -> None:
        """A job record's webhooks are never called: Redis data must not make us send requests."""
