"""Embeddings: sentences/s through mlxq against the bare forward of the same model.

For each batch size b, on all-MiniLM-L6-v2 with the same short sentences (10 to 20 tokens):
- `forward`: the encoder alone in this process (worker/engine/embedding/encoder.py), b sentences per
  padded forward, with OpenBLAS preloaded as a worker has it: the ceiling any server around this
  model can reach on this machine;
- `one request`: one client sending requests of b inputs each, one after another, through the
  API, the queue and an embedding worker;
- `b clients`: b clients each sending one-sentence requests at once: what batching requests
  together in the worker buys.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import mlx.core as mx
import openai

from bench import systems
from bench.machine import describe
from bench.report import write
from worker.engine.embedding.download import ensure_default_embedder
from worker.engine.embedding.encoder import load_encoder

TOPICS = ["the weather", "a football match", "a new phone", "the stock market", "a recipe"]


def sentences(n: int) -> list[str]:
    return [
        f"Sentence {i} is a short remark about {TOPICS[i % len(TOPICS)]} on day {i % 31 + 1}."
        for i in range(n)
    ]


def best_rate(count: int, run: Callable[[], object], rounds: int) -> float:
    """`count` items per run of `run`: the best rate of `rounds` runs (on a shared machine the
    best run is the one least disturbed by others)."""
    rates = []
    for _ in range(rounds):
        started = time.perf_counter()
        run()
        rates.append(count / (time.perf_counter() - started))
    return max(rates)


def bare_forward(args: argparse.Namespace, sizes: list[int]) -> dict[int, float]:
    encoder = load_encoder(ensure_default_embedder(args.models_dir))
    tokenized = encoder.tokenize(sentences(args.sentences))

    def forward(b: int) -> None:
        for at in range(0, len(tokenized), b):
            mx.eval(encoder.embed(tokenized[at : at + b]))

    rates = {}
    for b in sizes:
        mx.eval(encoder.embed(tokenized[:b]))  # warm this shape
        rates[b] = best_rate(len(tokenized), lambda: forward(b), args.rounds)  # noqa: B023
    return rates


def through_mlxq(args: argparse.Namespace, sizes: list[int]) -> dict[int, dict[str, float]]:
    texts = sentences(args.sentences)
    model_dir = ensure_default_embedder(args.models_dir)
    rates: dict[int, dict[str, float]] = {}
    settings = {"MLXQ_EMBED_BATCH": str(max(sizes))}
    with systems.mlxq(model_dir, batch_size=max(sizes), settings=settings) as running:
        client = openai.OpenAI(
            base_url=f"http://127.0.0.1:{running.port}/v1", api_key="unused", max_retries=0
        )
        client.embeddings.create(model=running.model, input=texts[:4])  # warm up

        def embed(batch: list[str]) -> None:
            client.embeddings.create(model=running.model, input=batch)

        def requests(b: int) -> None:
            for at in range(0, len(texts), b):
                embed(texts[at : at + b])

        def clients(b: int) -> None:
            with ThreadPoolExecutor(b) as pool:
                list(pool.map(lambda t: embed([t]), texts))

        for b in sizes:
            rates[b] = {
                "one_request": best_rate(len(texts), lambda: requests(b), args.rounds),  # noqa: B023
                "clients": best_rate(len(texts), lambda: clients(b), args.rounds),  # noqa: B023
            }
    return rates


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| batch size b | bare forward, sentences/s | mlxq, requests of b inputs | "
        "mlxq, b clients of 1 input |",
        "| --- | --- | --- | --- |",
    ]
    for r in rows:
        lines.append(
            f"| {r['b']} | {r['forward']:.0f} | {r['one_request']:.0f} "
            f"({r['one_request'] / r['forward']:.0%}) | {r['clients']:.0f} "
            f"({r['clients'] / r['forward']:.0%}) |"
        )
    return "\n".join(lines)


def main(args: argparse.Namespace) -> None:
    systems.rerun_with_openblas("bench")  # the bare forward gets the BLAS the worker gets
    sizes = [int(b) for b in args.batch_sizes.split(",")]
    forward = bare_forward(args, sizes)
    served = through_mlxq(args, sizes)
    rows = [{"b": b, "forward": forward[b], **served[b]} for b in sizes]
    load = os.getloadavg()[0]
    record = {"machine": describe(), "sentences": args.sentences, "load_avg_1m": load, "rows": rows}
    write(args.out, "embed", record)
    text = table(rows)
    (args.out / "embed.md").write_text(text + "\n")
    print(text)
    print(f"best of {args.rounds} runs each; 1-minute load average at the end: {load:.1f}")
