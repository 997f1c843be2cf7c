"""`python -m bench placement`: conversations on 1, 2, 4... workers, with and without placement.

Two workloads (`--workload`):
- `conversations` (issue 23's): `--conversations` clients, each with its own document of
  `--words` words as the system message, then `--turns` user turns, each sent with the whole
  history (streamed, `--max-tokens` new tokens a turn).
- `shared-system`: the same, but every conversation starts with one and the same document (a
  long shared system prompt) and asks its own questions. One request with that prompt runs
  first, so that one worker holds it before the conversations start: a popular prefix that,
  followed blindly, would pin all of them on that worker (the hot-spot rule of
  api/queue/placement.py is what spreads them; jobs per worker show whether it does).

All conversations send turn k together, so the fleet's prefix-cache counters
(shared/observe/metrics.py) read between turns give the share of turn 2+ prompt tokens served
from cache, and the recent-jobs list gives the worker of each turn's jobs. Each level is a
fresh cluster (worker/ops/cluster.py); "placement off" sets MLXQ_PLACEMENT_WAIT_S=0.

`--engine mlx` runs the default model: workers on one machine share its cores, so with 2 or 4
workers on 2 cores it measures placement under CPU contention. `--engine synthetic` runs
SYNTHETIC workers that model prefill (worker/engine/doubles/synthetic_prefill.py: the default
model's
tokenizer, a prefix cache, `--prefill-ms` per uncached prompt token and `--step-ms` per decode
step, both slept, not computed), so placement is measured apart from CPU contention.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections import Counter
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from typing import Any

from bench.load import percentile
from bench.machine import describe
from bench.report import markdown_table, write
from bench.sse_client import StreamRecord, stream_chat
from shared.observe.metrics import JobRecord
from worker.ops.cluster import Cluster, wait_until

MODEL = "SmolLM2-135M-Instruct"
_WORDS = [
    "depot",
    "shipment",
    "ledger",
    "harbour",
    "crane",
    "invoice",
    "pallet",
    "route",
    "driver",
    "customs",
]
Chat = list[dict[str, str]]


@dataclass(frozen=True)
class Row:
    workers: int
    placement: bool
    wall_s: float
    tokens_per_s: float
    ttft_p50_by_turn: list[float | None]
    later_ttft_p50: float | None  # turns 2+ together, as the client saw it
    # The same from each job's enqueue, as its worker recorded it: without the API's work on the
    # request (rendering and counting the whole history), which grows with a loaded machine.
    later_queued_ttft_p50: float | None
    later_cache_share: float
    followed: int
    overridden_busy: int
    overridden_wait: int
    spread: int  # placed on the least loaded worker (no holder, or a busy one)
    first_turn_jobs_per_worker: list[int]  # most first
    jobs_per_worker: list[int]  # every turn; most first
    errors: int
    load_average: float  # one minute, as the level ended


def _document(i: int, words: int) -> str:
    return " ".join(f"{_WORDS[(i * 7 + k) % len(_WORDS)]}{k % 13}" for k in range(words))


def _body(messages: Chat, max_tokens: int) -> dict[str, Any]:
    return {
        "model": MODEL,
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


def _openings(args: Any) -> list[Chat]:
    """Each conversation's first turn: its own document, or the one shared system prompt."""
    shared = args.workload == "shared-system"
    return [
        [
            {"role": "system", "content": _document(0 if shared else i, args.words)},
            {"role": "user", "content": f"Question {i}: summarise the document in one line."},
        ]
        for i in range(args.conversations)
    ]


def _figures(cluster: Cluster) -> dict[str, int]:
    raw: dict[bytes, bytes] = cluster.redis().hgetall(cluster.keys.model_metrics(MODEL))  # type: ignore[assignment]
    fields = {k.decode(): v for k, v in raw.items()}
    return {k: int(float(v)) for k, v in fields.items() if ":" not in k or "success" in k}


def _finished(figures: dict[str, int]) -> int:
    return sum(v for k, v in figures.items() if k.startswith("request_success:"))


def _at_least(cluster: Cluster, finished: int) -> bool:
    return _finished(_figures(cluster)) >= finished


def _newest_jobs(cluster: Cluster, count: int) -> list[JobRecord]:
    rows = cluster.redis().lrange(cluster.keys.recent_jobs(), 0, count - 1)
    return [JobRecord.model_validate_json(r) for r in rows]


