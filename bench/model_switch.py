"""`python -m bench switch`: clients spread over 3 models on one machine whose pool budget holds 2.

The catalog is the default model under `--models` names (links in a models folder of the
benchmark's own), each costing the same; the budget holds `--budget-models` of them. `--clients`
clients each send streamed chat requests (`--max-tokens` tokens) for `--duration` seconds, each
to a model drawn at random (seeded), so the pool loads, evicts and loads again. Reported:
- TTFT of requests whose model was loaded when they were sent, and of those that waited for a
  load (the pool's report read just before each request says which);
- loads per minute, and each load's time (process start to serving: the pool's load events);
- the floor: the time to load the model from disk in this process (weights and tokenizer, no
  process start), the least any load can take;
- peak resident memory of the pool's workers (sampled every 0.5 s) against the budget;
- with `--flow`, first: a stream on a loaded model while another model loads, its gaps between
  tokens before the load (the engine step) and during it;
- with `--first N`, first: N requests, one at a time, each for a model loaded nowhere while the
  pool holds nothing (each asks `keep_alive: 0`, so its model unloads as it ends): the first
  request's target is the floor plus 1 s.
"""

from __future__ import annotations

import argparse
import itertools
import random
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import openai
from openai.types.chat import ChatCompletionMessageParam

from bench.machine import describe
from bench.report import markdown_table, write
from shared.queue import pool as pools
from shared.queue.config import Settings
from shared.wire.fleet.pool import MIB
from worker.engine.model import load_model
from worker.gguf.default_model import ensure_default_model
from worker.ops.cluster import Cluster, wait_until
from worker.pool.catalog import read_catalog

HEADROOM_MB, PREFIX_MB, ROWS, CONTEXT = 512, 16, 4, 1024
# The flow measurement's stream: long enough to outlast a load, never ended by the model.
FLOW_TOKENS = 900
NO_END = {"2": -100, "0": -100}  # the default model's end tokens


def add_parser(sub: Any) -> None:
    p = sub.add_parser("switch", help="clients over 3 models, a pool budget that holds 2")
    p.add_argument("--models", type=int, default=3)
    p.add_argument("--budget-models", type=float, default=2.5, help="the budget, in models")
    p.add_argument("--clients", type=int, default=3)
    p.add_argument("--duration", type=float, default=180.0, help="seconds of traffic")
    p.add_argument("--max-tokens", type=int, default=8)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--flow", action="store_true", help="first, a stream while another loads")
    p.add_argument("--first", type=int, default=0, help="first, N requests to an idle pool")
    p.add_argument("--name", default="switch", help="file name of the results under --out")
    p.set_defaults(func=main)


def _catalog(real: Path, folder: Path, count: int) -> list[str]:
    names = [f"m{i + 1}" for i in range(count)]
    for name in names:
        (folder / name).symlink_to(real)
    native = real.parent / ".native"
    if native.is_dir():
        (folder / ".native").symlink_to(native)
    return names


def _floor_s(real: Path) -> float:
    """Loading the model from disk in this process: the least a load can take."""
    started = time.perf_counter()
    load_model(str(real))
    return time.perf_counter() - started


class Sampler(threading.Thread):
    """The pool's report every 0.5 s: peak resident memory, and whether a model is loaded."""

    def __init__(self, cluster: Cluster):
        super().__init__(daemon=True)
        self.cluster, self.stop = cluster, threading.Event()
        self.peak_rss, self.budget, self.loaded = 0, 0, set[str]()
        self.held = 0  # worker processes the pool holds, in any state

    def run(self) -> None:
        redis = self.cluster.redis()
        while not self.stop.wait(0.5):
            reports = pools.read_reports(redis, self.cluster.keys, self.cluster.heartbeat_s)
            for r in reports:
                self.peak_rss = max(self.peak_rss, r.rss_bytes)
                self.budget = r.budget_bytes
                self.loaded = {h.model for h in r.held if h.state == "loaded"}
                self.held = len(r.held)


