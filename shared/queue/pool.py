"""The model pools in Redis: what each machine's pool agent publishes and what the API reads.

A pool agent (worker/pool/agent.py) beats like a worker: `{ns}:pools` scores its machine with
its last beat and `{ns}:pool:{machine}` holds its `PoolReport`, expiring a few beats after the
agent stops. A pool is live while its beat is younger than LIVE_FACTOR intervals
(shared/queue/liveness.py's rule for heartbeats), and at least POOL_GRACE_S. The catalog of
the fleet is the union of the live pools' catalogs: the API admits a job for a catalog model
that no worker holds yet (`Catalog.admits`), lists the catalog with each model's state
(api/routes/models.py), and ends the waits of jobs whose model failed to load
(`read_failures`, api/queue/watch.py).

One load at a time per model in the fleet: an agent takes `{ns}:loading:{model}` (SET NX,
expiring after the load's time limit) before it starts the model's worker, and drops it once
the worker serves or its start failed.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError
from redis import Redis

from shared.queue.keys import Keys
from shared.queue.liveness import LIVE_FACTOR, report_ttl_ms
from shared.wire.errors import InvalidRequestError
from shared.wire.fleet.catalog import ModelState
from shared.wire.fleet.pool import MIB, LoadFailure, PoolOrder, PoolReport

# A pool counts as live this long at least after its last beat, whatever the heartbeat: an agent
# on a loaded machine may miss a few beats while a model loads, and a pool taken for gone ends
# the waits of the jobs it was loading for (api/queue/watch.py).
POOL_GRACE_S = 10.0


def _window_s(heartbeat_s: float) -> float:
    return max(LIVE_FACTOR * heartbeat_s, POOL_GRACE_S)


def publish_report(pipe: Any, keys: Keys, report: PoolReport, heartbeat_s: float) -> None:
    """Queue the machine's beat and report on `pipe`; the report outlives the live window."""
    pipe.zadd(keys.pools(), {report.machine: time.time()})
    ttl_ms = int(_window_s(heartbeat_s) * 1000) + report_ttl_ms(heartbeat_s)
    pipe.set(keys.pool(report.machine), report.model_dump_json(), px=ttl_ms)


def retire_pool(redis: Redis, keys: Keys, machine: str) -> None:
    pipe = redis.pipeline(transaction=False)
    pipe.zrem(keys.pools(), machine)
    pipe.delete(keys.pool(machine))
    pipe.execute()


def read_reports(redis: Redis, keys: Keys, heartbeat_s: float) -> list[PoolReport]:
    """The live pools' reports, in two round trips."""
    oldest = time.time() - _window_s(heartbeat_s)
    found: Any = redis.zrangebyscore(keys.pools(), oldest, "+inf")
    machines = [bytes(m).decode() for m in found]
    if not machines:
        return []
    raw: Any = redis.mget([keys.pool(m) for m in machines])
    reports = []
    for report in raw:
        if report is None:
            continue
        try:
            reports.append(PoolReport.model_validate_json(report))
        except ValidationError:  # written by another version: left out
            continue
    return reports


@dataclass(frozen=True)
class Catalog:
    """The fleet's catalog as the live pools publish it."""

    reports: list[PoolReport]

    def models(self) -> list[str]:
        return sorted({e.name for r in self.reports for e in r.catalog})

    def machines(self, model: str) -> list[str]:
        return sorted(r.machine for r in self.reports if r.entry(model) is not None)

    def created(self, model: str) -> int | None:
        return min((e.created for r in self.reports if (e := r.entry(model))), default=None)

    def state(self, model: str) -> ModelState:
        """Loading while a pool loads it, else not loaded (a live worker makes it loaded)."""
        for r in self.reports:
            if any(h.model == model and h.state == "loading" for h in r.held):
                return "loading"
        return "not_loaded"

    def admits(self, model: str) -> bool:
        """Whether a job for `model`, which no live worker serves, may wait for a pool to load
        it: some live pool has it in its catalog and a budget it fits in. A 400 naming the
        budget's setting when it fits none (it would wait forever)."""
        entries = [(r, r.entry(model)) for r in self.reports]
        found = [(r, e) for r, e in entries if e is not None]
        if not found:
            return False
        if any(e.cost.total_bytes <= r.budget_bytes for r, e in found):
            return True
        need = min(e.cost.total_bytes for _, e in found) // MIB
        budget = max(r.budget_bytes for r, _ in found) // MIB
        raise InvalidRequestError(
            f"The model '{model}' needs {need} MiB loaded (weights, KV cache, prefix cache and "
            f"headroom), more than any machine's pool budget ({budget} MiB): raise "
            "MLXQ_POOL_BUDGET_MB (or MLXQ_POOL_BUDGET_SHARE), or lower the model's rows or "
            "context in MLXQ_CATALOG.",
            param="model",
        )


def read_catalog(redis: Redis, keys: Keys, heartbeat_s: float) -> Catalog:
    return Catalog(read_reports(redis, keys, heartbeat_s))


# Loads: one at a time per model in the fleet, and what a failed one leaves behind.


def claim_load(redis: Redis, keys: Keys, model: str, machine: str, ttl_s: float) -> bool:
    """Whether `machine` holds the model's one load of the fleet: claimed now, or by it
    already (it waits for memory it evicted: worker/pool/agent.py)."""
    key = keys.loading(model)
    if redis.set(key, machine, nx=True, px=int(ttl_s * 1000)):
        return True
    held: Any = redis.get(key)
    return held is not None and bytes(held).decode() == machine


def end_load(redis: Redis, keys: Keys, model: str) -> None:
    redis.delete(keys.loading(model))


# A failed load is kept this long: long enough for every API process's watch to see it.
FAILURE_TTL_S = 600


def record_failure(redis: Redis, keys: Keys, failure: LoadFailure) -> None:
    redis.set(keys.load_failed(failure.model), failure.model_dump_json(), ex=FAILURE_TTL_S)


def read_failures(redis: Redis, keys: Keys, models: list[str]) -> dict[str, LoadFailure]:
    """The last failed load of each of `models` that has one, in one read."""
    if not models:
        return {}
    raw: Any = redis.mget([keys.load_failed(m) for m in models])
    found = {}
    for model, value in zip(models, raw, strict=True):
        if value is not None:
            try:
                found[model] = LoadFailure.model_validate_json(value)
            except ValidationError:
                continue
    return found


# Operators: pins and orders (`mlxq pin|load|unload`).


def pin(redis: Redis, keys: Keys, model: str, pinned: bool) -> None:
    if pinned:
        redis.sadd(keys.pins(), model)
    else:
        redis.srem(keys.pins(), model)


def give_order(redis: Redis, keys: Keys, model: str, order: PoolOrder) -> None:
    keys.loading(model)  # checks the name before it becomes a field
    redis.hset(keys.pool_orders(), model, order.model_dump_json())


def read_orders(redis: Redis, keys: Keys) -> dict[str, PoolOrder]:
    raw: Any = redis.hgetall(keys.pool_orders())
    orders = {}
    for model, value in raw.items():
        try:
            orders[bytes(model).decode()] = PoolOrder.model_validate_json(value)
        except ValidationError:
            continue
    return orders


def drop_order(redis: Redis, keys: Keys, model: str) -> None:
    redis.hdel(keys.pool_orders(), model)
