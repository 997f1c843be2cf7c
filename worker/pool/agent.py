"""The pool agent (`mlxq pool`): one per machine, it owns the machine's memory budget and runs
one worker process per loaded model, as Ollama runs a runner per model.

Every tick (a quarter of a heartbeat) it:
1. reaps its workers: one that exited while loading is a failed load (its model's waiting jobs
   are told, naming it: shared/queue/pool.py `record_failure`, api/queue/watch.py, and its
   background responses and batch lines fail: worker/pool/failed_load.py); a loading one that
   announced itself (its heartbeat) is loaded;
2. reads the demand in one pipelined round trip: the jobs waiting in each catalog model's
   lanes, its workers' reports (slots in use, when their last job ended, the keep_alive it
   asked for), the pins and the operators' orders, and the other machines' pools;
3. unloads: a model idle past its keep-alive (the last request's `keep_alive`, else its
   catalog entry's, default 5 min; 0: at once; -1: never), or ordered unloaded; never a
   pinned one for idleness;
4. loads: a catalog model with waiting jobs, a pin or a load order, that no live worker serves
   and nobody loads, on the live pool with the most free budget; making room by evicting idle
   models (worker/pool/budget.py). A model whose queue outruns its full workers for
   MLXQ_POOL_STABLE_S gets another replica on a machine that holds none of it, where the
   budget has room without evicting: one engine per model per machine, since a second
   process on the same device shares its cores or GPU and holds the weights twice, where a
   bigger batch in the one process serves the same demand faster (docs/benchmarks.md). One
   load at a time per model (`{ns}:loading:{model}`, SET NX), each a process of its own, so a
   load never blocks another model's jobs and no request's cancel can abort it;
5. keeps one spare worker process while nothing loads and its headroom fits the budget beside
   the models held (MLXQ_POOL_SPARE, worker/pool/spare.py), its imports done, which the next
   load tells its model instead of starting a process;
6. publishes its report (catalog, budget, held models with their resident memory, loads,
   evictions and unloads) with its beat.
SIGTERM: every worker drains and exits, the spare too, then the agent leaves.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Literal

from redis import Redis
from redis.exceptions import RedisError

from shared.observe.fleet import WorkerStats
from shared.queue import pool as pools
from shared.queue import turns
from shared.queue.config import Settings
from shared.queue.connection import connect
from shared.queue.jobs import LANES
from shared.queue.keys import Keys
from shared.queue.liveness import live_workers
from shared.wire.fleet.keep_alive import FOREVER, stay_s
from shared.wire.fleet.pool import MIB, LoadFailure, PoolEvent, PoolOrder, PoolReport
from worker.ops.cluster import reap
from worker.pool import held as processes
from worker.pool.budget import Candidate, budget_bytes, to_evict
from worker.pool.catalog import Found, read_catalog
from worker.pool.failed_load import fail_bulk
from worker.pool.held import Held
from worker.pool.spare import SpareKeeper

log = logging.getLogger(__name__)

CATALOG_EVERY_S = 2.0
EVENTS_KEPT = 20
# After a failed load, the model waits this long, doubling per failure in a row, up to MAX.
RETRY_S, MAX_RETRY_S = 2.0, 300.0


@dataclass
class Demand:
    """What the queue and the fleet say this tick."""

    waiting: dict[str, int]
    live: dict[str, set[str]]
    stats: dict[str, WorkerStats]  # reports of this pool's workers and of busy models', by id
    pins: set[str]
    orders: dict[str, PoolOrder]
    reports: list[PoolReport]


@dataclass
class Counts:
    loads: int = 0
    evictions: int = 0
    unloads: int = 0
    failed_loads: int = 0
    events: deque[PoolEvent] = field(default_factory=lambda: deque(maxlen=EVENTS_KEPT))


class PoolAgent:
    def __init__(self, settings: Settings, redis: Redis | None = None):
        self.settings = settings
        self.keys = Keys(settings.namespace)
        self.redis = redis or connect(settings)
        self.machine = settings.machine or _host()
        self.budget = budget_bytes(settings)
        self.catalog: dict[str, Found] = {}
        self.held: list[Held] = []
        self.counts = Counts()
        self._catalog_at = 0.0
        self._failures: dict[str, tuple[int, float]] = {}  # model -> (in a row, retry after)
        self._busy_since: dict[str, float] = {}  # model -> when its queue began to outrun it
        self._claimed: set[str] = set()  # loads claimed while evicted models give memory back
        self._preload = set(settings.pool_preload)
        self._order_done: dict[str, float] = {}
        self.spares = SpareKeeper(settings.pool_spare)
        self._waiting = self.redis.register_script(turns.WAITING)

    # The loop

    def run(self, stop: threading.Event) -> None:
        log.info("pool %s: budget %d MiB", self.machine, self.budget >> 20)
        while not stop.is_set():
            try:
                self.tick(time.time())
            except RedisError as err:
                log.warning("pool: Redis: %s", err)
            stop.wait(self.settings.heartbeat_s / 4)
        self.shutdown()

    def tick(self, now: float) -> None:
        if now - self._catalog_at >= CATALOG_EVERY_S:
            self._read_catalog(now)
        self._reap(now)
        demand = self._demand()
        self._mark_loaded(demand, now)
        self._unload(demand, now)
        self._load(demand, now)
        loading = any(h.state == "loading" for h in self.held)
        self.spares.keep(now, loading, fits=self._used() + self._spare_cost() <= self.budget)
        self._publish(demand.pins)

    def shutdown(self) -> None:
        now = time.time()
        for h in self.held:
            h.stop(now)
        for h in self.held:
            reap(h.worker.proc, self.settings.drain_timeout_s + processes.EXIT_GRACE_S)
            if h.loaded_at is None:
                pools.end_load(self.redis, self.keys, h.model)
        self.held.clear()
        self.spares.stop()
        pools.retire_pool(self.redis, self.keys, self.machine)

    # 1. The catalog and the processes

    def _read_catalog(self, now: float) -> None:
        self.catalog = read_catalog(self.settings)
        self._catalog_at = now
        if self.catalog:  # the API tells a job of the wrong kind before any worker has said
            kinds = {name: f.entry.kind for name, f in self.catalog.items()}
            self.redis.hset(self.keys.model_kinds(), mapping=kinds)  # type: ignore[arg-type]

    def _reap(self, now: float) -> None:
        for h in list(self.held):
            code = h.worker.proc.poll()
            if code is None:
                if self._stuck(h, now):
                    h.worker.proc.kill()
                continue
            self.held.remove(h)
            if h.loaded_at is None:
                self._failed(h, code, now)
            else:
                what = "evict" if h.evicted else "unload"
                why = "" if h.stop_sent_at is not None else f"its worker exited ({code})"
                # How long the memory took to come back: from SIGTERM to the process's end.
                took = None if h.stop_sent_at is None else now - h.stop_sent_at
                self._event(PoolEvent(at=now, model=h.model, what=what, seconds=took, why=why))

    def _stuck(self, h: Held, now: float) -> bool:
        """Past its drain after SIGTERM, or loading past the load's time limit."""
        if h.overdue(now, self.settings.drain_timeout_s):
            return True
        return h.loaded_at is None and h.load_s > self.settings.pool_load_timeout_s

    def _failed(self, h: Held, code: int, now: float) -> None:
        why = (
            f"its worker was killed by signal {-code}"
            if code < 0
            else f"its worker exited ({code})"
        )
        why += " while loading"
        log.error("pool: %s failed to load: %s", h.model, why)
        self.counts.failed_loads += 1
        in_a_row = self._failures.get(h.model, (0, 0.0))[0] + 1
        self._failures[h.model] = (in_a_row, now + min(MAX_RETRY_S, RETRY_S * 2 ** (in_a_row - 1)))
        failure = LoadFailure(model=h.model, machine=self.machine, at=now, why=why)
        pools.record_failure(self.redis, self.keys, failure)
        pools.end_load(self.redis, self.keys, h.model)
        fail_bulk(self.redis, self.keys, h.model, failure.error(), self.settings.replay_ttl_s)
        self._event(PoolEvent(at=now, model=h.model, what="load_failed", why=why))

    def _mark_loaded(self, demand: Demand, now: float) -> None:
        for h in self.held:
            if h.loaded_at is None and h.worker.worker_id in demand.live.get(h.model, set()):
                h.loaded_at = h.last_used = now
                self._failures.pop(h.model, None)
                pools.end_load(self.redis, self.keys, h.model)
                self.counts.loads += 1
                self._event(PoolEvent(at=now, model=h.model, what="load", seconds=h.load_s))
                log.info("pool: loaded %s in %.1f s", h.model, h.load_s)

    # 2. Demand

    def _demand(self) -> Demand:
        models = sorted(self.catalog)
        pipe = self.redis.pipeline(transaction=False)
        for model in models:
            for lane in LANES:  # each lane's lists, its callers' included (shared/queue/turns.py)
                turns.add_waiting(pipe, self._waiting, self.keys, model, lane)
        ids = [h.worker.worker_id for h in self.held]
        for worker_id in ids:
            pipe.get(self.keys.worker_stats(worker_id))
        pipe.smembers(self.keys.pins())
        replies: list[Any] = pipe.execute()
        lanes = len(LANES)
        waiting = {
            m: sum(int(r[0]) for r in replies[i * lanes : (i + 1) * lanes])
            for i, m in enumerate(models)
        }
        raw_stats = replies[len(models) * lanes : len(models) * lanes + len(ids)]
        stats = {
            w: WorkerStats.model_validate_json(r)
            for w, r in zip(ids, raw_stats, strict=True)
            if r is not None
        }
        pins = {bytes(p).decode() for p in replies[-1]}
        live = live_workers(self.redis, self.keys, models, self.settings.heartbeat_s)
        return Demand(
            waiting=waiting,
            live=live,
            stats=stats | self._busy_stats(waiting, live, stats),
            pins=pins | {n for n, f in self.catalog.items() if f.entry.pinned},
            orders=pools.read_orders(self.redis, self.keys),
            reports=pools.read_reports(self.redis, self.keys, self.settings.heartbeat_s),
        )

    def _busy_stats(
        self, waiting: dict[str, int], live: dict[str, set[str]], known: dict[str, WorkerStats]
    ) -> dict[str, WorkerStats]:
        """The reports of other machines' workers of models with jobs waiting (whether they
        are full decides a replica here)."""
        ids = sorted(
            w for m, n in waiting.items() if n for w in live.get(m, set()) if w not in known
        )
        if not ids:
            return {}
        pipe = self.redis.pipeline(transaction=False)
        for worker_id in ids:
            pipe.get(self.keys.worker_stats(worker_id))
        replies: list[Any] = pipe.execute()
        return {
            w: WorkerStats.model_validate_json(r)
            for w, r in zip(ids, replies, strict=True)
            if r is not None
        }

    # 3. Unloading

    def _unload(self, demand: Demand, now: float) -> None:
        for h in self.held:
            if h.state != "loaded":
                continue
            stats = demand.stats.get(h.worker.worker_id)
            busy = demand.waiting.get(h.model, 0) > 0 or (stats is not None and stats.slots_used)
            if busy:
                h.last_used = now
            elif stats is not None and stats.last_job_at is not None:
                h.last_used = max(h.last_used, stats.last_job_at)
            order = demand.orders.get(h.model)
            ordered = order is not None and order.action == "unload" and order.at >= h.started_at
            idle_out = not busy and h.model not in demand.pins and self._expired(h, stats, now)
            if ordered or idle_out:
                self._stop(h, now, evicted=False)

    def _expired(self, h: Held, stats: WorkerStats | None, now: float) -> bool:
        own = self.catalog[h.model].entry.keep_alive_s if h.model in self.catalog else 0
        keep = stay_s(stats.keep_alive_s if stats is not None else None, own)
        return keep != FOREVER and now - h.last_used >= keep

    def _stop(self, h: Held, now: float, evicted: bool) -> None:
        log.info("pool: %s %s", "evicting" if evicted else "unloading", h.model)
        h.evicted = evicted
        h.stop(now)
        if evicted:
            self.counts.evictions += 1
        else:
            self.counts.unloads += 1

    # 4. Loading

    def _load(self, demand: Demand, now: float) -> None:
        for model in sorted(self.catalog):
            if not self._wanted(model, demand, now) or not self._chosen(model, demand):
                if model in self._claimed:  # claimed while memory came back, no longer wanted
                    self._claimed.discard(model)
                    pools.end_load(self.redis, self.keys, model)
                continue
            found = self.catalog[model]
            ttl = self.settings.pool_load_timeout_s
            # The load is claimed before anything is evicted for it: a pool that thinks it is
            # chosen on a report not yet complete (another pool just started) evicts nothing
            # for a load another pool makes. The claim is kept while the evicted give their
            # memory back, given up where no eviction can make room.
            if not pools.claim_load(self.redis, self.keys, model, self.machine, ttl):
                continue
            room = self._make_room(found.entry.cost.total_bytes, demand, now)
            if room == "never":
                pools.end_load(self.redis, self.keys, model)
            if room == "soon":
                self._claimed.add(model)
            if room != "now":
                continue
            self._claimed.discard(model)
            log.info("pool: loading %s", model)
            self.held.append(processes.start(self.settings, found, now, self.spares.take()))
            self._preload.discard(model)
            order = demand.orders.get(model)
            if order is not None and order.action == "load":
                pools.drop_order(self.redis, self.keys, model)

    def _wanted(self, model: str, demand: Demand, now: float) -> bool:
        """Whether the fleet needs one more worker of `model` now."""
        if self._failures.get(model, (0, 0.0))[1] > now:
            return False
        if any(h.model == model and h.state == "loading" for h in self.held):
            return False
        live = demand.live.get(model, set())
        order = demand.orders.get(model)
        if not live:
            asked = order is not None and order.action == "load"
            return (
                demand.waiting.get(model, 0) > 0
                or model in demand.pins
                or asked
                or (model in self._preload)
            )
        return self._outrun(model, demand, now)

    def _outrun(self, model: str, demand: Demand, now: float) -> bool:
        """Its queue has outrun its full workers for the stable window, and this machine holds
        none of it (another replica, here)."""
        workers = demand.live.get(model, set())
        full = all(
            (s := demand.stats.get(w)) is not None and s.slots_used >= s.batch_size for w in workers
        )
        here = any(h.model == model for h in self.held)
        if here or not workers or not full or demand.waiting.get(model, 0) == 0:
            self._busy_since.pop(model, None)
            return False
        since = self._busy_since.setdefault(model, now)
        return now - since >= self.settings.pool_stable_s

    def _chosen(self, model: str, demand: Demand) -> bool:
        """Whether this machine is the live pool that loads `model`: the one with the most free
        budget among those whose budget it fits (ties by name)."""
        cost = self.catalog[model].entry.cost.total_bytes
        if cost > self.budget:
            return False
        mine = (self.budget - self._used(), self.machine)
        others = [
            (r.free_bytes, r.machine)
            for r in demand.reports
            if r.machine != self.machine
            and (e := r.entry(model))
            and e.cost.total_bytes <= r.budget_bytes
            and all(h.model != model for h in r.held)  # one engine per model per machine
        ]
        return min([mine, *others], key=lambda o: (-o[0], o[1])) == mine

    def _make_room(self, need: int, demand: Demand, now: float) -> Literal["now", "soon", "never"]:
        """Whether `need` bytes fit now, soon (idle models evicted to make room give their
        memory back first), or not for now."""
        if any(h.state == "unloading" for h in self.held) and need > self.budget - self._used():
            return "soon"  # memory still on its way back
        candidates = [
            Candidate(
                key=h.worker.worker_id,
                cost=h.cost,
                last_used=h.last_used,
                load_s=h.load_s,
                idle=demand.waiting.get(h.model, 0) == 0
                and not ((s := demand.stats.get(h.worker.worker_id)) and s.slots_used),
                pinned=h.model in demand.pins,
                loaded_at=h.loaded_at or now,
            )
            for h in self.held
            if h.state == "loaded"
        ]
        cooldown = self.settings.pool_cooldown_s
        chosen = to_evict(candidates, need, self.budget - self._used(), now, cooldown)
        if chosen is None:
            return "never"
        for c in chosen:
            h = next(h for h in self.held if h.worker.worker_id == c.key)
            self._stop(h, now, evicted=True)
        return "soon" if chosen else "now"

    def _used(self) -> int:
        """What the models held take. A load's room is counted against this alone: the load
        takes the spare, whose place becomes the loaded process's headroom."""
        return sum(h.cost for h in self.held)

    def _spare_cost(self) -> int:
        """A spare is a worker process without a model: a process's headroom."""
        return self.settings.pool_headroom_mb * MIB

    # 5. The report

    def report(self, pins: set[str] | None = None) -> PoolReport:
        pins = pins or set()
        views = [h.view(h.model in pins) for h in self.held]
        spare_bytes = self._spare_cost() if self.spares.spare is not None else 0
        return PoolReport(
            machine=self.machine,
            budget_bytes=self.budget,
            used_bytes=self._used() + spare_bytes,
            rss_bytes=sum(v.rss_bytes for v in views) + self.spares.rss_bytes(),
            catalog=[f.entry for f in self.catalog.values()],
            spare_id=self.spares.worker_id,
            spare_bytes=spare_bytes,
            held=views,
            loads=self.counts.loads,
            evictions=self.counts.evictions,
            unloads=self.counts.unloads,
            failed_loads=self.counts.failed_loads,
            events=list(self.counts.events),
        )

    def _publish(self, pins: set[str]) -> None:
        pipe = self.redis.pipeline(transaction=False)
        pools.publish_report(pipe, self.keys, self.report(pins), self.settings.heartbeat_s)
        pipe.execute()

    def _event(self, event: PoolEvent) -> None:
        self.counts.events.appendleft(event)


def _host() -> str:
    import socket

    return socket.gethostname()


def serve_pool(settings: Settings) -> None:
    """`mlxq pool`: run the agent until SIGTERM or SIGINT."""
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    PoolAgent(settings).run(stop)
