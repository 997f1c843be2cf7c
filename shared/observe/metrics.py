"""The fleet's request figures in Redis: what a worker records as each job ends, and how a reader
(an API process's /metrics, `mlxq status`) reads them back. Writer and reader side by side.

Every worker adds to one hash per model (`{ns}:metrics:{model}`, keys.py), once per finished
job, in one pipeline (`record_job`): counters (prompt, generation and prefix-cache tokens,
requests by finish reason) and one bucket per histogram. So any reader sees the whole fleet's
cumulative figures, whichever worker ran which job and however many API processes there are;
nothing is written per token. A bucket field counts the observations that fell into that bucket
alone (`{histogram}:{i}`, i == len(bounds) for +Inf); `Histogram.cumulative` turns them into
Prometheus' cumulative buckets. The same pipeline pushes the job's `JobRecord` onto the list of
recent jobs (the fleet view's "last jobs").
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel

from shared.queue.jobs import Lane
from shared.queue.keys import Keys

# The recent-jobs list keeps this many records.
RECENT_JOBS = 50

# Bucket bounds (seconds), after vLLM's.
# fmt: off
_LATENCY = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
            120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
_TTFT = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
         10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
_TPOT = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
         20.0, 40.0, 80.0)
# fmt: on
HISTOGRAMS: dict[str, tuple[float, ...]] = {
    "time_to_first_token_seconds": _TTFT,
    "time_per_output_token_seconds": _TPOT,
    "e2e_request_latency_seconds": _LATENCY,
    "request_queue_time_seconds": _LATENCY,
}
COUNTERS = (
    "prompt_tokens",
    "generation_tokens",
    "prefix_cache_queries",
    "prefix_cache_hits",
    # Prefix-aware placement (api/queue/placement.py, worker/runtime/intake/placed_take.py).
    "placement_followed",
    "placement_overridden_busy",
    "placement_overridden_wait",
    "placement_spread",
)
_SUCCESS = "request_success:"  # + finish reason


class JobRecord(BaseModel):
    """One finished job, as its worker saw it (unix times, seconds)."""

    job_id: str
    model: str
    lane: Lane
    worker: str
    owner: str | None = None  # the hashed API key owner (api/http/auth.py), never the key
    finish_reason: str  # stop, length, tool_calls, cancelled, error
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    enqueued_at: float
    started_at: float
    first_token_at: float | None
    ended_at: float
    error: str | None = None  # why it failed (finish_reason "error"), as its client was told

    def log_fields(self) -> dict[str, object]:
        """The job's structured log line (shared/observe/logs.py): ids, counts and times, no
        text. A failed job's error stays out: it may quote the request (a chat template's
        refusal, an exception's text); the fleet view shows it to the job's owner."""
        times = {"enqueued_at", "started_at", "first_token_at", "ended_at"}
        return {
            **self.model_dump(exclude={*times, "error"}),
            "queue_s": self.queue_s,
            "ttft_s": self.ttft_s,
            "duration_s": self.e2e_s,
        }

    @property
    def status(self) -> Literal["completed", "cancelled", "failed"]:
        if self.finish_reason == "cancelled":
            return "cancelled"
        return "failed" if self.finish_reason == "error" else "completed"

    @property
    def queue_s(self) -> float:
        return max(0.0, self.started_at - self.enqueued_at)

    @property
    def ttft_s(self) -> float | None:
        """From enqueue to the first token, as vLLM counts it from the request's arrival."""
        return None if self.first_token_at is None else self.first_token_at - self.enqueued_at

    @property
    def e2e_s(self) -> float:
        return self.ended_at - self.enqueued_at

    @property
    def time_per_output_token_s(self) -> float | None:
        """The mean gap between this job's tokens after the first."""
        if self.first_token_at is None or self.completion_tokens < 2:
            return None
        return (self.ended_at - self.first_token_at) / (self.completion_tokens - 1)

    def observations(self) -> dict[str, float]:
        seen = {
            "time_to_first_token_seconds": self.ttft_s,
            "time_per_output_token_seconds": self.time_per_output_token_s,
            "e2e_request_latency_seconds": self.e2e_s,
            "request_queue_time_seconds": self.queue_s,
        }
        return {name: value for name, value in seen.items() if value is not None}


def record_job(pipe: Any, keys: Keys, record: JobRecord) -> None:
    """Queue the job's figures and record on `pipe` (a redis pipeline; the caller executes)."""
    key = keys.model_metrics(record.model)
    pipe.hincrby(key, "prompt_tokens", record.prompt_tokens)
    pipe.hincrby(key, "generation_tokens", record.completion_tokens)
    pipe.hincrby(key, "prefix_cache_queries", record.prompt_tokens)
    pipe.hincrby(key, "prefix_cache_hits", record.cached_tokens)
    pipe.hincrby(key, _SUCCESS + record.finish_reason, 1)
    for name, value in record.observations().items():
        pipe.hincrby(key, f"{name}:{bisect_left(HISTOGRAMS[name], value)}", 1)
        pipe.hincrbyfloat(key, f"{name}:sum", value)
    pipe.lpush(keys.recent_jobs(), record.model_dump_json())
    pipe.ltrim(keys.recent_jobs(), 0, RECENT_JOBS - 1)


@dataclass(frozen=True)
class Histogram:
    bounds: tuple[float, ...]
    counts: tuple[int, ...]  # per bucket, +Inf last; not cumulative
    total: float

    def cumulative(self) -> list[tuple[str, float]]:
        """Prometheus' buckets: (upper bound, observations at or below it), +Inf last."""
        running, out = 0, []
        for bound, count in zip([*map(str, self.bounds), "+Inf"], self.counts, strict=True):
            running += count
            out.append((bound, float(running)))
        return out


@dataclass(frozen=True)
class ModelFigures:
    """A model's cumulative figures, read back from its hash."""

    counters: dict[str, int]
    finished: dict[str, int]  # finish reason -> requests
    histograms: dict[str, Histogram]

    @classmethod
    def decode(cls, fields: dict[bytes, bytes]) -> ModelFigures:
        raw = {k.decode(): v.decode() for k, v in fields.items()}
        counters = {name: int(raw.get(name, 0)) for name in COUNTERS}
        finished = {
            k.removeprefix(_SUCCESS): int(v) for k, v in raw.items() if k.startswith(_SUCCESS)
        }
        histograms = {
            name: Histogram(
                bounds,
                tuple(int(raw.get(f"{name}:{i}", 0)) for i in range(len(bounds) + 1)),
                float(raw.get(f"{name}:sum", 0.0)),
            )
            for name, bounds in HISTOGRAMS.items()
        }
        return cls(counters, finished, histograms)