def _client(
    client: openai.OpenAI,
    names: list[str],
    sampler: Sampler,
    until: float,
    seed: int,
    max_tokens: int,
    out: list[Any],
) -> None:
    rng = random.Random(seed)
    while time.monotonic() < until:
        model = rng.choice(names)
        was_loaded = model in sampler.loaded
        started = time.monotonic()
        first = None
        stream = client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": "Say something."}],
            max_tokens=max_tokens,
            stream=True,
        )
        for chunk in stream:
            if first is None and chunk.choices and chunk.choices[0].delta.content:
                first = time.monotonic() - started
        out.append({"model": model, "loaded": was_loaded, "ttft_s": first})


def main(args: argparse.Namespace) -> None:
    real = ensure_default_model(args.models_dir)
    floor = _floor_s(real)
    with tempfile.TemporaryDirectory(prefix="mlxq-switch-") as tmp:
        names = _catalog(real, Path(tmp), args.models)
        cost = Settings(
            models_dir=Path(tmp),
            pool_rows=ROWS,
            pool_kv_tokens=ROWS * CONTEXT,
            prefix_cache_mb=PREFIX_MB,
            pool_headroom_mb=HEADROOM_MB,
        )
        one = read_catalog(cost)[names[0]].entry.cost.total_bytes
        env = {
            "MLXQ_MODELS_DIR": tmp,
            "MLXQ_POOL_BUDGET_MB": str(int(args.budget_models * one) // MIB),
            "MLXQ_POOL_ROWS": str(ROWS),
            "MLXQ_POOL_KV_TOKENS": str(ROWS * CONTEXT),
            "MLXQ_PREFIX_CACHE_MB": str(PREFIX_MB),
            "MLXQ_POOL_HEADROOM_MB": str(HEADROOM_MB),
            "MLXQ_POOL_COOLDOWN_S": "0",
            "MLXQ_QUEUE_TIMEOUT_S": "600",
        }
        cluster = Cluster("benchswitch", env=env, logs=Path(tmp))
        try:
            rows = _run(cluster, names, args)
        finally:
            cluster.stop(quick=True)
    _report(args, floor, one, *rows)


def _run(cluster: Cluster, names: list[str], args: argparse.Namespace) -> tuple[Any, ...]:
    cluster.start_redis()
    cluster.start_api()
    cluster.start_pool()
    sampler = Sampler(cluster)
    sampler.start()
    wait_until(lambda: sampler.budget > 0, 60, "the pool's first report")
    client = openai.OpenAI(base_url=f"{cluster.api_url}/v1", api_key="unused", timeout=900)
    first = _first(client, names, sampler, args.first)
    flow = _flow(client, names, sampler) if args.flow else {}
    results: list[Any] = []
    until = time.monotonic() + args.duration
    started = time.monotonic()
    threads = [
        threading.Thread(
            target=_client,
            args=(client, names, sampler, until, args.seed + i, args.max_tokens, results),
        )
        for i in range(args.clients)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.monotonic() - started
    sampler.stop.set()
    (report,) = pools.read_reports(cluster.redis(), cluster.keys, cluster.heartbeat_s)
    return results, report, sampler.peak_rss, sampler.budget, elapsed, flow, first


def _first(client: openai.OpenAI, names: list[str], sampler: Sampler, count: int) -> list[float]:
    """TTFT of `count` requests, each for a model loaded nowhere on an idle pool."""
    ttfts = []
    for i in range(count):
        wait_until(lambda: sampler.held == 0, 120, "the pool to hold nothing")
        time.sleep(1.0)  # the unloaded worker's exit settles
        started = time.monotonic()
        stream = client.chat.completions.create(
            model=names[i % len(names)],
            messages=[{"role": "user", "content": "Say something."}],
            max_tokens=2,
            stream=True,
            extra_body={"keep_alive": 0},
        )
        first = None
        for chunk in stream:
            if first is None and chunk.choices and chunk.choices[0].delta.content:
                first = time.monotonic() - started
        if first is not None:
            ttfts.append(first)
    return ttfts


def _flow(client: openai.OpenAI, names: list[str], sampler: Sampler) -> dict[str, Any]:
    """A stream on a loaded model while another model loads: its gaps between tokens before the
    load and while it runs (seconds)."""
    hi: list[ChatCompletionMessageParam] = [
        {"role": "user", "content": "Write a very long story about a dragon."}
    ]
    client.chat.completions.create(model=names[0], messages=hi, max_tokens=1)  # loaded
    stamps: list[float] = []

    def stream() -> None:
        chunks = client.chat.completions.create(
            model=names[0],
            messages=hi,
            max_tokens=FLOW_TOKENS,
            stream=True,
            extra_body={"logit_bias": NO_END},
        )
        for chunk in chunks:
            if chunk.choices and chunk.choices[0].delta.content:
                stamps.append(time.monotonic())

    reading = threading.Thread(target=stream)
    reading.start()
    wait_until(lambda: len(stamps) >= 30, 600, "the stream's first tokens")
    load_from = time.monotonic()
    other = threading.Thread(
        target=lambda: client.chat.completions.create(model=names[1], messages=hi, max_tokens=1)
    )
    other.start()
    wait_until(lambda: names[1] in sampler.loaded, 900, "the other model's load")
    load_to = time.monotonic()
    reading.join()
    other.join()
    gaps = [(b, b - a) for a, b in itertools.pairwise(stamps)]
    before = [g for at, g in gaps if at < load_from]
    during = [g for at, g in gaps if load_from <= at <= load_to]
    return {
        "step_s": statistics.median(before),
        "max_gap_before_s": max(before),
        "median_gap_during_s": statistics.median(during) if during else None,
        "max_gap_during_s": max(during) if during else None,
        "tokens_during_load": len(during),
        "load_s": load_to - load_from,
        "stream_outlasted_load": bool(stamps) and stamps[-1] > load_to,
    }


def _per_minute(loads: int, elapsed: float) -> str:
    """Loads per minute of the switching workload; none ran (`--duration 0`): no rate."""
    if elapsed < 1:
        return f"- ({loads} loads)"
    return f"{loads / (elapsed / 60):.1f} ({loads} loads)"


def _stats(values: list[float]) -> str:
    if not values:
        return "-"
    return f"{statistics.median(values):.2f} (max {max(values):.2f}, n={len(values)})"


def _report(
    args: argparse.Namespace,
    floor: float,
    one: int,
    results: list[Any],
    report: Any,
    peak: int,
    budget: int,
    elapsed: float,
    flow: dict[str, Any],
    first: list[float],
) -> None:
    warm = [r["ttft_s"] for r in results if r["loaded"] and r["ttft_s"] is not None]
    cold = [r["ttft_s"] for r in results if not r["loaded"] and r["ttft_s"] is not None]
    loads = [e.seconds for e in report.events if e.what == "load" and e.seconds is not None]
    table = markdown_table(
        ["figure", "value"],
        [
            ["TTFT, model loaded (s, median)", _stats(warm)],
            ["TTFT, waited for a load (s, median)", _stats(cold)],
            ["TTFT, first request on an idle pool (s, median)", _stats(first)],
            ["loads per minute", _per_minute(report.loads, elapsed)],
            ["evictions / unloads", f"{report.evictions} / {report.unloads}"],
            ["load, process start to serving (s, median)", _stats(loads)],
            ["load from disk in-process, the floor (s)", f"{floor:.2f}"],
            ["peak resident memory / budget (MiB)", f"{peak >> 20:,} / {budget >> 20:,}"],
            ["one model's counted cost (MiB)", f"{one >> 20:,}"],
        ],
    )
    if flow:
        table += ["", *markdown_table(["flow while another model loads", "s"], _flow_rows(flow))]
    print("\n".join(table))
    payload = {
        "machine": describe(),
        "args": {k: str(v) for k, v in vars(args).items() if k != "func"},
        "results": results,
        "report": report.model_dump(),
        "peak_rss_bytes": peak,
        "budget_bytes": budget,
        "floor_s": floor,
        "flow": flow,
        "first_ttft_s": first,
        "table": table,
    }
    write(args.out, args.name, payload)


def _flow_rows(flow: dict[str, Any]) -> list[list[str]]:
    def seconds(key: str) -> str:
        value = flow.get(key)
        return "-" if value is None else f"{value:.3f}"

    return [
        ["gap between tokens before the load (median: the step)", seconds("step_s")],
        ["largest gap before the load", seconds("max_gap_before_s")],
        ["gap during the load (median)", seconds("median_gap_during_s")],
        ["largest gap during the load", seconds("max_gap_during_s")],
        ["tokens during the load", str(flow["tokens_during_load"])],
        ["the load (s)", seconds("load_s")],
    ]
