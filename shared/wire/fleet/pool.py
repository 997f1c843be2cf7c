"""The model pool's formats: what each machine's pool agent publishes (its catalog with each
model's cost, its budget, what it holds and what it did), an operator's orders, a failed load.

A pool agent (worker/pool/agent.py) rewrites its `PoolReport` each beat; the API lists the
catalog from the live reports (api/routes/models.py), admits a job for a catalog model nobody
holds (api/queue/broker.py) and ends the waits of jobs whose model failed to load
(`LoadFailure`, api/queue/watch.py); `mlxq status`, /metrics and the page show the reports.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

from shared.wire.errors import ModelLoadError
from shared.wire.fleet.catalog import ModelKind

MIB = 1 << 20


class ModelCost(BaseModel):
    """What one catalog model takes once loaded, known before it loads (worker/pool/catalog.py):
    its weights, its KV budget (`kv_tokens` positions its `rows` sequences share), its prefix
    cache and a process's headroom."""

    model_config = ConfigDict(frozen=True)

    weight_bytes: int
    kv_bytes_per_token: int  # 0 for an embedding model
    rows: int
    kv_tokens: int
    prefix_cache_bytes: int
    headroom_bytes: int

    @property
    def kv_bytes(self) -> int:
        return self.kv_bytes_per_token * self.kv_tokens

    @property
    def total_bytes(self) -> int:
        return self.weight_bytes + self.kv_bytes + self.prefix_cache_bytes + self.headroom_bytes


class CatalogEntry(BaseModel):
    """One model a machine may serve."""

    model_config = ConfigDict(frozen=True)

    name: str  # the name requests use
    kind: ModelKind
    created: int  # unix s: when its folder was written (/v1/models `created`)
    cost: ModelCost
    keep_alive_s: float  # FOREVER (-1): never unloaded for being idle
    pinned: bool = False


class HeldModel(BaseModel):
    """A worker process the pool started for a model, as the agent sees it."""

    model: str
    worker_id: str
    state: Literal["loading", "loaded", "unloading"]
    started_at: float  # unix s
    loaded_at: float | None = None
    rss_bytes: int = 0  # resident memory, read from the process
    last_used: float | None = None  # unix s: when it last held a job
    pinned: bool = False


class PoolEvent(BaseModel):
    """A load, an unload or a failed load, for the operators' views."""

    at: float
    model: str
    what: Literal["load", "unload", "evict", "load_failed"]
    seconds: float | None = None  # how long the load took, or the unload (SIGTERM to exit)
    why: str = ""


class PoolReport(BaseModel):
    """One machine's pool, rewritten each beat (shared/queue/pool.py)."""

    machine: str
    budget_bytes: int
    used_bytes: int  # the costs of what it holds and loads, and its spare's
    rss_bytes: int  # its workers' resident memory, measured, its spare's included
    catalog: list[CatalogEntry]
    spare_id: str | None = None  # its spare worker, which the next load tells its model
    spare_bytes: int = 0  # what used_bytes counts for the spare: a process's headroom
    held: list[HeldModel]
    loads: int = 0
    evictions: int = 0
    unloads: int = 0
    failed_loads: int = 0
    events: list[PoolEvent] = []  # the last few, newest first

    def entry(self, model: str) -> CatalogEntry | None:
        return next((e for e in self.catalog if e.name == model), None)

    @property
    def free_bytes(self) -> int:
        """The room for a load: the load takes the spare's place."""
        return self.budget_bytes - self.used_bytes + self.spare_bytes


class LoadFailure(BaseModel):
    """A model whose worker failed to start: jobs queued before `at` are told why."""

    model: str
    machine: str
    at: float
    why: str

    def error(self) -> ModelLoadError:
        """What every job that waited for this load is told, interactive or bulk."""
        return ModelLoadError(
            f"The model '{self.model}' failed to load on {self.machine}: {self.why}",
            param="model",
        )


class PoolOrder(BaseModel):
    """An operator's order for a model (`mlxq load|unload`), to every pool agent."""

    action: Literal["load", "unload"]
    at: float
    keep_alive_s: float | None = None
