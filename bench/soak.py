"""`python -m bench.soak --minutes 10`: mixed load with faults, on loopback, then a report.

What runs: a private redis-server keeping its data on disk (an append-only file, as a queue in
production would), the API under gunicorn and `--workers` workers on the real default model,
all on this machine (worker/ops/cluster.py). For the whole run:
- `--clients` interactive clients send streaming and non-streaming chat and text completions,
  and now and then hang up mid-stream (bench/traffic.py);
- a producer puts a bulk job (a stand-in for a background response) on the bulk
  queue every `--bulk-every` seconds, as the Batch and Responses APIs do (Broker.submit_bulk);
- every `--kill-every` seconds the oldest worker is killed (SIGKILL) and a new one started, as
  its supervisor would; once, at `--redis-at` of the run, Redis is stopped and started again.
Then the clients stop, bulk jobs get `--settle` seconds to finish, and the report is written as
JSON (`--out`) and printed: requests sent / completed / failed with a clear error / hung /
unclear; bulk jobs enqueued / finished exactly once / failed / lost / duplicated; the RSS of the
API and of each worker at its first and last sample. `hung`, `unclear`, `lost` and `duplicated`
must be 0.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import signal
import sys
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from redis.exceptions import RedisError
from rq.job import Job
from rq.results import Result
from rq.serializers import JSONSerializer

from api.queue.broker import standalone
from bench import traffic
from shared.queue.config import Settings
from shared.queue.jobs import GenerationJob
from shared.wire.errors import BackendUnavailableError
from shared.wire.events import DoneEvent, decode_event
from worker.ops.cluster import Cluster, rss_mb

WORKER_ENV = {
    "MLXQ_BATCH_SIZE": "8",
    "MLXQ_QUEUE_TIMEOUT_S": "30",
    "MLXQ_RUN_LIMIT_S": "60",
    "MLXQ_DRAIN_TIMEOUT_S": "10",
    "MLXQ_WATCHDOG_S": "30",
    "MLXQ_BULK_RETRIES": "3",
}


@dataclass
class Report:
    minutes: float
    config: dict[str, Any]
    requests: dict[str, int] = field(default_factory=dict)
    errors_by_code: dict[str, int] = field(default_factory=dict)
    unclear: dict[str, int] = field(default_factory=dict)
    bulk: dict[str, int] = field(default_factory=dict)
    bulk_problems: dict[str, list[str]] = field(default_factory=dict)
    rss_mb: dict[str, dict[str, float]] = field(default_factory=dict)
    timeline: list[str] = field(default_factory=list)


@dataclass
class Tally:
    """What the clients saw, counted under one lock."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    kinds: Counter[str] = field(default_factory=Counter)
    errors: Counter[str] = field(default_factory=Counter)
    unclear: Counter[str] = field(default_factory=Counter)

    def add(self, outcome: traffic.Outcome) -> None:
        with self.lock:
            self.kinds[outcome.kind] += 1
            if outcome.kind == "error":
                self.errors[outcome.detail] += 1
            elif outcome.kind in ("unclear", "hung"):
                self.unclear[outcome.detail] += 1


