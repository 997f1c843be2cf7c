"""The worker processes a pool agent holds: one per loaded model (or replica), started with its
catalog entry's rows, context and prefix cache fixed, stopped with SIGTERM (the worker drains
and exits, so the memory really goes back to the machine).

Processes are started with the harness every mlxq process starts with (worker/ops/cluster.py).
"""

from __future__ import annotations

import signal
import time
from dataclasses import dataclass
from typing import Literal

from shared.queue.config import Settings
from shared.wire.fleet.pool import MIB, HeldModel
from worker.ops.cluster import WORKER, Worker, environment, rss_mb, spawn
from worker.pool.catalog import Found
from worker.pool.spare import Spare

# After SIGTERM, how long past its drain a worker may take to exit before SIGKILL.
EXIT_GRACE_S = 15.0


@dataclass
class Held:
    """One worker process of the pool and where its load stands."""

    model: str
    worker: Worker
    cost: int
    started_at: float
    loaded_at: float | None = None
    stop_sent_at: float | None = None
    evicted: bool = False
    last_used: float = 0.0

    @property
    def state(self) -> Literal["loading", "loaded", "unloading"]:
        if self.stop_sent_at is not None:
            return "unloading"
        return "loading" if self.loaded_at is None else "loaded"

    @property
    def load_s(self) -> float:
        end = self.loaded_at if self.loaded_at is not None else time.time()
        return end - self.started_at

    def view(self, pinned: bool) -> HeldModel:
        rss = int(rss_mb(self.worker.pid) * MIB) if self.worker.proc.poll() is None else 0
        return HeldModel(
            model=self.model,
            worker_id=self.worker.worker_id,
            state=self.state,
            started_at=self.started_at,
            loaded_at=self.loaded_at,
            rss_bytes=rss,
            last_used=self.last_used or None,
            pinned=pinned,
        )

    def stop(self, now: float) -> None:
        """Ask the worker to drain and exit (SIGTERM), once."""
        if self.stop_sent_at is None and self.worker.proc.poll() is None:
            self.worker.proc.send_signal(signal.SIGTERM)
            self.stop_sent_at = now

    def overdue(self, now: float, drain_s: float) -> bool:
        """Told to stop longer ago than its drain and a grace: it is killed."""
        return self.stop_sent_at is not None and now - self.stop_sent_at > drain_s + EXIT_GRACE_S


def worker_env(settings: Settings, found: Found) -> dict[str, str]:
    """A worker's settings for one catalog entry: its model, and its rows, KV budget and prefix
    cache as the entry's cost counted them (the catalog's option fixes them for every request)."""
    cost = found.entry.cost
    env = {"MLXQ_MODEL": found.source, "MLXQ_MODELS_DIR": str(settings.models_dir)}
    if found.entry.kind == "embedding":
        return {**env, "MLXQ_EMBED_BATCH": str(cost.rows)}
    return {
        **env,
        "MLXQ_BATCH_SIZE": str(cost.rows),
        "MLXQ_INTERACTIVE_SLOTS": str(min(settings.interactive_slots, cost.rows - 1)),
        "MLXQ_KV_TOKENS": str(cost.kv_tokens),
        "MLXQ_PREFIX_CACHE_MB": str(max(1, cost.prefix_cache_bytes // MIB)),
    }


def start(settings: Settings, found: Found, now: float, spare: Spare | None) -> Held:
    """The worker of a catalog entry: the spare told its model, if there is one that takes the
    order, else a process started afresh; it is loading until it announces itself."""
    import socket

    env = worker_env(settings, found)
    proc = spare.proc if spare is not None and spare.hand(env) else None
    if proc is None:
        proc = spawn(WORKER, environment(**env))
    worker = Worker(proc, f"{socket.gethostname()}.{proc.pid}", env)
    return Held(found.entry.name, worker, found.entry.cost.total_bytes, now, last_used=now)
