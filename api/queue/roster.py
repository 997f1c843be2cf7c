"""What the fleet serves, read and never written: the live models and their workers, their
kinds, and the pools' catalog (shared/queue/liveness.py, model_kinds.py, pool.py).

Admission asks it once per job (the live workers of a job's model: 404 when none, unless a live
pool may load it); `/v1/models` and `/health` list from it (`roster()`). The queue's writes are
the broker's (api/queue/broker.py).
"""

from __future__ import annotations

import time
from typing import Any

from flask import Flask, current_app

from api.backend import Backend
from shared.queue.jobs import GenerationJob, QueuedJob
from shared.queue.liveness import horizon, live_workers
from shared.queue.model_kinds import read_kinds, refuse_wrong_kind
from shared.queue.pool import Catalog, read_catalog
from shared.wire.errors import ModelNotFoundError
from shared.wire.fleet.catalog import ModelKind


class Roster:
    def __init__(self, backend: Backend):
        self._backend = backend
        self._heartbeat_s = backend.settings.heartbeat_s

    def init_app(self, app: Flask) -> None:
        app.extensions["mlxq.roster"] = self

    def live_models(self) -> list[tuple[str, float]]:
        """The models a live worker serves, with their last heartbeat."""
        b = self._backend
        oldest = horizon(time.time(), self._heartbeat_s)
        rows: list[Any] = b.call(
            lambda: b.redis.zrangebyscore(b.keys.models(), oldest, "+inf", withscores=True)
        )
        seen = {bytes(name).decode(): float(score) for name, score in rows}
        live = self.live_workers(list(seen))
        return [(name, score) for name, score in seen.items() if live[name]]

    def require_model(self, model: str) -> None:
        """A 404 unless a live worker serves `model`: the rule `/v1/models` lists by."""
        self.served_by(model)

    def kinds(self, models: list[str]) -> dict[str, ModelKind | None]:
        """What each model is, as its workers announced it (None: not announced)."""
        b = self._backend
        return b.call(lambda: read_kinds(b.redis, b.keys, models))

    def require_kind(self, job: QueuedJob) -> None:
        """A 400 naming `model` when the job's model is of the other kind (an embedding model
        asked for a chat, a chat model for embeddings: shared/queue/model_kinds.py), or when
        it carries images its model does not read; a 404 first for images sent to a model
        nothing serves."""
        kind = self.kinds([job.model])[job.model]
        if kind is None and isinstance(job, GenerationJob) and job.has_images:
            self.require_model(job.model)
        refuse_wrong_kind(job, kind)

    def served_by(self, model: str) -> frozenset[str]:
        """The live workers serving `model`, read once for a job's admission. None while a
        live pool may load it (it waits in its queue: shared/queue/pool.py); a 404 if neither,
        a 400 naming the budget if it fits no pool."""
        workers = self.live_workers([model])[model]
        if not workers and not self.catalog().admits(model):
            raise ModelNotFoundError(
                f"The model '{model}' does not exist or no live worker serves it.", param="model"
            )
        return frozenset(workers)

    def catalog(self) -> Catalog:
        """The live pools' catalog (shared/queue/pool.py)."""
        b = self._backend
        return b.call(lambda: read_catalog(b.redis, b.keys, self._heartbeat_s))

    def live_workers(self, models: list[str]) -> dict[str, set[str]]:
        """The live workers of each of `models` (shared/queue/liveness.py)."""
        b = self._backend
        return b.call(lambda: live_workers(b.redis, b.keys, models, self._heartbeat_s))


def roster() -> Roster:
    found: Roster = current_app.extensions["mlxq.roster"]
    return found
