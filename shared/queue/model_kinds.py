"""What kind of model each served model is, and the one rule for a job of the other kind.

A worker says what its model is, `chat` or `embedding`, in `{ns}:model-kinds`
(worker/runtime/liveness/heartbeat.py `born`) before its first heartbeat, so every model a live
worker serves has its kind there. A job of the other kind (a chat, completion, response or message
on an embedding model, embeddings on a chat model) can never run: no worker of that model takes
it for what it is. Queued, a client waiting on it would only hear of it from the worker, and a
background response or a batch line would wait for a worker that never answers it. So the API
refuses it before anything is queued, on every route (api/queue/admission.py, the batch
intake: api/stores/batch_intake.py), with `wrong_kind`'s 400 naming `model`; a worker answers
a job of the wrong kind that still reaches it with the same error.

A model whose kind is not known (its workers predate the hash) is let through: its worker
still refuses what it cannot run.

Images are the other rule here: a job whose messages carry images runs only on a model of a
kind that reads them (`READS_IMAGES`). No kind does yet (the vision engine is still to come), so
every such job is refused with `no_images`' 400 naming `model`, whatever the model's kind, a
kind not known included: a worker that cannot see would otherwise answer as if no image had been
sent.
"""

from __future__ import annotations

from typing import Any, cast, get_args

from redis import Redis

from shared.queue.jobs import GenerationJob, QueuedJob
from shared.queue.keys import Keys
from shared.wire.errors import InvalidRequestError
from shared.wire.fleet.catalog import ModelKind

# What a job of the other kind is told a model of each kind is.
_WHAT_IT_IS: dict[ModelKind, str] = {
    "chat": "a chat model; it does not serve /v1/embeddings",
    "embedding": "an embedding model; send it to /v1/embeddings",
}


def kind_of_job(job: QueuedJob) -> ModelKind:
    """The kind of model that can run `job`."""
    return job.model_kind


def wrong_kind(model: str, kind: ModelKind) -> InvalidRequestError:
    """The 400 for a job sent to `model`, a model of `kind` that cannot run it."""
    return InvalidRequestError(f"The model '{model}' is {_WHAT_IT_IS[kind]}.", param="model")


# The kinds of model that read images: none yet.
READS_IMAGES: frozenset[ModelKind] = frozenset()


def no_images(model: str) -> InvalidRequestError:
    """The 400 for a job with images sent to `model`, which does not read them."""
    return InvalidRequestError(
        f"The model '{model}' does not accept images: it reads text only. Send the request "
        "without image parts, or to a vision model.",
        param="model",
        code="model_not_vision",
    )


def refuse_wrong_kind(job: QueuedJob, kind: ModelKind | None) -> None:
    """Raise `wrong_kind` when the job's model, of `kind` (None: not known), cannot run it, and
    `no_images` when the job carries images its model does not read."""
    if kind is not None and kind != kind_of_job(job):
        raise wrong_kind(job.model, kind)
    if isinstance(job, GenerationJob) and job.has_images and kind not in READS_IMAGES:
        raise no_images(job.model)


def read_kinds(redis: Redis, keys: Keys, models: list[str]) -> dict[str, ModelKind | None]:
    """Each model's kind as its workers announced it (None: not announced), in one read."""
    if not models:
        return {}
    raw: Any = redis.hmget(keys.model_kinds(), models)
    return {model: parse_kind(value) for model, value in zip(models, raw, strict=True)}


def parse_kind(raw: bytes | str | None) -> ModelKind | None:
    """A stored kind; None for none, or for a kind this version does not know."""
    text = raw.decode() if isinstance(raw, bytes) else raw
    for kind in get_args(ModelKind):
        if text == kind:
            return cast(ModelKind, kind)
    return None
