"""Interactive time-to-first-token with and without a running batch, against a running stack.

    OPENAI_BASE_URL=http://127.0.0.1:8000/v1 python scripts/ttft_with_batch.py [--lines 500]

Measures the median TTFT (request sent -> first content token of a streamed chat completion)
over a few runs on an idle stack, then submits a batch of long requests through the Batch API
and, while it runs, measures again. The batch is cancelled at the end.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import openai

PROMPT = [{"role": "user", "content": "What is the capital of France?"}]


def ttft(client: openai.OpenAI, model: str) -> float:
    started = time.perf_counter()
    stream = client.chat.completions.create(
        model=model, messages=PROMPT, max_tokens=8, temperature=0, stream=True
    )
    first = None
    for chunk in stream:
        if first is None and chunk.choices and chunk.choices[0].delta.content:
            first = time.perf_counter() - started
    assert first is not None
    return first


def measure(client: openai.OpenAI, model: str, runs: int) -> list[float]:
    times = []
    for _ in range(runs):
        times.append(ttft(client, model))
        time.sleep(0.5)
    return times


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--model", default="SmolLM2-135M-Instruct")
    p.add_argument("--lines", type=int, default=500)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--runs", type=int, default=7)
    args = p.parse_args()
    client = openai.OpenAI(max_retries=0)

    idle = measure(client, args.model, args.runs)
    body = {"model": args.model, "max_tokens": args.max_tokens, "temperature": 0.7}
    lines = [
        {
            "custom_id": f"line-{i}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {**body, "messages": [{"role": "user", "content": f"Tell a story #{i}."}]},
        }
        for i in range(args.lines)
    ]
    data = "".join(json.dumps(line) + "\n" for line in lines).encode()
    file_id = client.files.create(file=("ttft.jsonl", data), purpose="batch").id
    batch = client.batches.create(
        input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    time.sleep(3.0)  # let the batch fill every bulk slot
    busy = measure(client, args.model, args.runs)
    status = client.batches.retrieve(batch.id)
    counts = status.request_counts
    client.batches.cancel(batch.id)

    def fmt(xs: list[float]) -> str:
        return (
            f"median {statistics.median(xs) * 1000:.0f} ms  (runs: "
            + ", ".join(f"{x * 1000:.0f}" for x in xs)
            + ")"
        )

    print(f"idle stack:            {fmt(idle)}")
    print(f"{args.lines}-line batch running: {fmt(busy)}")
    print(f"batch {batch.id} while measured: {status.status}, {counts}")


if __name__ == "__main__":
    main()
