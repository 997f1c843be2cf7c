"""The fleet over the last quarter of an hour: one sample every few heartbeats, kept in Redis so
that a page opened now shows the minutes before it was opened.

Writer and reader side by side. Every worker's heartbeat thread calls `sample_if_due` after its
beat; the first worker whose `SET NX` on `{ns}:history:turn` succeeds (the key lives one sample
period) takes the sample, so the fleet writes one sample per period however many workers it has,
and none while no worker lives. A sample is read from what the fleet already records: the fleet
snapshot (shared/observe/fleet.py: live workers, queue depth per lane, the recent jobs) and the
previous sample. Per model it holds:

- tokens/s: the tokens the model's workers generated since the previous sample (each worker's
  own counter, `WorkerStats.generated_tokens`) over the time between the two;
- TTFT and queue time, p50 and p95, over the jobs that ended since the previous sample, from
  their `JobRecord`s. Only the newest `RECENT_JOBS` records are kept, so in a period where more
  jobs end than that the percentiles are those of the newest ones (`jobs` says how many);
- waiting and running jobs per lane, and live workers.

Samples go onto the list `{ns}:history` (newest first), trimmed to `MAX_SAMPLES` and expiring
`WINDOW_S` after the last one: a fleet gone for a quarter of an hour leaves nothing. Nothing here
runs on the per-token path or per job: it costs one worker a few round trips per period.
"""

from __future__ import annotations

import math
import time
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from redis import Redis

from shared.observe.fleet import FleetSnapshot, ModelView, read_snapshot
from shared.observe.metrics import RECENT_JOBS, JobRecord
from shared.queue.jobs import Lane
from shared.queue.keys import Keys

WINDOW_S = 15 * 60
# A sample every this many heartbeats (6 s with the default heartbeat of 2 s).
SAMPLE_BEATS = 3
# Enough for the window at the shortest period a test fleet uses (a heartbeat of 0.5 s).
MAX_SAMPLES = 600
# A previous sample older than this many periods is too old to difference against (the fleet
# was gone): the rate is left unknown rather than averaged over the gap.
GAP_PERIODS = 4


def sample_period_s(heartbeat_s: float) -> float:
    return SAMPLE_BEATS * heartbeat_s


class ModelSample(BaseModel):
    model: str
    workers: int
    slots_used: int
    slots_total: int
    tokens_per_s: float | None  # None: no earlier sample to difference against
    jobs: int  # ended since the previous sample (at most RECENT_JOBS counted)
    ttft_p50_s: float | None
    ttft_p95_s: float | None
    queue_p50_s: float | None
    queue_p95_s: float | None
    waiting: dict[Lane, int]
    running: dict[Lane, int]


class FleetSample(BaseModel):
    at: float  # unix s
    workers: int
    models: list[ModelSample]


class StoredSample(BaseModel):
    """A sample as kept in Redis: with the counters the next sample differences against."""

    sample: FleetSample
    generated: dict[str, int]  # worker id -> tokens generated since it started


class FleetHistory(BaseModel):
    """The answer of GET /v1/fleet/history: samples oldest first."""

    window_s: float
    sample_s: float
    samples: list[FleetSample]


class HistoryQuery(BaseModel):
    """The query of GET /v1/fleet/history: only samples taken after `since` (unix s)."""

    model_config = ConfigDict(extra="forbid")

    since: Annotated[float, Field(ge=0, allow_inf_nan=False)] | None = None


