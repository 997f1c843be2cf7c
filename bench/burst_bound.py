"""The most tokens/s any server could stream to a burst of short prompts on this machine.

`bench serve`'s ceiling, the forward step, decodes only. A burst of c clients, each sending
requests of p prompt tokens for m new tokens, also needs each request's prompt prefilled: at
best, the wave's prompts prefilled in the cheapest groups (prefill(c, p): the least time over
forwards of 4, 8, 16 or 32 prompts at once), then m decode steps of all c. So no server can beat
c x m / (prefill(c, p) + m x step(c)), with both forwards timed here as the worker loads the
model (worker/engine/model.py: its CPU fast paths included).

`python -m bench.burst_bound [--clients 16] [--prompt 69,44] [--max-tokens 48]` prints, for each
prompt length p (the cell's whole prompt, and what is left when a prefix cache holds the chat
template's opening), the prefill's seconds, the step's, and the bound against the bare step's
tokens/s.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import mlx.core as mx
from mlx_lm.models.cache import make_prompt_cache

from bench.engine_only import forward
from bench.systems import rerun_with_openblas
from shared.queue.config import Settings
from worker.engine.cpu import matvec
from worker.engine.model import load_model
from worker.gguf.default_model import ensure_default_model

RUNS = 3
GROUPS = (4, 8, 16, 32)


def prefill_s(model: Any, clients: int, tokens: int) -> float:
    """The median time of one forward over `clients` prompts of `tokens` tokens, cache empty."""
    prompts = mx.array([[(7 * i + r) % 1000 + 1 for i in range(tokens)] for r in range(clients)])
    times = []
    for _ in range(RUNS + 1):  # the first warms the shape up
        cache = make_prompt_cache(model)
        started = time.perf_counter()
        mx.eval(model(prompts, cache=cache)[:, -1, :])
        times.append(time.perf_counter() - started)
    return statistics.median(times[1:])


def cheapest_prefill_s(model: Any, clients: int, tokens: int) -> float:
    """The least time to prefill `clients` prompts of `tokens` tokens, in groups of one size."""
    sizes = [k for k in GROUPS if k <= clients] or [clients]
    return min(-(-clients // k) * prefill_s(model, k, tokens) for k in sizes)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--prompt", default="69,44", help="prompt tokens per request")
    parser.add_argument("--max-tokens", type=int, default=48)
    args = parser.parse_args()
    folder = ensure_default_model(Settings().models_dir)
    model = load_model(str(folder), native=matvec.folder(Settings().models_dir)).model
    c, m = args.clients, args.max_tokens
    print(
        "| prompt tokens | prefill s | step ms | bound tok/s | forward step tok/s | bound / step |"
    )
    print("| --- | --- | --- | --- | --- | --- |")
    for p in (int(x) for x in args.prompt.split(",")):
        step = forward(model, {"batch": c, "context": p + m // 2})
        wave_s = cheapest_prefill_s(model, c, p) + m * step["step_ms"] / 1e3
        bound = c * m / wave_s
        print(
            f"| {p} | {wave_s - m * step['step_ms'] / 1e3:.2f} | {step['step_ms']:.1f} "
            f"| {bound:.1f} | {step['tokens_per_s']:.1f} | {bound / step['tokens_per_s']:.2f} |"
        )


if __name__ == "__main__":
    rerun_with_openblas("bench.burst_bound")
    main()
