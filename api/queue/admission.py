"""Admission: the one step between a built job and its queue.

`admit` takes a job as its route built it (shared/queue/jobs.py `job_for`) and makes each check
once, in the order a client sees their refusals:
0. the job's model must be of the job's kind (400 naming `model`: a chat on an embedding model,
   embeddings on a chat model; shared/queue/model_kinds.py), and its keep_alive one its key may
   ask (400 naming `keep_alive`: only operators unload or pin a shared model; other keys' values
   are capped at MLXQ_KEEP_ALIVE_MAX: shared/wire/fleet/keep_alive.py), before its prompt is counted
   with a tokenizer that was never meant for it or its key is charged for it;
1. it counts the prompt, rendered and tokenized once (api/queue/context_window.py), for the
   next two checks and placement;
2. the caller's per-key rate limits take their share (api/limits/rates.py: 429);
3. the prompt must fit the context window (400 `context_length_exceeded`);
4. it reads the live workers of the job's model once (404 when none), for placement too;
5. the model's queue must have room (429 `queue_full`), which counts the job in its backlog;
6. placement names the worker holding the prompt's prefix (api/queue/placement.py).

It then subscribes to the job's events and returns it `Admitted`: the job as it will be queued,
copied once with what admission added (its reply channel, the queued tokens it holds, its trace
and its queue deadline), never changed after. The deadline is stamped last, right before the
broker's `enqueue`: it counts from the enqueue, not from the checks before it.

A background response is admitted in fewer steps (`admit_background`): it waits in its lane
without a cap, and nobody listens for its events. Its model must be live and of its kind all
the same: nobody would hear that it can never run.
"""

from __future__ import annotations

from dataclasses import dataclass

from api.http.auth import is_operator
from api.limits.shares import counts_tokens, take_share
from api.queue.broker import Broker
from api.queue.context_window import PromptCount
from api.queue.placement import Outcome
from api.queue.relay import Subscription
from shared.queue.jobs import GenerationJob, QueuedJob
from shared.wire.fleet.keep_alive import asked


@dataclass(frozen=True)
class Admitted:
    """A job the API let in, as it will be queued, and what admitting it found."""

    job: QueuedJob
    prompt: PromptCount | None  # None: an embedding job, or no tokenizer the API can count with
    workers: frozenset[str]  # the live workers of its model when it was admitted
    placed: Outcome | None  # where placement put it; None: not placed
    sub: Subscription  # its events, from before it is queued


def admit(broker: Broker, job: QueuedJob, trace: str | None) -> Admitted:
    """Check the job once each way (the module docstring's order) and return it admitted, or
    raise the first refusal. `trace`: the request span's traceparent, carried to the worker."""
    broker.roster.require_kind(job)
    keep_alive = asked(job.keep_alive_s, is_operator(), broker.settings.keep_alive_max)
    prompt = broker.windows.measure(job)
    limits = broker.interactive_limits()
    held = take_share(job, prompt, limits, broker.settings.queue_timeout_s)
    if prompt is not None and isinstance(job, GenerationJob):
        prompt.room(job)  # a 400 when the prompt leaves no room for what the job asks
    workers = broker.roster.served_by(job.model)
    broker.accept(job)
    try:
        placed = broker.place(job, prompt, workers)
        sub = broker.relay.subscribe(job.job_id)
    except BaseException:
        broker.release(job.job_id, job.model)
        raise
    stamped = limits.model_copy(update={"queue_deadline": broker.queue_deadline()})
    update = {
        "limits": stamped,
        "reply_to": broker.api_id,
        "queued_tokens": held,
        "trace": trace,
        "keep_alive_s": keep_alive,
    }
    return Admitted(job.model_copy(update=update), prompt, workers, placed, sub)


def admit_background(broker: Broker, job: GenerationJob) -> GenerationJob:
    """A background response as it will be queued: in `admit`'s order, a 400 when its model
    does not generate, a 404 unless a live worker serves it, then its key's share, held while
    it is kept (it has no queue deadline)."""
    broker.roster.require_kind(job)
    keep_alive = asked(job.keep_alive_s, is_operator(), broker.settings.keep_alive_max)
    broker.roster.require_model(job.model)
    prompt = broker.windows.measure(job) if counts_tokens() else None  # only where it counts
    held = take_share(job, prompt, job.limits, broker.settings.response_ttl_s)
    return job.model_copy(update={"queued_tokens": held, "keep_alive_s": keep_alive})