def percentile(values: list[float], fraction: float) -> float | None:
    """Nearest-rank percentile; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(fraction * len(ordered)) - 1)]


def sample_if_due(redis: Redis, keys: Keys, worker_id: str, heartbeat_s: float) -> bool:
    """Take the fleet's sample if it is this worker's turn; True if it took one."""
    period_ms = int(sample_period_s(heartbeat_s) * 1000)
    if not redis.set(keys.history_turn(), worker_id, nx=True, px=period_ms):
        return False
    previous = _latest(redis, keys)
    snapshot = read_snapshot(redis, keys, heartbeat_s, recent=RECENT_JOBS)
    stored = take_sample(snapshot, previous, sample_period_s(heartbeat_s))
    pipe = redis.pipeline(transaction=False)
    pipe.lpush(keys.history(), stored.model_dump_json())
    pipe.ltrim(keys.history(), 0, MAX_SAMPLES - 1)
    pipe.expire(keys.history(), WINDOW_S)
    pipe.execute()
    return True


def _latest(redis: Redis, keys: Keys) -> StoredSample | None:
    raw = redis.lindex(keys.history(), 0)
    if raw is None:
        return None
    try:
        return StoredSample.model_validate_json(raw)
    except ValidationError:  # written by another version: start afresh
        return None


def take_sample(
    snapshot: FleetSnapshot, previous: StoredSample | None, period_s: float
) -> StoredSample:
    """The sample of `snapshot`, differenced against the previous one where it is recent."""
    now = snapshot.taken_at
    if previous is not None and not 0 < now - previous.sample.at <= GAP_PERIODS * period_s:
        previous = None
    since = now - period_s if previous is None else previous.sample.at
    ended = [j for j in snapshot.recent_jobs if since < j.ended_at <= now]
    models = [_model_sample(view, snapshot, previous, ended) for view in snapshot.models]
    sample = FleetSample(at=now, workers=len(snapshot.workers), models=models)
    generated = {w.worker_id: w.generated_tokens for w in snapshot.workers}
    return StoredSample(sample=sample, generated=generated)


def _model_sample(
    view: ModelView, snapshot: FleetSnapshot, previous: StoredSample | None, ended: list[JobRecord]
) -> ModelSample:
    jobs = [j for j in ended if j.model == view.model]
    ttft = [j.ttft_s for j in jobs if j.ttft_s is not None]
    queue = [j.queue_s for j in jobs]
    return ModelSample(
        model=view.model,
        workers=view.live_workers,
        slots_used=view.slots_used,
        slots_total=view.slots_total,
        tokens_per_s=_tokens_per_s(view.model, snapshot, previous),
        jobs=len(jobs),
        ttft_p50_s=percentile(ttft, 0.5),
        ttft_p95_s=percentile(ttft, 0.95),
        queue_p50_s=percentile(queue, 0.5),
        queue_p95_s=percentile(queue, 0.95),
        waiting={lane.lane: lane.waiting for lane in view.lanes},
        running={lane.lane: lane.running for lane in view.lanes},
    )


def _tokens_per_s(
    model: str, snapshot: FleetSnapshot, previous: StoredSample | None
) -> float | None:
    """What the model's live workers generated since the previous sample, per second. A worker
    that started since then counts all it generated; one that was not in the previous sample
    but is older counts nothing (its earlier count is unknown)."""
    if previous is None:
        return None
    then = previous.sample.at
    tokens = 0
    for worker in snapshot.workers:
        if worker.model != model:
            continue
        before = previous.generated.get(worker.worker_id)
        if before is None:
            before = 0 if worker.started_at >= then else worker.generated_tokens
        tokens += max(0, worker.generated_tokens - before)
    return round(tokens / (snapshot.taken_at - then), 2)


def read_history(
    redis: Redis, keys: Keys, heartbeat_s: float, since: float | None = None
) -> FleetHistory:
    """The samples of the last WINDOW_S (and after `since`), oldest first."""
    floor = max(time.time() - WINDOW_S, since or 0.0)
    samples = []
    for raw in redis.lrange(keys.history(), 0, -1):
        try:
            sample = StoredSample.model_validate_json(raw).sample
        except ValidationError:
            continue
        if sample.at <= floor:
            break  # newest first: the rest are older still
        samples.append(sample)
    samples.reverse()
    return FleetHistory(window_s=WINDOW_S, sample_s=sample_period_s(heartbeat_s), samples=samples)
