"""The relay alone: one API process relaying many SSE streams fed by a SYNTHETIC engine.

No model runs: the worker's engine is worker/engine/doubles/synthetic.py, which emits one token per
stream
every `step` seconds whose text is the time it was made. So this measures what the API and
Redis add: token events per second through one API process, the latency from the worker's
engine step to the client, and gaps between tokens beyond the synthetic step. Each figure is
given while every stream is open (the relay at that load) and over the whole run (which adds
the ramp-up: 500 requests accepted and admitted while the first streams already run).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tqdm import tqdm

from bench import systems
from bench.load import chat_body, percentile
from bench.machine import describe
from bench.report import markdown_table, write
from bench.sse_client import StreamRecord, stream_chat

MODEL = "synthetic"


def _latencies_ms(record: StreamRecord, window: tuple[float, float]) -> list[float]:
    """Each token's engine-to-client latency, for tokens that arrived within `window`."""
    out = []
    for perf, text in zip(record.chunk_times, record.chunk_texts, strict=False):
        if window[0] <= perf <= window[1]:
            with contextlib.suppress(ValueError):
                out.append((record.wall_clock(perf) - float(text)) * 1e3)
    return out


def _gaps_ms(record: StreamRecord, window: tuple[float, float]) -> list[float]:
    times = [t for t in record.chunk_times if window[0] <= t <= window[1]]
    return [(b - a) * 1e3 for a, b in itertools.pairwise(times)]


def _all_open(records: list[StreamRecord]) -> tuple[float, float] | None:
    """While every stream was open: from the last stream's first token to the first stream's
    last one. Outside it the API is also accepting or closing streams, and the synthetic
    worker admitting or ending jobs."""
    timed = [r.chunk_times for r in records if r.chunk_times]
    if not timed:
        return None
    begin, end = max(t[0] for t in timed), min(t[-1] for t in timed)
    return (begin, end) if end > begin else None


def _figures(records: list[StreamRecord], window: tuple[float, float], step_s: float) -> Figures:
    events = sum(window[0] <= t <= window[1] for r in records for t in r.chunk_times)
    per_stream = [_latencies_ms(r, window) for r in records]
    latencies = [x for stream in per_stream for x in stream]
    # A gap between two tokens is the engine's own spacing of them plus how much later the
    # second one's latency was than the first's: that second part is what the relay added.
    relay_added = [b - a for stream in per_stream for a, b in itertools.pairwise(stream)]
    gap_p99 = percentile([g for r in records for g in _gaps_ms(r, window)], 99)
    return Figures(
        events_per_s=events / (window[1] - window[0]),
        latency_p50_ms=percentile(latencies, 50),
        latency_p99_ms=percentile(latencies, 99),
        added_gap_p99_ms=None if gap_p99 is None else gap_p99 - step_s * 1e3,
        relay_added_gap_p99_ms=percentile(relay_added, 99),
    )


@dataclass
class Figures:
    events_per_s: float
    latency_p50_ms: float | None
    latency_p99_ms: float | None
    added_gap_p99_ms: float | None  # gap p99 beyond the synthetic step, engine jitter included
    relay_added_gap_p99_ms: float | None  # the part of each gap the API and Redis added, p99


def _cpu(running: systems.Running) -> dict[str, float]:
    return {
        "api": systems.cpu_seconds(running.api_pids),
        "worker": systems.cpu_seconds(running.worker_pids),
        "redis": systems.cpu_seconds(running.redis_pids),
        "client": time.process_time(),
    }