def _send(port: int, chats: list[Chat], max_tokens: int) -> list[StreamRecord]:
    bodies = [_body(c, max_tokens) for c in chats]

    async def load() -> list[StreamRecord]:
        return await asyncio.gather(*(stream_chat("127.0.0.1", port, b, 600) for b in bodies))

    return asyncio.run(load())


@dataclass
class Turns:
    """What the conversations saw, turn by turn, and the fleet's figures after turn 1."""

    records: list[list[StreamRecord]]
    jobs: list[list[JobRecord]]  # each turn's, as their workers recorded them
    after_first: dict[str, int]


def _turns(cluster: Cluster, args: Any) -> Turns:
    port = int(cluster.api_url.rsplit(":", 1)[1])
    chats = _openings(args)
    done = 0
    if args.workload == "shared-system":  # one worker holds the popular prefix first
        _send(port, chats[:1], args.max_tokens)
        done = 1
    seen = Turns([], [], {})
    for turn in range(args.turns):
        records = _send(port, chats, args.max_tokens)
        done += len(chats)  # the jobs' figures land just after their last event
        wait_until(partial(_at_least, cluster, done), 30, "the jobs' figures")
        seen.records.append(records)
        seen.jobs.append(_newest_jobs(cluster, len(chats)))
        if turn == 0:
            seen.after_first = _figures(cluster)
        for chat, record in zip(chats, records, strict=True):
            chat += [
                {"role": "assistant", "content": "".join(record.chunk_texts)},
                {"role": "user", "content": f"And what about point {turn + 2}?"},
            ]
    return seen


def _engine_env(args: Any) -> dict[str, str]:
    if args.engine == "mlx":
        return {}
    return {
        "MLXQ_ENGINE": "synthetic",
        "MLXQ_SYNTHETIC_STEP_S": str(args.step_ms / 1000),
        "MLXQ_SYNTHETIC_PREFILL_S_PER_TOKEN": str(args.prefill_ms / 1000),
    }


def _spread(ids: list[str], workers: list[str]) -> list[int]:
    """Jobs per worker, most first; a worker that ran none counts 0."""
    counts = Counter(workers)
    return sorted((counts[w] for w in ids), reverse=True)


def run_level(workers: int, placement: bool, args: Any) -> Row:
    env = {
        "MLXQ_PLACEMENT_WAIT_S": "2" if placement else "0",
        "MLXQ_BATCH_SIZE": str(args.slots),
        # A shared, loaded machine can take over a minute for one prefill group of long prompts.
        "MLXQ_WATCHDOG_S": "600",
        **_engine_env(args),
    }
    cluster = Cluster(namespace=f"benchplace{workers}", heartbeat_s=1.0, model=MODEL, env=env)
    try:
        cluster.start_api_first(workers)
        ids = [w.worker_id for w in cluster.workers]
        started = time.perf_counter()
        seen = _turns(cluster, args)
        wall = time.perf_counter() - started
        end = _figures(cluster)
    finally:
        cluster.stop()
    first = seen.after_first
    queries = end.get("prefix_cache_queries", 0) - first.get("prefix_cache_queries", 0)
    hits = end.get("prefix_cache_hits", 0) - first.get("prefix_cache_hits", 0)
    records = [r for turn in seen.records for r in turn]
    later = [r.ttft for turn in seen.records[1:] for r in turn if r.ttft is not None]
    queued = [j.ttft_s for turn in seen.jobs[1:] for j in turn if j.ttft_s is not None]
    return Row(
        workers=workers,
        placement=placement,
        wall_s=round(wall, 1),
        tokens_per_s=round(sum(r.tokens() for r in records) / wall, 1),
        ttft_p50_by_turn=[
            percentile([r.ttft for r in turn if r.ttft is not None], 50) for turn in seen.records
        ],
        later_ttft_p50=percentile(later, 50),
        later_queued_ttft_p50=percentile(queued, 50),
        later_cache_share=round(hits / queries, 3) if queries else 0.0,
        followed=end.get("placement_followed", 0),
        overridden_busy=end.get("placement_overridden_busy", 0),
        overridden_wait=end.get("placement_overridden_wait", 0),
        spread=end.get("placement_spread", 0),
        first_turn_jobs_per_worker=_spread(ids, [j.worker for j in seen.jobs[0]]),
        jobs_per_worker=_spread(ids, [j.worker for turn in seen.jobs for j in turn]),
        errors=sum(1 for r in records if r.error),
        load_average=round(os.getloadavg()[0], 1),
    )


