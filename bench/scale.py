"""`python -m bench scale`: throughput as SYNTHETIC workers are added, all on this machine.

For each worker count N, a fresh cluster (worker/ops/cluster.py): one redis-server, one API
process (gunicorn, one gthread worker) and N workers running the synthetic engine
(worker/engine/doubles/synthetic.py: one token per sequence every `--step-ms`, no model). The load
generator (this process, bench/sse_client.py) keeps every slot busy: N x `--slots` streams of
`--tokens` tokens each, all sent at once. Measured per N:
- tokens/s through HTTP, against N times the one-worker figure (the target: at least 0.9 x N);
- Redis commands per token (INFO stats), and the CPU of each part per 1,000 tokens: the API
  process, Redis, the workers together and the load generator, so the part that saturates
  first can be named with its numbers.
"""

from __future__ import annotations

import asyncio
import resource
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tqdm import tqdm

from bench import systems
from bench.load import chat_body
from bench.machine import describe
from bench.report import markdown_table, write
from bench.sse_client import StreamRecord, stream_chat
from worker.ops.cluster import Cluster

MODEL = "synthetic"


@dataclass(frozen=True)
class Row:
    workers: int
    streams: int
    errors: int
    tokens: int
    wall_s: float
    tokens_per_s: float
    redis_commands_per_token: float
    api_cpu_s_per_1k: float
    redis_cpu_s_per_1k: float
    workers_cpu_s_per_1k: float
    client_cpu_s_per_1k: float


def _own_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _commands(cluster: Cluster) -> int:
    return int(cluster.redis().info("stats")["total_commands_processed"])


def _cpu(cluster: Cluster) -> dict[str, float]:
    assert cluster.api_proc is not None and cluster.redis_proc is not None
    return {
        "api": systems.cpu_seconds([cluster.api_proc.pid, *cluster.api_worker_pids()]),
        "redis": systems.cpu_seconds([cluster.redis_proc.pid]),
        "workers": systems.cpu_seconds([w.pid for w in cluster.workers]),
        "client": _own_cpu_s(),
    }


def measure(cluster: Cluster, workers: int, slots: int, tokens: int) -> Row:
    port = int(cluster.api_url.rsplit(":", 1)[1])

    async def load() -> list[StreamRecord]:
        bodies = [chat_body(MODEL, i, tokens) for i in range(workers * slots)]
        return await asyncio.gather(*(stream_chat("127.0.0.1", port, b, 600) for b in bodies))

    cpu_before, commands_before = _cpu(cluster), _commands(cluster)
    started = time.perf_counter()
    records = asyncio.run(load())
    wall = time.perf_counter() - started
    cpu_after, commands = _cpu(cluster), _commands(cluster) - commands_before
    ok = [r for r in records if r.error is None]
    n = sum(r.tokens() for r in ok)

    def per_1k(part: str) -> float:
        return 1000 * (cpu_after[part] - cpu_before[part]) / n if n else float("nan")

    return Row(
        workers=workers,
        streams=len(records),
        errors=len(records) - len(ok),
        tokens=n,
        wall_s=wall,
        tokens_per_s=n / wall,
        redis_commands_per_token=commands / n if n else float("nan"),
        api_cpu_s_per_1k=per_1k("api"),
        redis_cpu_s_per_1k=per_1k("redis"),
        workers_cpu_s_per_1k=per_1k("workers"),
        client_cpu_s_per_1k=per_1k("client"),
    )


def run_level(workers: int, args: Any) -> Row:
    env = {
        "MLXQ_ENGINE": "synthetic",
        "MLXQ_SYNTHETIC_STEP_S": str(args.step_ms / 1000),
        "MLXQ_BATCH_SIZE": str(args.slots),
        "MLXQ_API_CONNECTIONS": str(workers * args.slots + 64),
        "MLXQ_QUEUE_CAP": str(10 * workers * args.slots),
    }
    cluster = Cluster(namespace="scale", heartbeat_s=2.0, model=MODEL, env=env)
    try:
        cluster.start_api_first(workers)
        return measure(cluster, workers, args.slots, args.tokens)
    finally:
        cluster.stop()


def table(rows: list[Row]) -> str:
    base = rows[0].tokens_per_s / rows[0].workers
    head = ["workers", "streams", "tokens/s", "x one worker", "target 0.9 x N"]
    head += ["Redis cmds/token", "API CPU s/1k tok", "Redis CPU s/1k", "workers CPU s/1k"]
    head += ["client CPU s/1k", "errors"]
    cells = [
        [
            str(r.workers),
            str(r.streams),
            f"{r.tokens_per_s:.0f}",
            f"{r.tokens_per_s / base:.2f}",
            f"{0.9 * r.workers:.1f}",
            f"{r.redis_commands_per_token:.2f}",
            f"{r.api_cpu_s_per_1k:.3f}",
            f"{r.redis_cpu_s_per_1k:.3f}",
            f"{r.workers_cpu_s_per_1k:.3f}",
            f"{r.client_cpu_s_per_1k:.3f}",
            str(r.errors),
        ]
        for r in rows
    ]
    return "\n".join(markdown_table(head, cells))


def main(args: Any) -> None:
    counts = [int(n) for n in args.workers.split(",")]
    rows = [run_level(n, args) for n in tqdm(counts, desc="scale (synthetic engine)", unit="level")]
    out = Path(args.out)
    result = {
        "machine": describe(),
        "engine": "SYNTHETIC",
        "step_ms": args.step_ms,
        "slots": args.slots,
        "tokens": args.tokens,
        "rows": [asdict(r) for r in rows],
    }
    write(out, "scale", result)
    text = (
        f"SYNTHETIC engine (no model), {args.slots} slots per worker, one token per slot every "
        f"{args.step_ms:g} ms; one API process\n\n{table(rows)}"
    )
    (out / "scale.md").write_text(f"Machine: {result['machine']['summary']}\n\n{text}\n")
    print(text)
