"""`mlxq status`: the fleet at a glance, read straight from Redis (shared/observe/fleet.py).

It reads Redis, not the API: it works with no API process running, from any machine that
reaches REDIS_URL, and shows exactly what the API's /metrics and /v1/fleet show. `--json`
prints the snapshot for scripts (one JSON object a line under `--watch`); `--watch` redraws
it in place every `--interval` seconds (rich's Live).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from datetime import datetime

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table

from shared.observe.fleet import (
    PLACEMENT,
    FleetSnapshot,
    LaneView,
    ModelView,
    WorkerView,
    read_snapshot,
)
from shared.queue.config import Settings
from shared.queue.connection import connect
from shared.queue.jobs import LANES
from shared.queue.keys import Keys


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}s"


def _lane(lane: LaneView) -> str:
    oldest = "" if lane.oldest_waiting_s is None else f" (oldest {lane.oldest_waiting_s:.1f}s)"
    return f"{lane.waiting} waiting, {lane.running} running{oldest}"


def _prefix_cache(w: WorkerView) -> str:
    """Prompt tokens found in the worker's prefix cache and not, since it started."""
    misses = w.prefix_cache_queries - w.prefix_cache_hits
    return f"{w.prefix_cache_hits} / {misses}"


def _placement(m: ModelView) -> str:
    return " / ".join(str(m.placement.get(p, 0)) for p in PLACEMENT)


def _workers(snapshot: FleetSnapshot) -> Table:
    table = Table(title=f"workers: {len(snapshot.workers)} live", title_justify="left")
    for column in ("worker", "host", "model", "slots", "tok/s (1 min)", "last heartbeat"):
        table.add_column(column)
    table.add_column("prefix cache hit / miss tokens")
    for w in snapshot.workers:
        ago = f"{snapshot.taken_at - w.last_heartbeat:.1f}s ago"
        slots = f"{w.slots_used}/{w.batch_size}"
        table.add_row(
            w.worker_id, w.host, w.model, slots, f"{w.tokens_per_s:.1f}", ago, _prefix_cache(w)
        )
    return table


def _models(snapshot: FleetSnapshot) -> Table:
    table = Table(title="models", title_justify="left")
    for column in ("model", "workers", "slots", "tok/s", *LANES):
        table.add_column(column)
    table.add_column("placement followed / busy / waited out / spread")
    for m in snapshot.models:
        lanes = {lane.lane: _lane(lane) for lane in m.lanes}
        slots = f"{m.slots_used}/{m.slots_total}"
        table.add_row(
            m.model,
            str(m.live_workers),
            slots,
            f"{m.tokens_per_s:.1f}",
            *(lanes[lane] for lane in LANES),
            _placement(m),
        )
    return table


def _mib(value: int) -> str:
    return f"{value >> 20:,} MiB"


def _pools(snapshot: FleetSnapshot) -> Table:
    """Each machine's pool: what it holds, memory against its budget, what it did lately."""
    table = Table(title=f"pools: {len(snapshot.pools)} live", title_justify="left")
    for column in ("machine", "budget", "counted", "resident", "models"):
        table.add_column(column)
    table.add_column("loads / evictions / unloads / failed")
    table.add_column("last")
    for p in snapshot.pools:
        held = ", ".join(f"{h.model} ({h.state}, {_mib(h.rss_bytes)})" for h in p.held)
        last = p.events[0] if p.events else None
        took = "" if last is None or last.seconds is None else f" in {last.seconds:.1f}s"
        table.add_row(
            p.machine,
            _mib(p.budget_bytes),
            _mib(p.used_bytes),
            _mib(p.rss_bytes),
            held or "-",
            f"{p.loads} / {p.evictions} / {p.unloads} / {p.failed_loads}",
            "-" if last is None else f"{last.what} {last.model}{took}",
        )
    return table


def _jobs(snapshot: FleetSnapshot) -> Table:
    table = Table(title="recent jobs", title_justify="left")
    for column in ("job", "model", "lane", "status", "finish", "tokens", "queue", "ttft", "e2e"):
        table.add_column(column)
    table.add_column("worker")
    for j in snapshot.recent_jobs:
        tokens = f"{j.prompt_tokens}+{j.completion_tokens}"
        table.add_row(
            j.job_id,
            j.model,
            j.lane,
            j.status,
            j.finish_reason,
            tokens,
            _seconds(j.queue_s),
            _seconds(j.ttft_s),
            _seconds(j.e2e_s),
            j.worker,
        )
    return table


def render(snapshot: FleetSnapshot, where: str) -> Group:
    taken = datetime.fromtimestamp(snapshot.taken_at).strftime("%H:%M:%S")
    head = f"mlxq status  {where}  at {taken}"
    return Group(head, _workers(snapshot), _pools(snapshot), _models(snapshot), _jobs(snapshot))


def run_status(settings: Settings, as_json: bool, watch: bool, interval_s: float) -> int:
    redis, keys = connect(settings), Keys(settings.namespace)
    console = Console()
    where = f"namespace {settings.namespace}"

    def take() -> FleetSnapshot:
        return read_snapshot(redis, keys, settings.heartbeat_s)

    with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C ends --watch
        if as_json:
            _json(take, watch, interval_s)
        elif not watch:
            console.print(render(take(), where))
        else:
            with Live(render(take(), where), console=console) as live:
                while True:
                    time.sleep(interval_s)
                    live.update(render(take(), where))
    return 0


def _json(take: Callable[[], FleetSnapshot], watch: bool, interval_s: float) -> None:
    while True:
        print(take().model_dump_json(), flush=True)
        if not watch:
            return
        time.sleep(interval_s)