def _against(value: float | None, base: float | None) -> str:
    """A figure, and what it is against the one-worker one."""
    if value is None:
        return "-"
    return f"{value:.2f}" + (f" ({value / base:.2f}x)" if base else "")


def table(rows: list[Row]) -> str:
    one = next((r for r in rows if r.workers == 1), None)
    head = ["workers", "placement", "wall s", "TTFT p50 by turn (s)"]
    head += ["turns 2+ TTFT p50 s (x one worker)", "the same from enqueue"]
    head += ["later turns' cache share", "followed / busy / waited out / spread"]
    head += ["jobs per worker: turn 1; all turns", "errors", "load avg"]
    cells = []
    for r in rows:
        ttft = " / ".join("-" if t is None else f"{t:.2f}" for t in r.ttft_p50_by_turn)
        later = _against(r.later_ttft_p50, one.later_ttft_p50 if one else None)
        queued = _against(r.later_queued_ttft_p50, one.later_queued_ttft_p50 if one else None)
        per_worker = (
            f"{' '.join(map(str, r.first_turn_jobs_per_worker))}; "
            f"{' '.join(map(str, r.jobs_per_worker))}"
        )
        outcomes = f"{r.followed} / {r.overridden_busy} / {r.overridden_wait} / {r.spread}"
        cells.append(
            [
                str(r.workers),
                "on" if r.placement else "off",
                str(r.wall_s),
                ttft,
                later,
                queued,
                f"{r.later_cache_share:.2f}",
                outcomes,
                per_worker,
                str(r.errors),
                str(r.load_average),
            ]
        )
    return "\n".join(markdown_table(head, cells))


def add_parser(sub: Any) -> None:
    p = sub.add_parser("placement", help="conversations over several workers, placement on/off")
    p.add_argument("--engine", choices=("mlx", "synthetic"), default="mlx")
    p.add_argument(
        "--workload", choices=("conversations", "shared-system"), default="conversations"
    )
    p.add_argument("--workers", default="1,2")
    p.add_argument("--placement", default="off,on", help="one worker runs 'on' only")
    p.add_argument("--conversations", type=int, default=4)
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--words", type=int, default=400)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--slots", type=int, default=16, help="MLXQ_BATCH_SIZE of each worker")
    p.add_argument("--step-ms", type=float, default=100.0, help="synthetic: one decode step")
    p.add_argument(
        "--prefill-ms", type=float, default=4.4, help="synthetic: one uncached prompt token"
    )
    p.set_defaults(func=main)


def _describe(args: Any) -> str:
    engine = (
        "the default model"
        if args.engine == "mlx"
        else f"SYNTHETIC workers (decode step {args.step_ms:g} ms, prefill {args.prefill_ms:g} ms "
        "per uncached prompt token, the default model's tokenizer)"
    )
    documents = (
        "one shared" if args.workload == "shared-system" else "its own"
    ) + f" {args.words}-word document"
    return (
        f"{args.workload}: {args.conversations} conversations x {args.turns} turns, "
        f"{documents}, {args.max_tokens} new tokens a turn, {args.slots} slots per worker; "
        f"{engine}"
    )


def main(args: Any) -> None:
    modes = [m.strip() == "on" for m in args.placement.split(",")]
    levels = [(int(n), on) for n in args.workers.split(",") for on in modes]
    levels = [(n, on) for n, on in levels if n > 1 or on]  # one worker: nothing to place
    rows = [run_level(n, on, args) for n, on in levels]
    out = Path(args.out)
    name = f"placement-{args.engine}-{args.workload}"
    result = {"machine": describe(), "args": vars(args) | {"out": str(out)}}
    result["rows"] = [asdict(r) for r in rows]
    result["args"].pop("func", None)
    result["args"]["models_dir"] = str(result["args"]["models_dir"])
    write(out, name, result)
    text = f"{_describe(args)}\n\n{table(rows)}"
    (out / f"{name}.md").write_text(f"Machine: {result['machine']['summary']}\n\n{text}\n")
    print(text, flush=True)
