"""mlxq's slot batch against mlx-lm's BatchGenerator, side by side in one process (issue 21).

    python scripts/batch_compare.py [MODEL_DIR] [--rounds 2] [--long-clients 8]

Runs each measurement on both batches (worker/engine/batch/token_batch.py), alternating which goes
first,
with OpenBLAS preloaded as a worker runs, and prints one JSON object:
- `decode`: the per-token path, a decode step of 16 sequences (short prompts), median ms;
- `join`: 16 sequences running at 2,000 tokens of context, 4 prompts of 256 tokens join; the
  steps' time from the join until all 4 have their first token, against a decode step of the
  16 plus those 4 prompts' prefill alone (the running rows' KV comes from one prefill, copied),
  and how far MLX's peak memory rose above what was in use during the join;
- `long`: closed-loop clients, each sending its own 629-token prompt for 48 tokens
  (`--per-client` times): generated tokens/s, TTFT p50 and inter-token gap p99 (engine only:
  no HTTP, no detokenizing).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import mlx.core as mx  # noqa: E402
from mlx_lm.models.cache import make_prompt_cache  # noqa: E402

from shared.queue.config import Settings  # noqa: E402
from worker.engine.batch.token_batch import PREFILL_CHUNK, TokenBatch, open_batch  # noqa: E402
from worker.engine.batch.types import Entry  # noqa: E402
from worker.engine.model import load_model  # noqa: E402
from worker.engine.sequence.sampling import greedy  # noqa: E402
from worker.runtime.blas import openblas_env  # noqa: E402

KINDS = ("mlx-lm", "slots")
NO_STOPS: frozenset[int] = frozenset()  # every sequence runs to its limit


def _prompt(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(100, 40000) for _ in range(n)]


def _entry(prompt: list[int], max_tokens: int, cached: int = 0, cache: Any = None) -> Entry:
    return Entry(prompt[cached:], prompt[:cached], cache, max_tokens, greedy, [])


def _batch(model: Any, kind: str, slots: int) -> TokenBatch:
    return open_batch(model, slots, NO_STOPS, kind, keep_caches=False, positions=8192)


def decode(model: Any, kind: str) -> float:
    rng = random.Random(1)
    batch = _batch(model, kind, 16)
    batch.insert([_entry(_prompt(rng, 40), 60) for _ in range(16)])
    steps = []
    for _ in range(45):
        started = time.perf_counter()
        out = batch.next(None)
        if len(out) == 16 and not any(t.finish_reason for t in out):
            steps.append(time.perf_counter() - started)
    return statistics.median(steps[5:]) * 1e3


def join(
    model: Any, kind: str, context: list[int], cache: list[Any], prompt: int
) -> dict[str, float]:
    rng = random.Random(2)
    batch = _batch(model, kind, 20)
    running = [[*context, rng.randrange(100, 40000)] for _ in range(16)]
    batch.insert([_entry(p, 400, len(context), copy.deepcopy(cache)) for p in running])
    steps = []
    for _ in range(6):
        started = time.perf_counter()
        batch.next(None)
        steps.append(time.perf_counter() - started)
    step = statistics.median(steps[2:])
    mx.synchronize()
    in_use = mx.get_active_memory()
    mx.reset_peak_memory()
    uids = set(batch.insert([_entry(_prompt(rng, prompt), 400) for _ in range(4)]))
    started = time.perf_counter()
    count = 0
    while uids:
        count += 1
        uids -= {t.uid for t in batch.next(None)}
    took = time.perf_counter() - started
    extra = (mx.get_peak_memory() - in_use) / 2**20
    return {"decode_ms": step * 1e3, "join_s": took, "join_steps": count, "peak_extra_mib": extra}


def prefill_alone(model: Any, prompt: int) -> float:
    rng = random.Random(2)
    prompts = [_prompt(rng, prompt) for _ in range(4)]
    started = time.perf_counter()
    for prompt in prompts:
        cache = make_prompt_cache(model)
        model(mx.array([prompt]), cache=cache)
        mx.eval([c.keys for c in cache])
    return time.perf_counter() - started


def long(model: Any, kind: str, clients: int, budget: int, each: int) -> dict[str, float]:
    rng = random.Random(3)
    batch = _batch(model, kind, 16)
    left = {c: each for c in range(clients)}
    owner: dict[int, int] = {}
    sent: dict[int, float] = {}
    last: dict[int, float] = {}
    ttft, gaps, tokens = [], [], 0

    def send(client: int) -> None:
        left[client] -= 1
        (uid,) = batch.insert([_entry(_prompt(rng, 629), 48)])
        owner[uid], sent[uid] = client, time.perf_counter()

    started = time.perf_counter()
    for client in range(clients):
        send(client)
    while owner:
        for token in batch.next(budget):
            now = time.perf_counter()
            tokens += 1
            if token.uid in last:
                gaps.append(now - last[token.uid])
            else:
                ttft.append(now - sent[token.uid])
            last[token.uid] = now
            if token.finish_reason is not None:
                client = owner.pop(token.uid)
                if left[client]:
                    send(client)
    wall = time.perf_counter() - started
    return {
        "tok_s": tokens / wall,
        "ttft_p50_s": statistics.median(ttft),
        "gap_p99_s": statistics.quantiles(gaps, n=100)[98],
        "wall_s": wall,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model", nargs="?", default=str(Settings().models_dir / Settings().model))
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--long-clients", type=int, default=8)
    parser.add_argument("--per-client", type=int, default=2, help="long prompts each client sends")
    parser.add_argument("--budgets", default=f"{Settings().prefill_tokens},{PREFILL_CHUNK}")
    parser.add_argument("--join-prompt", type=int, default=256, help="tokens of each joining")
    parser.add_argument("--kinds", default=",".join(KINDS), help="batches, in first-round order")
    parser.add_argument("--skip", default="", help="comma-separated: decode,join,long")
    args = parser.parse_args()
    skip = set(args.skip.split(","))
    model = load_model(args.model).model
    results: dict[str, Any] = {"decode": {}, "join": {}, "long": {}}
    rng = random.Random(0)
    context = _prompt(rng, 2000)
    cache = make_prompt_cache(model)
    if "join" not in skip:
        for start in range(0, len(context), PREFILL_CHUNK):
            model(mx.array([context[start : start + PREFILL_CHUNK]]), cache=cache)
            mx.eval([c.keys for c in cache])
        results["prefill_4_alone_s"] = [prefill_alone(model, args.join_prompt) for _ in range(2)]
    for round_ in range(args.rounds):
        kinds = args.kinds.split(",")
        for kind in kinds if round_ % 2 == 0 else kinds[::-1]:
            if "decode" not in skip:
                results["decode"].setdefault(kind, []).append(decode(model, kind))
            if "join" not in skip:
                results["join"].setdefault(kind, []).append(
                    join(model, kind, context, cache, args.join_prompt)
                )
            for budget in [] if "long" in skip else [int(b) for b in args.budgets.split(",")]:
                row = long(model, kind, args.long_clients, budget, args.per_client)
                results["long"].setdefault(f"{kind} budget {budget}", []).append(row)
            print(json.dumps({"round": round_, "kind": kind, **results}), file=sys.stderr)
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    lacking = openblas_env()
    if lacking:
        os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, **lacking})
    main()