class Soak:
    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.out = Path(args.out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.cluster = Cluster(
            namespace="mlxqsoak",
            heartbeat_s=args.heartbeat,
            env=WORKER_ENV,
            data_dir=self.out / "soak-redis",
            logs=self.out,
        )
        self.tally = Tally()
        self.stop = threading.Event()
        self.started = 0.0
        self.timeline: list[str] = []
        self.bulk_ids: list[str] = []
        self.rss: dict[str, dict[str, float]] = {}

    def note(self, text: str) -> None:
        line = f"{time.monotonic() - self.started:7.1f} s  {text}"
        self.timeline.append(line)
        print(line, flush=True)

    def run(self) -> Report:
        self.started = time.monotonic()
        self.cluster.start(workers=self.args.workers)
        self.note(f"started: Redis, the API, {self.args.workers} workers; load begins")
        self.started = time.monotonic()
        threads = [
            threading.Thread(target=self._client, args=(i,)) for i in range(self.args.clients)
        ]
        threads += [
            threading.Thread(target=self._bulk_producer),
            threading.Thread(target=self._rss),
        ]
        for t in threads:
            t.start()
        try:
            self._chaos(self.args.minutes * 60)
        finally:
            self.stop.set()
            for t in threads:
                t.join()
        self.note("load stopped; letting bulk jobs settle")
        bulk, problems = self._settle()
        self._sample_rss()
        self.cluster.stop()
        return self._report(bulk, problems)

    def _client(self, index: int) -> None:
        rng = random.Random(index)
        while not self.stop.is_set():
            _, client = traffic.KINDS[traffic.pick(rng)]
            outcome = client(self.cluster.api_url, rng)
            self.tally.add(outcome)
            if outcome.kind == "error":  # back off as a well-behaved client does
                self.stop.wait(max(outcome.retry_after_s, 0.5))

    def _bulk_producer(self) -> None:
        settings = Settings(
            redis_url=self.cluster.redis_url,
            namespace=self.cluster.namespace,
            heartbeat_s=self.args.heartbeat,
            bulk_retries=3,
        )
        broker = standalone(settings)
        n = 0
        while not self.stop.wait(self.args.bulk_every):
            n += 1
            job = GenerationJob(
                job_id=f"resp_soak{n:05d}",
                model=self.cluster.model,
                prompt=random.choice(traffic.PROMPTS),
                max_tokens=16,
                replay_ttl_s=3600,  # a background response: its event log is its record
            )
            # Redis down: a batch runner retries later; it counts only if it got in.
            with contextlib.suppress(BackendUnavailableError):
                broker.submit_bulk([job])
            self.bulk_ids.append(job.job_id)

    def _chaos(self, seconds: float) -> None:
        deadline = self.started + seconds
        next_kill = time.monotonic() + self.args.kill_every
        redis_at = self.started + seconds * self.args.redis_at if self.args.redis_at else None
        while time.monotonic() < deadline:
            now = time.monotonic()
            self._supervise()
            if now >= next_kill:
                next_kill += self.args.kill_every
                victim = self.cluster.workers[0]
                self.cluster.kill_worker(victim, signal.SIGKILL)
                self.cluster.start_worker(wait=False)
                self.note(f"killed worker {victim.worker_id} (SIGKILL), started a new one")
            if redis_at is not None and now >= redis_at:
                redis_at = None
                self.cluster.stop_redis(signal.SIGTERM)
                self.note("Redis stopped")
                time.sleep(self.args.redis_down)
                self.cluster.start_redis()
                self.note("Redis started again (same data)")
            time.sleep(0.2)

    def _supervise(self) -> None:
        """Restart a worker that exited on its own, as launchd or systemd would."""
        for worker in [w for w in self.cluster.workers if w.proc.poll() is not None]:
            self.cluster.workers.remove(worker)
            self.cluster.start_worker(wait=False)
            self.note(f"worker {worker.worker_id} exited ({worker.proc.returncode}); restarted")

    def _rss(self) -> None:
        while not self.stop.wait(5.0):
            self._sample_rss()

    def _sample_rss(self) -> None:
        """RSS of the API and of each worker, from when it serves (its model loaded)."""
        pids = {f"api.{pid}": pid for pid in self.cluster.api_worker_pids()}
        with contextlib.suppress(RedisError):
            serving = self.cluster.redis().zrange(
                self.cluster.keys.workers(self.cluster.model), 0, -1
            )
            ids = {i.decode() if isinstance(i, bytes) else str(i) for i in serving}
            pids |= {f"worker.{w.pid}": w.pid for w in self.cluster.workers if w.worker_id in ids}
        for name, pid in pids.items():
            try:
                mb = round(rss_mb(pid), 1)
            except (OSError, ValueError):
                continue
            if not mb:
                continue  # it just exited
            sample = self.rss.setdefault(name, {"first": mb, "last": mb, "max": mb})
            sample["last"] = mb
            sample["max"] = max(sample["max"], mb)

    def _settle(self) -> tuple[dict[str, int], dict[str, list[str]]]:
        redis = self.cluster.redis()
        deadline = time.monotonic() + self.args.settle
        jobs: dict[str, Job | None] = {}
        while True:
            jobs = {i: _fetch(redis, i) for i in self.bulk_ids}
            pending = [i for i, j in jobs.items() if j is not None and _status(j) not in _DONE]
            if not pending or time.monotonic() > deadline:
                break
            time.sleep(1.0)
        counts: Counter[str] = Counter()
        problems: dict[str, list[str]] = {}
        for job_id, job in jobs.items():
            if job is None:
                counts["never_enqueued (Redis was down)"] += 1
                continue
            counts["enqueued"] += 1
            verdict = _verdict(redis, self.cluster, job_id, job)
            counts[verdict] += 1
            counts["retried"] += int(job.meta.get("attempt", 1)) > 1
            if verdict in ("lost", "duplicated"):
                problems.setdefault(verdict, []).append(job_id)
        return dict(counts), problems

    def _report(self, bulk: dict[str, int], problems: dict[str, list[str]]) -> Report:
        kinds = self.tally.kinds
        requests = {"sent": sum(kinds.values())}
        requests |= {k: kinds[k] for k in ("completed", "error", "left", "hung", "unclear")}
        config = {k: v for k, v in vars(self.args).items() if k != "out"}
        return Report(
            minutes=self.args.minutes,
            config=config | {"worker_env": WORKER_ENV},
            requests=requests,
            errors_by_code=dict(self.tally.errors),
            unclear=dict(self.tally.unclear),
            bulk=bulk,
            bulk_problems=problems,
            rss_mb=self.rss,
            timeline=self.timeline,
        )


_DONE = {"finished", "failed", "canceled", "stopped"}


def _fetch(redis: Any, job_id: str) -> Job | None:
    try:
        return Job.fetch(job_id, connection=redis, serializer=JSONSerializer)
    except Exception:
        return None


def _status(job: Job) -> str:
    return str(job.get_status(refresh=True).value)


def _verdict(redis: Any, cluster: Cluster, job_id: str, job: Job) -> str:
    status = _status(job)
    if status == "failed":
        return "failed (clear error)"
    if status != "finished":
        return "lost"
    events = [decode_event(e) for e in redis.lrange(cluster.keys.replay(job_id), 0, -1)]
    done = sum(isinstance(e, DoneEvent) for e in events)
    wins = sum(r.type == Result.Type.SUCCESSFUL for r in job.results())
    if done > 1 or wins > 1:
        return "duplicated"
    return "finished exactly once" if done == 1 else "lost"


def table(report: Report) -> str:
    rows = [("requests " + k, str(v)) for k, v in report.requests.items()]
    rows += [("  error " + k, str(v)) for k, v in sorted(report.errors_by_code.items())]
    rows += [("  unclear/hung: " + k, str(v)) for k, v in sorted(report.unclear.items())]
    rows += [("bulk " + k, str(v)) for k, v in sorted(report.bulk.items())]
    rows += [
        (f"RSS {name} (MB)", f"{s['first']} -> {s['last']} (max {s['max']})")
        for name, s in sorted(report.rss_mb.items())
    ]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__.split("\n")[0])
    p.add_argument("--minutes", type=float, default=10.0)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--clients", type=int, default=6)
    p.add_argument("--heartbeat", type=float, default=1.0, help="MLXQ_HEARTBEAT_S")
    p.add_argument("--kill-every", type=float, default=120.0, help="seconds between kills")
    p.add_argument("--redis-at", type=float, default=0.5, help="fraction of the run; 0: never")
    p.add_argument("--redis-down", type=float, default=3.0, help="seconds Redis stays down")
    p.add_argument("--bulk-every", type=float, default=2.0, help="seconds between bulk jobs")
    p.add_argument("--settle", type=float, default=180.0, help="seconds for bulk jobs to end")
    p.add_argument(
        "--out", default="bench/out", help="folder for soak.json, api.log and worker.log"
    )
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    report = Soak(args).run()
    path = Path(args.out) / "soak.json"
    path.write_text(json.dumps(asdict(report), indent=2))
    print(table(report))
    print(f"report: {path}")
    bad = report.requests["hung"] + report.requests["unclear"]
    bad += report.bulk.get("lost", 0) + report.bulk.get("duplicated", 0)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
