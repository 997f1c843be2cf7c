"""The fleet at one moment, read from Redis: live workers, queues per model and lane, recent jobs.

Workers publish a `WorkerStats` with each heartbeat (worker/runtime/liveness/heartbeat.py), under a
key that expires after a few heartbeats; `read_snapshot` joins them with the heartbeat zsets and
presence channels (the liveness rule of shared/queue/liveness.py: a worker whose heartbeat is old,
or whose process has gone, is not listed, so a dead worker is never shown busy), the RQ queues of
each model, the recent-jobs list (shared/observe/metrics.py) and the machines' pool reports
(shared/queue/pool.py). It makes six pipelined round trips whatever the size of the fleet.
The API's /metrics and /v1/fleet, and `mlxq status`, all read this one snapshot.

The whole snapshot is an operator's view. A caller's own (`FleetSnapshot.of_owner`) keeps the
models and their queues, and of the recent jobs only its own, without the workers and pools:
their ids and hosts are the fleet's, as are other keys' jobs (ids, owners, tokens, errors).
"""

from __future__ import annotations

import time
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from redis import Redis
from rq.job import Job
from rq.utils import str_to_date

from shared.observe.metrics import RECENT_JOBS, JobRecord
from shared.queue import turns
from shared.queue.jobs import LANES, Lane
from shared.queue.keys import Keys
from shared.queue.liveness import alive, report_ttl_ms
from shared.queue.pool import read_reports
from shared.wire.fleet.pool import PoolReport

PLACEMENT = ("followed", "overridden_busy", "overridden_wait", "spread")


class WorkerStats(BaseModel):
    """What a worker reports of itself with each heartbeat."""

    worker_id: str
    host: str
    model: str
    batch_size: int
    running: dict[Lane, int]  # slots in use, per lane of the job they hold
    tokens_per_s: float  # generated over the last minute
    generated_tokens: int  # since the worker started
    started_at: float
    # Prompt tokens this worker looked up in its prefix cache, and found there, since it started.
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    # Speculative decoding: drafted tokens its batch checked, and kept, since it started.
    spec_decode_draft_tokens: int = 0
    spec_decode_accepted_tokens: int = 0
    # When its last job ended (unix s; None: none yet) and the keep_alive that job asked for
    # (None: the model's own): the pool unloads an idle model by them (worker/pool/agent.py).
    last_job_at: float | None = None
    keep_alive_s: float | None = None

    @property
    def slots_used(self) -> int:
        return sum(self.running.values())


def publish_stats(pipe: Any, keys: Keys, stats: WorkerStats, heartbeat_s: float) -> None:
    """Queue the worker's report on `pipe` (`report_ttl_ms`)."""
    ttl_ms = report_ttl_ms(heartbeat_s)
    pipe.set(keys.worker_stats(stats.worker_id), stats.model_dump_json(), px=ttl_ms)


class WorkerView(WorkerStats):
    last_heartbeat: float  # unix s


class LaneView(BaseModel):
    lane: Lane
    waiting: int
    running: int
    # The age of the oldest job at the head of one of its lists (a bulk lane has one per
    # caller: shared/queue/turns.py), the oldest waiting job of a FIFO lane.
    oldest_waiting_s: float | None


class ModelView(BaseModel):
    model: str
    live_workers: int
    slots_used: int
    slots_total: int
    tokens_per_s: float
    lanes: list[LaneView]
    # Prefix-aware placement since the fleet's figures began: followed, overridden_busy,
    # overridden_wait, spread (api/queue/placement.py).
    placement: dict[str, int] = {}


class FleetSnapshot(BaseModel):
    taken_at: float
    workers: list[WorkerView]
    models: list[ModelView]
    recent_jobs: list[JobRecord]
    # Each machine's model pool (shared/queue/pool.py): loaded models, memory against the
    # budget, loads and evictions.
    pools: list[PoolReport] = []
    # "fleet": everything (an operator's view); "owner": one caller's (`of_owner`).
    scope: Literal["fleet", "owner"] = "fleet"

    def of_owner(self, owner: str, recent: int) -> FleetSnapshot:
        """What one caller may see: the models and queues, its own last `recent` jobs with
        their worker left out, no workers, and no placement counts (they move with other keys'
        prompts)."""
        own = [j.model_copy(update={"worker": ""}) for j in self.recent_jobs if j.owner == owner]
        models = [m.model_copy(update={"placement": {}}) for m in self.models]
        update = {
            "workers": [],
            "pools": [],
            "models": models,
            "recent_jobs": own[:recent],
            "scope": "owner",
        }
        return self.model_copy(update=update)


