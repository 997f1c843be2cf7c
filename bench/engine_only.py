"""The engine alone, in this process: mlx-lm without HTTP, Redis or queues.

Run as `python -m bench.engine_only MODEL_DIR --concurrency 1,16 --max-tokens 64`; prints one
JSON object: for each concurrency, mlx-lm's own generation rate (stream_generate for one
stream, BatchGenerator for several) and the bare forward step at that batch size (the ceiling
any loop around this model can reach on this machine).
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import mlx.core as mx
from mlx_lm import load, stream_generate
from mlx_lm.generate import BatchGenerator
from mlx_lm.models.cache import make_prompt_cache

from bench.load import chat_body


def prompts(tokenizer: Any, n: int) -> list[list[int]]:
    bodies = [chat_body("", i, 0)["messages"] for i in range(n)]
    return [tokenizer.apply_chat_template(m, add_generation_prompt=True) for m in bodies]


def one_stream(model: Any, tokenizer: Any, max_tokens: int) -> dict[str, float]:
    prompt = prompts(tokenizer, 1)[0]
    started = time.perf_counter()
    first = None
    count = 0
    for _ in stream_generate(model, tokenizer, prompt, max_tokens=max_tokens):
        first = first or time.perf_counter()
        count += 1
    wall = time.perf_counter() - started
    return {"tokens_per_s": count / wall, "ttft_ms": ((first or started) - started) * 1e3}


def batched(model: Any, tokenizer: Any, n: int, max_tokens: int) -> dict[str, float]:
    gen = BatchGenerator(model, completion_batch_size=n, prefill_batch_size=min(n, 8))
    gen.insert(prompts(tokenizer, n), max_tokens=[max_tokens] * n)
    started = time.perf_counter()
    tokens = 0
    while responses := gen.next_generated():
        tokens += len(responses)
    wall = time.perf_counter() - started
    return {"tokens_per_s": tokens / wall}


def forward_step(model: Any, n: int, context: int = 64, steps: int = 16) -> dict[str, float]:
    cache = make_prompt_cache(model)
    mx.eval(model(mx.ones((n, context), dtype=mx.int32), cache=cache))
    token = mx.ones((n,), dtype=mx.int32)
    started = time.perf_counter()
    for _ in range(steps):
        token = mx.argmax(model(token[:, None], cache=cache)[:, -1, :], axis=-1)
        mx.eval(token)
    step_s = (time.perf_counter() - started) / steps
    return {"step_ms": step_s * 1e3, "tokens_per_s": n / step_s}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("--concurrency", default="1,16")
    parser.add_argument("--max-tokens", type=int, default=64)
    args = parser.parse_args()
    model, tokenizer = load(args.model)
    results: dict[str, Any] = {}
    for n in [int(c) for c in args.concurrency.split(",")]:
        engine = (
            one_stream(model, tokenizer, args.max_tokens)
            if n == 1
            else batched(model, tokenizer, n, args.max_tokens)
        )
        results[str(n)] = {"engine": engine, "forward": forward_step(model, n)}
    print(json.dumps(results))


if __name__ == "__main__":
    main()
