"""The baselines: mlx-lm alone in this process (no HTTP, Redis or queues) and the bare forward step.

Run as `python -m bench.engine_only MODEL_DIR`: a long-lived process that loads the model once,
warms up with a real generation, then answers one JSON request per line on stdin with one JSON
line on stdout, so that the benchmark can time it between the servers, in the same rotation
(bench/serve.py, bench/baseline.py):

- `{"op": "engine", "prompts": [messages, ...], "batch": c, "max_tokens": m}`: mlx-lm's
  BatchGenerator on these chat prompts, c at a time; generated tokens/s.
- `{"op": "forward", "batch": c, "context": n}`: the model's forward step for c sequences whose
  KV cache already holds n tokens, greedy, each step's token fed to the next: the ceiling any
  loop around this model reaches on this machine (decode only, no prefill, no sampling beyond
  argmax, no detokenizing). The model is loaded as mlxq's worker loads it
  (worker/engine/model.py: on the CPU, its exponentials and its products of a few rows), the
  fastest forward of it here, and so a ceiling for every system; mlx-lm's forward, which the
  peers run, is slower at 1 to 8 sequences. Timed as a server would run it, without waiting on
  each step (mlx evaluates asynchronously, as mlx-lm's own loop does), over RUNS runs of STEPS
  steps; the figure is the median run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any

import mlx.core as mx
from mlx_lm import load
from mlx_lm.generate import BatchGenerator
from mlx_lm.models.cache import make_prompt_cache

from shared.queue.config import Settings
from worker.engine.cpu import matvec
from worker.engine.model import load_model

STEPS = 32
RUNS = 3
WARMUP = [{"role": "user", "content": "Say hello in one short sentence."}]


def engine(model: Any, tokenizer: Any, request: dict[str, Any]) -> dict[str, float]:
    batch = int(request["batch"])
    prompts = [
        tokenizer.apply_chat_template(m, add_generation_prompt=True) for m in request["prompts"]
    ]
    gen = BatchGenerator(model, completion_batch_size=batch, prefill_batch_size=min(batch, 8))
    started = time.perf_counter()
    gen.insert(prompts, max_tokens=[int(request["max_tokens"])] * len(prompts))
    tokens = 0
    while responses := gen.next_generated():
        tokens += len(responses)
    wall = time.perf_counter() - started
    gen.close()
    return {"tokens_per_s": tokens / wall, "tokens": tokens, "wall_s": wall}


def _filled_cache(model: Any, batch: int, context: int) -> list[Any]:
    """A KV cache of `batch` rows already holding `context` tokens (zeros: the step's cost does
    not depend on the values), with room for the timed steps so that none of them grows it."""
    cache = make_prompt_cache(model)
    mx.eval(model(mx.ones((1, 1), dtype=mx.int32), cache=cache))  # learn the layers' shapes
    capacity = -(-(context + STEPS + 1) // 256) * 256
    for layer in cache:
        _, heads, _, k_dim = layer.keys.shape
        v_dim = layer.values.shape[3]
        layer.keys = mx.zeros((batch, heads, capacity, k_dim), layer.keys.dtype)
        layer.values = mx.zeros((batch, heads, capacity, v_dim), layer.values.dtype)
        layer.offset = context
    mx.eval([(layer.keys, layer.values) for layer in cache])
    return list(cache)


def forward(model: Any, request: dict[str, Any]) -> dict[str, float]:
    batch, context = int(request["batch"]), int(request["context"])
    cache = _filled_cache(model, batch, context)
    runs = []
    for _ in range(RUNS + 1):  # the first run warms this shape up and is not counted
        for layer in cache:
            layer.offset = context
        token = mx.ones((batch,), dtype=mx.int32)
        started = time.perf_counter()
        for _ in range(STEPS):
            token = mx.argmax(model(token[:, None], cache=cache)[:, -1, :], axis=-1)
            mx.async_eval(token)
        mx.eval(token)
        runs.append((time.perf_counter() - started) / STEPS)
    step_s = statistics.median(runs[1:])
    spread = (max(runs[1:]) - min(runs[1:])) / step_s
    return {"tokens_per_s": batch / step_s, "step_ms": step_s * 1e3, "spread": spread}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    args = parser.parse_args()
    model, tokenizer = load(args.model)
    # mlxq's fast paths are hooked onto this model alone: `model` keeps mlx-lm's forward.
    fastest = load_model(args.model, native=matvec.folder(Settings().models_dir)).model
    # The same warm-up as every server gets: a real generation, then a few forward steps.
    engine(model, tokenizer, {"batch": 1, "prompts": [WARMUP], "max_tokens": 8})
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        if request["op"] == "engine":
            answer = engine(model, tokenizer, request)
        else:
            answer = forward(fastest, request)
        print(json.dumps(answer), flush=True)


if __name__ == "__main__":
    main()
