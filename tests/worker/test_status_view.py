"""What `mlxq status` draws (worker/ops/status.py), from a made-up fleet snapshot: each worker's
prefix-cache hits and misses, and each model's placement counts, as /metrics and /v1/fleet
carry them."""

from __future__ import annotations

from rich.console import Console

from shared.observe.fleet import FleetSnapshot, LaneView, ModelView, WorkerView
from shared.queue.jobs import LANES
from shared.wire.fleet.pool import HeldModel, PoolEvent, PoolReport
from worker.ops.status import render


def test_status_shows_each_workers_prefix_cache_hits_and_misses_and_placement_counts() -> None:
    worker = WorkerView(
        worker_id="mac.1",
        host="mac",
        model="m",
        batch_size=16,
        running={},
        tokens_per_s=0.0,
        generated_tokens=0,
        started_at=0.0,
        prefix_cache_queries=5000,
        prefix_cache_hits=4321,
        last_heartbeat=99.0,
    )
    model = ModelView(
        model="m",
        live_workers=1,
        slots_used=0,
        slots_total=16,
        tokens_per_s=0.0,
        lanes=[LaneView(lane=lane, waiting=0, running=0, oldest_waiting_s=None) for lane in LANES],
        placement={"followed": 37, "overridden_busy": 5, "overridden_wait": 2},
    )
    snapshot = FleetSnapshot(taken_at=100.0, workers=[worker], models=[model], recent_jobs=[])
    console = Console(record=True, width=400)
    console.print(render(snapshot, "namespace t"))
    text = console.export_text()
    assert "prefix cache hit / miss tokens" in text
    assert "4321 / 679" in text
    assert "placement followed / busy / waited out" in text
    assert "37 / 5 / 2" in text


def test_status_shows_each_pools_models_memory_against_its_budget_and_what_it_did() -> None:
    held = HeldModel(
        model="beta", worker_id="mac.7", state="loaded", started_at=1.0, rss_bytes=900 << 20
    )
    pool = PoolReport(
        machine="mac",
        budget_bytes=3000 << 20,
        used_bytes=1200 << 20,
        rss_bytes=900 << 20,
        catalog=[],
        held=[held],
        loads=3,
        evictions=2,
        unloads=1,
        failed_loads=1,
        events=[PoolEvent(at=99.0, model="alpha", what="evict", seconds=4.2)],
    )
    snapshot = FleetSnapshot(taken_at=100.0, workers=[], models=[], recent_jobs=[], pools=[pool])
    console = Console(record=True, width=400)
    console.print(render(snapshot, "namespace t"))
    text = console.export_text()
    assert "3,000 MiB" in text and "1,200 MiB" in text
    assert "beta (loaded, 900 MiB)" in text
    assert "3 / 2 / 1 / 1" in text
    assert "evict alpha in 4.2s" in text
