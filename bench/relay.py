"""The relay alone: one API process relaying many SSE streams fed by a SYNTHETIC engine.

No model runs: the worker's engine is worker/engine/synthetic.py, which emits one token per stream
every `step` seconds whose text is the time it was made. So this measures what the API and
Redis add: token events per second through one API process, the latency from the worker's
engine step to the client, and gaps between tokens beyond the synthetic step.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from tqdm import tqdm

from bench import systems
from bench.load import chat_body, percentile
from bench.machine import describe
from bench.report import write
from bench.sse_client import StreamRecord, stream_chat

MODEL = "synthetic"


def _latencies_ms(record: StreamRecord) -> list[float]:
    out = []
    for perf, text in zip(record.chunk_times, record.chunk_texts, strict=False):
        try:
            out.append((record.wall_clock(perf) - float(text)) * 1e3)
        except ValueError:
            continue
    return out


def measure(running: systems.Running, streams: int, tokens: int, step_s: float) -> dict[str, Any]:
    async def main() -> list[StreamRecord]:
        bodies = [chat_body(MODEL, i, tokens) for i in range(streams)]
        return await asyncio.gather(
            *(stream_chat("127.0.0.1", running.port, b, 300) for b in bodies)
        )

    assert running.redis is not None
    keys_before = running.redis.dbsize()
    cpu_before = systems.cpu_seconds(running.api_pids)
    client_before = time.process_time()
    busy_before, total_before = systems.machine_cpu_seconds()
    started = time.perf_counter()
    records = asyncio.run(main())
    wall = time.perf_counter() - started
    api_cpu = systems.cpu_seconds(running.api_pids) - cpu_before
    client_cpu = time.process_time() - client_before
    busy_after, total_after = systems.machine_cpu_seconds()
    ok = [r for r in records if r.error is None]
    events = sum(len(r.chunk_times) for r in ok)
    latencies = [x for r in ok for x in _latencies_ms(r)]
    gaps = [g * 1e3 for r in ok for g in r.gaps()]
    gap_p99 = percentile(gaps, 99)
    logs = list(running.redis.scan_iter(f"{running.namespace}:replay:*", count=1000))
    log_bytes = sum(int(running.redis.memory_usage(key) or 0) for key in logs)
    return {
        "streams": streams,
        "errors": len(records) - len(ok),
        "error_samples": sorted({r.error for r in records if r.error})[:5],
        "events": events,
        "wall_s": wall,
        "events_per_s": events / wall,
        "latency_p50_ms": percentile(latencies, 50),
        "latency_p99_ms": percentile(latencies, 99),
        "gap_p99_ms": gap_p99,
        "added_gap_p99_ms": None if gap_p99 is None else gap_p99 - step_s * 1e3,
        "api_cpu_s_per_1k_events": 1000 * api_cpu / events if events else None,
        # The load generator (this process) shares the machine: its cost, and how busy the
        # machine's cores were, say whether the API or the machine was the limit.
        "client_cpu_s_per_1k_events": 1000 * client_cpu / events if events else None,
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
    lines = [
        "| streams | events/s | latency p50 ms | latency p99 ms | added gap p99 ms | "
        "API CPU s/1k events | client CPU s/1k events | machine CPU busy | errors | "
        "replay logs kept | replay bytes/event | keys kept/job |",
        "|" + " --- |" * 12,
    ]
    for r in rows:
        lines.append(
            f"| {r['streams']} | {r['events_per_s']:.0f} | {r['latency_p50_ms']:.1f} | "
            f"{r['latency_p99_ms']:.1f} | {r['added_gap_p99_ms']:.1f} | "
            f"{r['api_cpu_s_per_1k_events']:.3f} | {r['client_cpu_s_per_1k_events']:.3f} | "
            f"{100 * r['machine_busy']:.0f}% | {r['errors']} | "
            f"{r['replay_logs_kept']} | {r['replay_bytes_per_event']:.1f} | "
            f"{r['keys_kept_per_job']:.2f} |"
        )
    text = "SYNTHETIC engine (no model), one API process\n\n" + "\n".join(lines)
    (out / "relay.md").write_text(f"Machine: {result['machine']['summary']}\n\n{text}\n")
    print(text)