def measure(running: systems.Running, streams: int, tokens: int, step_s: float) -> dict[str, Any]:
    async def main() -> list[StreamRecord]:
        bodies = [chat_body(MODEL, i, tokens) for i in range(streams)]
        return await asyncio.gather(
            *(stream_chat("127.0.0.1", running.port, b, 300) for b in bodies)
        )

    assert running.redis is not None
    keys_before = running.redis.dbsize()
    cpu_before = _cpu(running)
    busy_before, total_before = systems.machine_cpu_seconds()
    started = time.perf_counter()
    records = asyncio.run(main())
    wall = time.perf_counter() - started
    cpu = {part: after - cpu_before[part] for part, after in _cpu(running).items()}
    busy_after, total_after = systems.machine_cpu_seconds()
    ok = [r for r in records if r.error is None]
    events = sum(len(r.chunk_times) for r in ok)
    per_1k = {part: 1000 * s / events if events else None for part, s in cpu.items()}
    whole = (started, time.perf_counter())
    steady = _all_open(ok)
    logs = list(running.redis.scan_iter(f"{running.namespace}:replay:*", count=1000))
    log_bytes = sum(int(running.redis.memory_usage(key) or 0) for key in logs)
    return {
        "streams": streams,
        "errors": len(records) - len(ok),
        "error_samples": sorted({r.error for r in records if r.error})[:5],
        "events": events,
        "wall_s": wall,
        # Figures while all streams were open (the target's), then over the whole run.
        "all_open": None if steady is None else asdict(_figures(ok, steady, step_s)),
        "whole_run": asdict(_figures(ok, whole, step_s)),
        # CPU per 1,000 events of each part (the load generator is this process), and how busy
        # the machine's cores were: together they say what the limit was.
        "cpu_s_per_1k_events": per_1k,
        "machine_busy": (busy_after - busy_before) / (total_after - total_before),
        # What Redis still holds once every stream ended: replay logs (plain requests should
        # leave none) and their bytes per relayed event, and keys per job (RQ's job record,
        # kept for its result TTL, is one).
        "replay_logs_kept": len(logs),
        "replay_bytes_per_event": log_bytes / events if events else None,
        "keys_kept_per_job": (running.redis.dbsize() - keys_before) / streams,
    }


def main(args: Any) -> None:
    levels = [int(n) for n in args.streams.split(",")]
    step_s = args.step_ms / 1000
    settings = {
        "MLXQ_ENGINE": "synthetic",
        "MLXQ_MODEL": MODEL,
        "MLXQ_SYNTHETIC_STEP_S": str(step_s),
        "MLXQ_API_CONNECTIONS": str(max(levels) + 64),
        "MLXQ_QUEUE_CAP": str(10 * max(levels)),
    }
    rows = []
    with systems.mlxq(Path(MODEL), max(levels), settings) as running:
        for n in tqdm(levels, desc="relay (synthetic engine)", unit="level"):
            rows.append(measure(running, n, args.tokens, step_s))
    out = Path(args.out)
    result = {"machine": describe(), "engine": "SYNTHETIC", "step_ms": args.step_ms, "rows": rows}
    write(out, "relay", result)
    text = "SYNTHETIC engine (no model), one API process\n\n" + table(rows)
    (out / "relay.md").write_text(f"Machine: {result['machine']['summary']}\n\n{text}\n")
    print(text)


def table(rows: list[dict[str, Any]]) -> str:
    head = ["streams", "phase", "events/s", "latency p50 ms", "latency p99 ms"]
    head += ["added gap p99 ms", "of which the relay's, p99 ms"]
    head += ["CPU s/1k events: API / worker / Redis / client", "machine CPU busy", "errors"]
    head += ["replay logs kept", "replay bytes/event", "keys kept/job"]
    cells = []
    for r in rows:
        cpu = " / ".join(f"{v:.3f}" for v in r["cpu_s_per_1k_events"].values())
        for phase in ("all_open", "whole_run"):
            f = r[phase]
            if f is None:
                continue
            cells.append(
                [
                    str(r["streams"]),
                    phase.replace("_", " "),
                    f"{f['events_per_s']:.0f}",
                    _ms(f["latency_p50_ms"]),
                    _ms(f["latency_p99_ms"]),
                    _ms(f["added_gap_p99_ms"]),
                    _ms(f["relay_added_gap_p99_ms"]),
                    cpu,
                    f"{100 * r['machine_busy']:.0f}%",
                    str(r["errors"]),
                    str(r["replay_logs_kept"]),
                    f"{r['replay_bytes_per_event']:.1f}",
                    f"{r['keys_kept_per_job']:.2f}",
                ]
            )
    return "\n".join(markdown_table(head, cells))


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"
