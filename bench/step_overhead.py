"""The slot batch's decode step against the bare forward step, side by side in one process.

    python -m bench.step_overhead [MODEL_DIR] [--sizes 1,16,32] [--rounds 3] [--steps 20]

Engine only (no HTTP, no Redis), OpenBLAS preloaded as a worker runs. For each batch size, in
interleaved rounds (each round in a rotated order, so that a noisy machine affects them alike):

- `forward`: the model's forward for that many sequences over mlx-lm KV caches holding the same
  context as the others, then argmax, evaluated every step: the ceiling of any loop around it.
  `forward_graph` is the part of it spent in Python building the graph (no evaluation).
- `batch`: one `SlotBatch.next` (worker/engine/batch/slot_batch.py), greedy, short chat prompts, no
  stop tokens: sampling, bookkeeping, the token read back.
- `engine`: one `Engine.step` over the same (worker/engine/generation/engine.py): also
  detokenizing, stop strings and the step's outputs.
- `closed`: engine-only tokens/s of that many clients each sending 2 short chat prompts for 48
  tokens, one after the other (bench serve's short cell without HTTP): prefill included.

Step figures are the median step (ms) over all rounds; with `--profile`, a cProfile of the engine
steps at the largest size follows on stderr.
"""

from __future__ import annotations

import argparse
import cProfile
import dataclasses
import json
import os
import pstats
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import mlx.core as mx
from mlx_lm.models.cache import make_prompt_cache

from bench.step_cost import story_messages, story_request
from bench.systems import rerun_with_openblas
from shared.queue.config import Settings
from shared.queue.jobs import job_for
from worker.engine.batch.slot_batch import SlotBatch
from worker.engine.batch.token_batch import PREFILL_CHUNK
from worker.engine.batch.types import Entry
from worker.engine.cpu import matvec
from worker.engine.generation.engine import Engine
from worker.engine.model import LoadedModel, load_model
from worker.engine.sequence.sampling import greedy
from worker.runtime.serve import engine_settings

WARM = 4  # steps of each run not counted: the batch's first tokens, shapes compiled


def _prompts(loaded: LoadedModel, size: int) -> list[list[int]]:
    tokenizer = loaded.tokenizer
    return [
        tokenizer.apply_chat_template(story_messages(i), add_generation_prompt=True)
        for i in range(size)
    ]


def forward(loaded: LoadedModel, size: int, steps: int) -> tuple[list[float], list[float]]:
    """Each step's time, and each step's graph-building time, of the bare forward."""
    model = loaded.model
    prompt = _prompts(loaded, 1)[0]
    cache = make_prompt_cache(model)
    mx.eval(model(mx.array([prompt] * size), cache=cache))
    token = mx.zeros((size,), dtype=mx.int32)
    times, graphs = [], []
    for _ in range(WARM + steps):
        started = time.perf_counter()
        logits = model(token[:, None], cache=cache)[:, -1, :]
        token = mx.argmax(logits, axis=-1)
        built = time.perf_counter()
        mx.eval(token)
        times.append(time.perf_counter() - started)
        graphs.append(built - started)
    return times[WARM:], graphs[WARM:]


def batch(
    loaded: LoadedModel, size: int, steps: int, kind: type[SlotBatch] = SlotBatch
) -> list[float]:
    slots = kind(loaded.model, size, frozenset(), PREFILL_CHUNK, False, 8192)
    slots.insert([Entry(p, [], None, 4_000, greedy, []) for p in _prompts(loaded, size)])
    return _timed(lambda: len(slots.next(None)), size, steps)


def _engine(loaded: LoadedModel, size: int) -> Engine:
    never_stops = dataclasses.replace(loaded, stop_ids=frozenset())
    return Engine(never_stops, engine_settings(Settings(batch_size=size, default_max_tokens=4_000)))


def _send(run: Engine, job_id: str, max_tokens: int) -> None:
    run.insert(run.prepare(job_for(job_id, story_request(job_id[1:], max_tokens))))


