"""Where a prefill's time goes on MLX's CPU backend, and what the CPU prefill saves.

    python -m bench.prefill_cost [MODEL_DIR] [--lengths 629,2029] [--rounds 3]

Engine only, OpenBLAS preloaded as a worker runs. Two tables, as JSON:

- `parts`: one layer's pieces for a 512-token chunk of one sequence, at the default model's
  shapes, each the median of 15 evaluations: the weight matrices (BLAS), MLX's attention (its
  softmax included) and MLX's SiLU, against the CPU prefill's NumPy attention and SiLU
  (worker/engine/cpu/exponentials.py).
- `prompts`: the time to a first token of one prompt of each length (512-token chunks, then
  the last token's forward), on the model loaded with MLX's own functions and on the model
  loaded with the CPU prefill, in interleaved rounds (each round in the other order), with the
  greedy first token of each (they must agree).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import time
from collections.abc import Callable
from typing import Any, cast

import mlx.core as mx
from mlx_lm.models import activations
from mlx_lm.models.cache import make_prompt_cache

from bench.systems import rerun_with_openblas
from shared.queue.config import Settings
from worker.engine.batch.token_batch import PREFILL_CHUNK
from worker.engine.cpu import exponentials as cpu_exp
from worker.engine.model import Routes, load_model

CHUNK, WIDTH, HEADS, GROUPS, DIM, HIDDEN = 512, 576, 9, 3, 64, 1536  # SmolLM2-135M


def _median_ms(work: Callable[[], Any], runs: int = 15) -> float:
    for _ in range(3):
        mx.eval(work())
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        mx.eval(work())
        times.append(time.perf_counter() - started)
    return round(statistics.median(times) * 1e3, 2)


def parts() -> dict[str, float]:
    """Milliseconds of each piece of one layer over a 512-token chunk."""
    x = mx.random.normal((1, CHUNK, WIDTH))
    gate = mx.random.normal((1, CHUNK, HIDDEN))
    q = mx.random.normal((1, HEADS, CHUNK, DIM))
    k, v = (mx.random.normal((1, GROUPS, CHUNK, DIM)) for _ in range(2))
    weights = {
        "q": (WIDTH, WIDTH),
        "k": (GROUPS * DIM, WIDTH),
        "v": (GROUPS * DIM, WIDTH),
        "o": (WIDTH, WIDTH),
        "gate": (HIDDEN, WIDTH),
        "up": (HIDDEN, WIDTH),
    }
    mats = {name: mx.random.normal(shape) for name, shape in weights.items()}
    down = mx.random.normal((WIDTH, HIDDEN))
    mx.eval(x, gate, q, k, v, down, *mats.values())

    def matrices() -> list[mx.array]:
        return [x @ w.T for w in mats.values()] + [gate @ down.T]

    def attention(f: Any) -> Callable[[], mx.array]:
        return lambda: f(q, k, v, scale=DIM**-0.5, mask="causal")

    return {
        "weight matrices (7)": _median_ms(matrices),
        "attention, MLX": _median_ms(attention(mx.fast.scaled_dot_product_attention)),
        "attention, CPU prefill": _median_ms(attention(cpu_exp.attention)),
        "swiglu, MLX": _median_ms(lambda: activations.swiglu(gate, gate)),
        "swiglu, CPU prefill": _median_ms(lambda: cpu_exp.swiglu(gate, gate)),
    }


def first_token(model: Any, prompt: list[int]) -> int:
    cache = make_prompt_cache(model)
    for start in range(0, len(prompt) - 1, PREFILL_CHUNK):
        model(mx.array([prompt[start : min(start + PREFILL_CHUNK, len(prompt) - 1)]]), cache=cache)
        mx.eval([c.state for c in cache])
    logits = model(mx.array([prompt[-1:]]), cache=cache)[0, -1]
    return cast(int, mx.argmax(logits).item())


def prompts(models: dict[str, Any], lengths: list[int], rounds: int) -> list[dict[str, Any]]:
    """`models`: the model with MLX's own functions ("mlx") and with the CPU prefill."""
    rows = []
    for length in lengths:
        rng = random.Random(length)
        prompt = [rng.randrange(100, 40_000) for _ in range(length)]
        got: dict[str, list[float]] = {"mlx": [], "cpu prefill": []}
        tokens: dict[str, int] = {}
        for round_ in range(rounds):
            order = ["mlx", "cpu prefill"][:: 1 if round_ % 2 == 0 else -1]
            for kind in order:
                started = time.perf_counter()
                tokens[kind] = first_token(models[kind], prompt)
                got[kind].append(time.perf_counter() - started)
        mlx, ours = (statistics.median(got[k]) for k in ("mlx", "cpu prefill"))
        rows.append(
            {
                "prompt_tokens": length,
                "mlx_s": [round(t, 2) for t in got["mlx"]],
                "cpu_prefill_s": [round(t, 2) for t in got["cpu prefill"]],
                "speedup": round(mlx / ours, 2),
                "same_first_token": tokens["mlx"] == tokens["cpu prefill"],
            }
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model", nargs="?", default=str(Settings().models_dir / Settings().model))
    parser.add_argument("--lengths", default="629,2029")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    # The same weights twice: the exponentials are hooked onto the model they are loaded with.
    models = {
        "mlx": load_model(args.model, Routes(prefill=False, decode=False)).model,
        "cpu prefill": load_model(args.model).model,
    }
    lengths = [int(n) for n in args.lengths.split(",")]
    report = {
        "load_average": os.getloadavg(),
        "parts_ms": parts(),
        "prompts": prompts(models, lengths, args.rounds),
        "load_average_after": os.getloadavg(),
    }
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    rerun_with_openblas("bench.prefill_cost")
    main()
