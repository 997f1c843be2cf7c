"""What the prefix cache's disk tier costs the engine: a cache's write and read, and the decode
step while a write runs on the tier's thread (worker/engine/prefix_disk.py).

`python -m bench.disk_tier_cost [--tokens 2000] [--rounds 6]` loads the default model as a worker
does, prefills one cache of `--tokens` tokens, then for each round times decode steps of a batch
of `--rows` sequences (mlx-lm's batched cache, one token each, as the engine's per-token path
runs) for as long as one write of that cache takes, once with the write running beside them and
once without, in alternating order; then, as long again, a pure-Python loop on the engine's
thread, to see whether a write ever holds the interpreter (the GIL) from it. Printed: the write
and read times, what `put` costs the engine thread, the steps' p50 and p99 with and without a
write, and the loop's longest pause with and without one.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import mlx.core as mx
from mlx_lm.models.cache import make_prompt_cache

from bench.systems import rerun_with_openblas
from shared.queue.config import Settings
from shared.queue.prefix.cache_scope import UNSCOPED
from shared.queue.prefix.prefix_blocks import HeldPrompt
from worker.engine.model import load_model
from worker.engine.prefix_disk import DiskTier
from worker.engine.prefix_identity import probe_layout
from worker.gguf.default_model import ensure_default_model


def _prefilled(model: Any, tokens: int, rows: int = 1) -> list[Any]:
    cache: list[Any] = make_prompt_cache(model)
    prompt = mx.array([[(7 * i) % 1000 + 1 for i in range(tokens)]] * rows)
    for start in range(0, tokens, 512):
        model(prompt[:, start : start + 512], cache=cache)
        mx.eval([c.state for c in cache])
    return cache


def _steps(model: Any, batch: list[Any], until: float) -> list[float]:
    """Decode steps of the batch (then trimmed back) until `until`; each step's seconds."""
    token = mx.zeros((len(batch[0].keys), 1), dtype=mx.int32)
    times: list[float] = []
    while time.perf_counter() < until or not times:
        started = time.perf_counter()
        mx.eval(model(token, cache=batch))
        times.append(time.perf_counter() - started)
        for c in batch:
            c.trim(1)
    return times


def _longest_pause(done: Callable[[], bool]) -> float:
    """The longest time between two turns of a Python loop that runs until `done()`."""
    longest, last = 0.0, time.perf_counter()
    while not done():
        now = time.perf_counter()
        longest, last = max(longest, now - last), now
    return longest


def _holding(tier: DiskTier, files: int) -> Callable[[], bool]:
    return lambda: len(tier.held) == files


def _past(until: float) -> Callable[[], bool]:
    return lambda: time.perf_counter() > until


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--tokens", type=int, default=2000)
    p.add_argument("--rows", type=int, default=8)
    p.add_argument("--rounds", type=int, default=6)
    args = p.parse_args()
    rerun_with_openblas("bench.disk_tier_cost")
    model = load_model(str(ensure_default_model(Settings().models_dir))).model
    cache = _prefilled(model, args.tokens)
    batch = _prefilled(model, 512, args.rows)
    layout = probe_layout(model)
    quiet: list[float] = []
    busy: list[float] = []
    writes: list[float] = []
    reads: list[float] = []
    puts: list[float] = []
    pauses: dict[bool, list[float]] = {False: [], True: []}
    with tempfile.TemporaryDirectory(prefix="bench-disk-tier-") as folder:
        for r in range(args.rounds):
            tier = DiskTier(Path(folder), f"round{r}", layout, 1 << 40, 16)
            tokens = [r, *range(1, args.tokens)]
            for writing in (r % 2 == 0, r % 2 == 1):
                if writing:
                    started = time.perf_counter()
                    tier.put(HeldPrompt(UNSCOPED, tokens), cache)
                    puts.append(time.perf_counter() - started)
                    busy += _steps(model, batch, started + 0.05)
                    while tier.held == ():  # the write ends with the snapshot of what is held
                        busy += _steps(model, batch, 0)
                    writes.append(time.perf_counter() - started)
                else:
                    quiet += _steps(
                        model, batch, time.perf_counter() + statistics.mean(writes or [1])
                    )
            tier.put(
                HeldPrompt(UNSCOPED, [r, 0, *tokens[2:]]), cache
            )  # another write, beside the Python loop
            pauses[True].append(_longest_pause(_holding(tier, 2)))
            until = time.perf_counter() + writes[-1]
            pauses[False].append(_longest_pause(_past(until)))
            started = time.perf_counter()
            restored = tier.restore([*tokens, 5], 0, UNSCOPED)
            reads.append(time.perf_counter() - started)
            assert restored is not None
            tier.close()
    print(f"cache of {args.tokens} tokens: {sum(c.nbytes for c in cache) / 2**20:.0f} MiB")
    print(f"write s (incl. steps beside it): {' '.join(f'{w:.2f}' for w in writes)}")
    print(f"read s: {' '.join(f'{x:.2f}' for x in reads)}")
    print(f"put on the engine thread ms: {' '.join(f'{x * 1e3:.2f}' for x in puts)}")
    for writing, name in ((False, "without a write"), (True, "during a write")):
        longest = " ".join(f"{x * 1e3:.0f}" for x in pauses[writing])
        print(f"Python loop's longest pause {name}, ms: {longest}")
    for name, steps in (("without a write", quiet), ("during a write", busy)):
        print(
            f"decode step of {args.rows} rows {name}: p50 {statistics.median(steps) * 1e3:.1f} ms, "
            f"p99 {_percentile(steps, 99) * 1e3:.1f} ms, max {max(steps) * 1e3:.1f} ms "
            f"({len(steps)} steps)"
        )


if __name__ == "__main__":
    main()