class FleetQuery(BaseModel):
    """The query of GET /v1/fleet: how many recent jobs come with the snapshot."""

    model_config = ConfigDict(extra="forbid")

    recent: Annotated[int, Field(ge=0, le=RECENT_JOBS)] = 20


def _text(value: Any) -> str:
    return bytes(value).decode()


def _enqueued_at(raw: Any) -> float | None:
    return str_to_date(raw).timestamp() if raw else None


def _decode_jobs(rows: list[Any]) -> list[JobRecord]:
    jobs = []
    for row in rows:
        try:
            jobs.append(JobRecord.model_validate_json(row))
        except ValidationError:  # written by another version: left out
            continue
    return jobs


def read_snapshot(
    redis: Redis, keys: Keys, heartbeat_s: float, recent: int = 20, now: float | None = None
) -> FleetSnapshot:
    now = time.time() if now is None else now
    models = [_text(m) for m in redis.zrange(keys.models(), 0, -1)]
    pipe = redis.pipeline(transaction=False)
    waiting = redis.register_script(turns.WAITING)
    for model in models:
        pipe.zrange(keys.workers(model), 0, -1, withscores=True)
        for lane in LANES:  # its depth and the heads of its lists (shared/queue/turns.py)
            turns.add_waiting(pipe, waiting, keys, model, lane)
        pipe.hmget(keys.model_metrics(model), [f"placement_{p}" for p in PLACEMENT])
    if recent:
        pipe.lrange(keys.recent_jobs(), 0, recent - 1)
    per_model = pipe.execute()
    recent_rows = per_model.pop() if recent else []
    step = 2 + len(LANES)
    beats = {
        _text(worker): float(score)
        for rows in per_model[::step]
        for worker, score in rows
        if alive(float(score), 1, now, heartbeat_s)
    }
    workers = _live_workers(redis, keys, beats, now, heartbeat_s)
    heads = [per_model[i + 1 : i + step - 1] for i in range(0, len(per_model), step)]
    views = _model_views(redis, models, heads, workers, now)
    for view, counts in zip(views, per_model[step - 1 :: step], strict=True):
        view.placement = {p: int(c or 0) for p, c in zip(PLACEMENT, counts, strict=True)}
    return FleetSnapshot(
        taken_at=now,
        workers=workers,
        models=views,
        recent_jobs=_decode_jobs(recent_rows),
        pools=read_reports(redis, keys, heartbeat_s),
    )


def _live_workers(
    redis: Redis, keys: Keys, beats: dict[str, float], now: float, heartbeat_s: float
) -> list[WorkerView]:
    if not beats:
        return []
    ids = sorted(beats)
    pipe = redis.pipeline(transaction=False)
    pipe.pubsub_numsub(*[keys.presence(w) for w in ids])
    for worker in ids:
        pipe.get(keys.worker_stats(worker))
    counts, *reports = pipe.execute()
    subscribers = {_text(channel): int(n) for channel, n in counts}
    views = []
    for worker, report in zip(ids, reports, strict=True):
        present = subscribers.get(keys.presence(worker), 0)
        if report is None or not alive(beats[worker], present, now, heartbeat_s):
            continue
        stats = WorkerStats.model_validate_json(report)
        views.append(WorkerView(**stats.model_dump(), last_heartbeat=beats[worker]))
    return views


def _model_views(
    redis: Redis,
    models: list[str],
    heads: list[list[Any]],
    workers: list[WorkerView],
    now: float,
) -> list[ModelView]:
    pipe = redis.pipeline(transaction=False)
    for lanes in heads:
        for _, *lists_heads in lanes:
            for head in lists_heads:
                pipe.hget(Job.key_for(_text(head)), "enqueued_at")
    enqueued = iter(pipe.execute())
    views = []
    for model, lanes in zip(models, heads, strict=True):
        serving = [w for w in workers if w.model == model]
        lane_views = []
        for lane, (depth, *lists_heads) in zip(LANES, lanes, strict=True):
            times = [_enqueued_at(next(enqueued)) for _ in lists_heads]
            at = min((t for t in times if t is not None), default=None)
            running = sum(w.running.get(lane, 0) for w in serving)
            age = None if at is None else max(0.0, now - at)
            lane_views.append(
                LaneView(lane=lane, waiting=depth, running=running, oldest_waiting_s=age)
            )
        views.append(
            ModelView(
                model=model,
                live_workers=len(serving),
                slots_used=sum(w.slots_used for w in serving),
                slots_total=sum(w.batch_size for w in serving),
                tokens_per_s=round(sum(w.tokens_per_s for w in serving), 2),
                lanes=lane_views,
            )
        )
    return views
