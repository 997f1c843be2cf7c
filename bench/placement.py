"""`python -m bench placement`: conversations on 1 and 2 real workers, with and without placement.

The workload of issue 23: `--conversations` clients, each with its own document of `--words`
words as the system message, then `--turns` user turns, each sent with the whole history
(streamed, `--max-tokens` new tokens a turn). All conversations send turn k together, so the
fleet's prefix-cache counters (shared/observe/metrics.py) read between turns give the share of
turn 2+ prompt tokens served from cache. Each level is a fresh cluster (worker/ops/cluster.py) on
the default model; "placement off" sets MLXQ_PLACEMENT_WAIT_S=0 (api/queue/placement.py).
Workers on one machine share its cores, so tokens/s with 2 workers says little about a fleet of
Macs; the cache share and the turn 2+ TTFT are what placement changes.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from typing import Any

from bench.load import percentile
from bench.machine import describe
from bench.report import write
from bench.sse_client import StreamRecord, stream_chat
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


@dataclass(frozen=True)
class Row:
    workers: int
    placement: bool
    wall_s: float
    tokens_per_s: float
    ttft_p50_by_turn: list[float | None]
    later_cache_share: float
    followed: int
    overridden_busy: int
    overridden_wait: int
    errors: int


def _document(i: int, words: int) -> str:
    return " ".join(f"{_WORDS[(i * 7 + k) % len(_WORDS)]}{k % 13}" for k in range(words))


def _body(messages: list[dict[str, str]], max_tokens: int) -> dict[str, Any]:
    return {
        "model": MODEL,
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


def _figures(cluster: Cluster) -> dict[str, int]:
    raw: dict[bytes, bytes] = cluster.redis().hgetall(cluster.keys.model_metrics(MODEL))  # type: ignore[assignment]
    fields = {k.decode(): v for k, v in raw.items()}
    return {k: int(float(v)) for k, v in fields.items() if ":" not in k or "success" in k}


def _finished(figures: dict[str, int]) -> int:
    return sum(v for k, v in figures.items() if k.startswith("request_success:"))


def _at_least(cluster: Cluster, finished: int) -> bool:
    return _finished(_figures(cluster)) >= finished


def _turns(cluster: Cluster, args: Any) -> tuple[list[list[StreamRecord]], dict[str, int]]:
    port = int(cluster.api_url.rsplit(":", 1)[1])
    chats = [
        [
            {"role": "system", "content": _document(i, args.words)},
            {"role": "user", "content": "Summarise the document in one line."},
        ]
        for i in range(args.conversations)
    ]
    by_turn: list[list[StreamRecord]] = []
    after_first: dict[str, int] = {}
    for turn in range(args.turns):
        bodies = [_body(c, args.max_tokens) for c in chats]

        async def load(bodies: list[dict[str, Any]] = bodies) -> list[StreamRecord]:
            return await asyncio.gather(*(stream_chat("127.0.0.1", port, b, 600) for b in bodies))

        records = asyncio.run(load())
        by_turn.append(records)
        done = (turn + 1) * len(chats)  # the jobs' figures land just after their last event
        wait_until(partial(_at_least, cluster, done), 30, "the jobs' figures")
        if turn == 0:
            after_first = _figures(cluster)
        for chat, record in zip(chats, records, strict=True):
            chat += [
                {"role": "assistant", "content": "".join(record.chunk_texts)},
                {"role": "user", "content": f"And what about point {turn + 2}?"},
            ]
    return by_turn, after_first


def run_level(workers: int, placement: bool, args: Any) -> Row:
    env = {
        "MLXQ_PLACEMENT_WAIT_S": "2" if placement else "0",
        # A shared, loaded machine can take over a minute for one prefill group of long prompts.
        "MLXQ_WATCHDOG_S": "600",
    }
    cluster = Cluster(namespace=f"benchplace{workers}", heartbeat_s=1.0, model=MODEL, env=env)
    try:
        cluster.start(workers)
        started = time.perf_counter()
        by_turn, first = _turns(cluster, args)
        wall = time.perf_counter() - started
        end = _figures(cluster)
    finally:
        cluster.stop()
    queries = end.get("prefix_cache_queries", 0) - first.get("prefix_cache_queries", 0)
    hits = end.get("prefix_cache_hits", 0) - first.get("prefix_cache_hits", 0)
    records = [r for turn in by_turn for r in turn]
    return Row(
        workers=workers,
        placement=placement,
        wall_s=round(wall, 1),
        tokens_per_s=round(sum(r.tokens() for r in records) / wall, 1),
        ttft_p50_by_turn=[
            percentile([r.ttft for r in turn if r.ttft is not None], 50) for turn in by_turn
        ],
        later_cache_share=round(hits / queries, 3) if queries else 0.0,
        followed=end.get("placement_followed", 0),
        overridden_busy=end.get("placement_overridden_busy", 0),
        overridden_wait=end.get("placement_overridden_wait", 0),
        errors=sum(1 for r in records if r.error),
    )


def table(rows: list[Row]) -> str:
    lines = [
        "| workers | placement | wall s | tok/s | TTFT p50 by turn (s) | later turns' cache share "
        "| followed / busy / waited out | errors |",
        "|" + " --- |" * 8,
    ]
    for r in rows:
        ttft = " / ".join("-" if t is None else f"{t:.2f}" for t in r.ttft_p50_by_turn)
        lines.append(
            f"| {r.workers} | {'on' if r.placement else 'off'} | {r.wall_s} | {r.tokens_per_s} | "
            f"{ttft} | {r.later_cache_share:.2f} | "
            f"{r.followed} / {r.overridden_busy} / {r.overridden_wait} | {r.errors} |"
        )
    return "\n".join(lines)


def add_parser(sub: Any) -> None:
    p = sub.add_parser("placement", help="conversations on 1 and 2 real workers, placement on/off")
    p.add_argument("--workers", default="1,2")
    p.add_argument("--conversations", type=int, default=4)
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--words", type=int, default=400)
    p.add_argument("--max-tokens", type=int, default=32)
    p.set_defaults(func=main)


def main(args: Any) -> None:
    levels = [(int(n), on) for n in args.workers.split(",") for on in (False, True)]
    levels = [(n, on) for n, on in levels if n > 1 or on]  # one worker: nothing to place
    rows = [run_level(n, on, args) for n, on in levels]
    out = Path(args.out)
    result = {"machine": describe(), "args": vars(args) | {"out": str(out)}}
    result["rows"] = [asdict(r) for r in rows]
    result["args"].pop("func", None)
    result["args"]["models_dir"] = str(result["args"]["models_dir"])
    write(out, "placement", result)
    text = (
        f"{args.conversations} conversations x {args.turns} turns, {args.words}-word documents, "
        f"{args.max_tokens} new tokens a turn, default model\n\n{table(rows)}"
    )
    (out / "placement.md").write_text(f"Machine: {result['machine']['summary']}\n\n{text}\n")
    print(text)
