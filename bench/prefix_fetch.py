"""A conversation's next turn on a worker that never saw it: its cache fetched from the worker
holding it (worker/runtime/prefix/prefix_fetch.py), against the same turn prefilled there.

`python -m bench.prefix_fetch [--repeats 2] [--max-tokens 16]` runs one mlxq with two workers of
one slot each, each with a cache folder of its own (two machines on one Redis), once with the
shipped defaults and once with `MLXQ_PREFIX_FETCH=false`. Each repeat:
1. the first turn of a ~2,000-token conversation, cold (whichever worker takes it holds it);
2. a long request continuing that conversation, placed on the holder, fills its slot;
3. the conversation's next turn, which so goes to the other worker: its TTFT and cached tokens.
Printed: a markdown table of the repeats, with the fetch's size and time from the worker's log;
written: bench/results/prefix-fetch.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import tempfile
import threading
from pathlib import Path
from typing import Any

from bench import systems
from bench.load import chat_body
from bench.prompts import TextMaker
from bench.report import markdown_table
from bench.restart import WATCHDOG_S, WORKLOAD, stream_turn, ttft_ms, turns
from bench.sse_client import stream_chat
from shared.queue.config import Settings
from worker.gguf.default_model import ensure_default_model
from worker.ops.cluster import wait_until

NO_END = {"2": -100, "0": -100}  # the default model's end tokens
BUSY_TOKENS = 200
FETCHED = re.compile(r"prefix fetch: (\d+) tokens \(([\d.]+) MB\) from \S+ in ([\d.]+) s")


def _busy(running: systems.Running, messages: list[dict[str, Any]]) -> threading.Thread:
    """A long request of `messages` in a thread of its own, once a worker's slot holds it."""
    body = {**chat_body(running.model, 0, BUSY_TOKENS), "messages": messages}
    body["logit_bias"] = NO_END
    assert running.cluster is not None and running.redis is not None
    taking = [running.cluster.keys.taking(w.worker_id) for w in running.cluster.workers]
    redis = running.redis
    # The first turn's job may still be on its slot's list for a moment after its answer.
    wait_until(lambda: not any(redis.llen(k) for k in taking), 60, "the slots free")
    thread = threading.Thread(
        target=lambda: asyncio.run(stream_chat("127.0.0.1", running.port, body, 900.0))
    )
    thread.start()
    wait_until(lambda: any(redis.llen(k) for k in taking), 60, "the holder's slot taken")
    return thread


def _repeat(
    running: systems.Running, texts: TextMaker, repeat: int, max_tokens: int
) -> dict[str, Any]:
    cold, next_turn = turns(running, texts, f"fetch/{repeat}", max_tokens)
    busy = _busy(running, [*next_turn[:-1], {"role": "user", "content": "Tell a long story."}])
    try:
        taken = stream_turn(running, next_turn, max_tokens)
    finally:
        busy.join()
    return {
        "repeat": repeat,
        "prompt_tokens": taken.prompt_tokens,
        "cached_tokens": taken.cached_tokens,
        "cold_ttft_ms": ttft_ms(cold),
        "next_ttft_ms": ttft_ms(taken),
        "ratio": ttft_ms(taken) / ttft_ms(cold),
    }


def _fetches(logs: Path) -> list[tuple[int, float, float]]:
    """(tokens, MB, seconds) of each fetch the workers logged."""
    log = logs / "worker.log"
    text = log.read_text() if log.exists() else ""
    return [(int(t), float(mb), float(s)) for t, mb, s in FETCHED.findall(text)]


def measure(model: Path, repeats: int, max_tokens: int, fetch: bool) -> list[dict[str, Any]]:
    texts = TextMaker(model)
    with tempfile.TemporaryDirectory(prefix="bench-fetch-") as folder:
        each = [{"MLXQ_PREFIX_CACHE_DIR": f"{folder}/{name}"} for name in ("a", "b")]
        settings = {
            "MLXQ_PREFIX_FETCH": "true" if fetch else "false",
            "MLXQ_WATCHDOG_S": WATCHDOG_S,
        }
        with systems.mlxq(model, batch_size=1, settings=settings, each=each) as running:
            rows = [_repeat(running, texts, r, max_tokens) for r in range(repeats)]
            assert running.cluster is not None and running.cluster.logs is not None
            fetched = _fetches(running.cluster.logs)
    for row in rows:
        row["fetch"] = fetch
    if len(fetched) == len(rows):  # else which fetch served which repeat is not known
        for row, (tokens, mb, seconds) in zip(rows, fetched, strict=True):
            row |= {"fetched_tokens": tokens, "fetched_mb": mb, "fetch_s": seconds}
    return rows


def markdown(rows: list[dict[str, Any]]) -> list[str]:
    headings = [
        "next turn",
        "repeat",
        "prompt tokens",
        "cached tokens",
        "cold TTFT ms",
        "next-turn TTFT ms",
        "next / cold",
        "fetched MB in s",
    ]
    cells = [
        [
            "fetched" if r["fetch"] else "prefilled (fetch off)",
            str(r["repeat"]),
            str(r["prompt_tokens"]),
            str(r["cached_tokens"]),
            f"{r['cold_ttft_ms']:.0f}",
            f"{r['next_ttft_ms']:.0f}",
            f"{r['ratio']:.3f}",
            f"{r['fetched_mb']:.1f} in {r['fetch_s']:.2f}" if "fetched_mb" in r else "-",
        ]
        for r in rows
    ]
    return markdown_table(headings, cells)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--out", default="bench/results/prefix-fetch.json")
    args = parser.parse_args()
    model = ensure_default_model(Settings().models_dir)
    rows = [
        row
        for fetch in (True, False)
        for row in measure(model, args.repeats, args.max_tokens, fetch)
    ]
    Path(args.out).write_text(json.dumps({"workload": WORKLOAD.name, "rows": rows}, indent=1))
    print("\n".join(markdown(rows)))


if __name__ == "__main__":
    systems.rerun_with_openblas("bench.prefix_fetch")
    main()