def engine(loaded: LoadedModel, size: int, steps: int, profile: cProfile.Profile | None) -> Any:
    run = _engine(loaded, size)
    for i in range(size):
        _send(run, f"n{i}", 4_000)

    def step() -> int:
        if profile is None:
            return len(run.step())
        profile.enable()
        got = len(run.step())
        profile.disable()
        return got

    return _timed(step, size, steps)


def closed_loop(loaded: LoadedModel, clients: int, each: int, max_tokens: int) -> float:
    """Generated tokens/s of `clients` clients sending `each` requests one after the other
    (short chat prompts, `max_tokens` each), prefill included."""
    run = _engine(loaded, clients)
    left = {f"c{c}": each - 1 for c in range(clients)}
    started = time.perf_counter()
    for client in left:
        _send(run, f"{client}-r{each}", max_tokens)
    tokens = 0
    while run.active:
        for out in run.step():
            tokens += 1
            client = out.job_id.split("-r")[0]
            if out.ends_job and left[client]:
                _send(run, f"{client}-r{left[client]}", max_tokens)
                left[client] -= 1
    return tokens / (time.perf_counter() - started)


def _timed(step: Callable[[], int], size: int, steps: int) -> list[float]:
    times: list[float] = []
    while len(times) < WARM + steps:
        started = time.perf_counter()
        produced = step()
        elapsed = time.perf_counter() - started
        if produced == size:  # a step with every sequence decoding (prefill steps excluded)
            times.append(elapsed)
    return times[WARM:]


def measure(loaded: LoadedModel, kind: str, size: int, steps: int) -> dict[str, list[float]]:
    """One run of one kind at one batch size: step times (s), or tokens/s for `closed`."""
    if kind == "forward":
        times, graphs = forward(loaded, size, steps)
        return {"forward": times, "forward_graph": graphs}
    if kind == "batch":
        return {"batch": batch(loaded, size, steps)}
    if kind == "engine":
        return {"engine": engine(loaded, size, steps, None)}
    return {"closed": [closed_loop(loaded, size, 2, 48)]}


def summary(size: int, got: dict[str, list[float]]) -> dict[str, float]:
    ms = {k: statistics.median(v) * 1e3 for k, v in got.items() if k != "closed"}
    over = ms["engine"] - ms["forward"]
    return {
        "sequences": size,
        **{f"{k}_ms": round(v, 2) for k, v in ms.items()},
        "overhead_ms": round(over, 2),
        "overhead_pct": round(100 * over / ms["forward"], 1),
        "forward_tok_s": round(size / ms["forward"] * 1e3, 1),
        "engine_tok_s": round(size / ms["engine"] * 1e3, 1),
        "closed_loop_tok_s": round(statistics.median(got["closed"]), 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model", nargs="?", default=str(Settings().models_dir / Settings().model))
    parser.add_argument("--sizes", default="1,16,32")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=20, help="timed steps per run")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument(
        "--no-matvec", action="store_true", help="one-row products by MLX's matmul too"
    )
    args = parser.parse_args()
    native = None if args.no_matvec else matvec.folder(Settings().models_dir)
    loaded = load_model(args.model, native=native)
    sizes = [int(s) for s in args.sizes.split(",")]
    kinds = ["forward", "batch", "engine", "closed"]
    got: dict[int, dict[str, list[float]]] = {s: {} for s in sizes}
    for round_ in range(args.rounds):
        for size in sizes:
            for kind in kinds[round_ % 4 :] + kinds[: round_ % 4]:
                for key, values in measure(loaded, kind, size, args.steps).items():
                    got[size].setdefault(key, []).extend(values)
    rows = [summary(size, got[size]) for size in sizes]
    print(json.dumps({"load_average": os.getloadavg(), "rows": rows}, indent=1))
    if args.profile:
        profile = cProfile.Profile()
        engine(loaded, sizes[-1], args.steps, profile)
        pstats.Stats(profile, stream=sys.stderr).sort_stats("tottime").print_stats(25)


if __name__ == "__main__":
    rerun_with_openblas("bench.step_overhead")
    main()
