"""A machine's memory budget, and which idle models make room for a load.

The budget (MLXQ_POOL_BUDGET_MB, else MLXQ_POOL_BUDGET_SHARE of the machine: of its RAM on
Linux, of MLX's recommended working set on a Mac) bounds the costs of every model the pool
holds or loads (shared/wire/fleet/pool.py ModelCost: weights, KV at rows x context, prefix cache,
headroom), so by default no worker runs the machine out of memory.

Eviction takes idle models only (no job running or waiting, not pinned, loaded longer than
the cool-down), least recently used first, weighted by what a reload costs: a model is ranked
by its last use plus RELOAD_WEIGHT times its load time, so a model that took 20 s to load
counts as used 200 s later than it was.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

from shared.queue.config import Settings
from shared.wire.fleet.pool import MIB

RELOAD_WEIGHT = 10.0


def machine_bytes() -> int:
    """The memory a machine's models may use at most: MLX's recommended working set on a Mac
    (what Metal keeps resident without paging), else its physical RAM."""
    if sys.platform == "darwin":
        import mlx.core as mx

        return int(mx.metal.device_info()["max_recommended_working_set_size"])
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def budget_bytes(settings: Settings) -> int:
    if settings.pool_budget_mb is not None:
        return settings.pool_budget_mb * MIB
    return int(machine_bytes() * settings.pool_budget_share)


@dataclass(frozen=True)
class Candidate:
    """A loaded model that might be evicted."""

    key: str  # its worker's id
    cost: int
    last_used: float
    load_s: float
    idle: bool  # no job running or waiting
    pinned: bool
    loaded_at: float


def to_evict(
    candidates: list[Candidate], need: int, free: int, now: float, cooldown_s: float
) -> list[Candidate] | None:
    """The idle models to evict so that `need` bytes fit in `free` plus theirs, in eviction
    order; None if evicting every idle one would not make room (the load waits)."""
    if need <= free:
        return []
    evictable = [
        c for c in candidates if c.idle and not c.pinned and now - c.loaded_at >= cooldown_s
    ]
    evictable.sort(key=lambda c: c.last_used + RELOAD_WEIGHT * c.load_s)
    chosen: list[Candidate] = []
    for c in evictable:
        chosen.append(c)
        free += c.cost
        if need <= free:
            return chosen
    return None
