"""`python -m bench reasoning`: what the reasoning split costs per generated token.

A sequence of a model that reasons passes each token through its split
(worker/engine/sequence/reasoning.py, harmony.py) on the engine's per-token path; a sequence of
any other model has no split, and the engine only checks that it has none. This measures both
splits on a long run of tokens (reasoning, then the answer, as a model writes them) in this
process, with the engine's own check for comparison: microseconds per token, the median of
`--rounds`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from worker.engine.sequence.harmony import HarmonySplit, HarmonyTokens
from worker.engine.sequence.reasoning import Split, ThinkMarkers, ThinkSplit

THINK, END = 151667, 151668  # Qwen3's <think> and </think>
HARMONY = HarmonyTokens(start=200006, end=200007, message=200008, channel=200005, constrain=200003)


def think_run(tokens: int) -> list[tuple[int, str]]:
    half = tokens // 2
    return [(THINK, "<think>"), *[(1000 + i % 5000, " word") for i in range(half)], (END, "")] + [
        (1000 + i % 5000, " word") for i in range(tokens - half)
    ]


def harmony_run(tokens: int) -> list[tuple[int, str]]:
    half = tokens // 2
    h = HARMONY
    opening = [(h.channel, "<|channel|>"), (17, "analysis"), (h.message, "<|message|>")]
    final = [(h.end, ""), (h.start, ""), (18, "assistant"), (h.channel, ""), (19, "final")]
    body = [(1000 + i % 5000, " word") for i in range(half)]
    return [*opening, *body, *final, (h.message, ""), *body]


def per_token(make: Callable[[], Split | None], run: list[tuple[int, str]]) -> float:
    """Microseconds per token of the engine's split step: the check, and the split if any."""
    split = make()
    started = time.perf_counter()
    for token, piece in run:
        if split is not None:
            split.feed(token, piece)
    return (time.perf_counter() - started) / len(run) * 1e6


def main(args: argparse.Namespace) -> None:
    think, harmony = think_run(args.tokens), harmony_run(args.tokens)
    markers = ThinkMarkers(start=(THINK,), end=(END,))
    cases: dict[str, tuple[Callable[[], Split | None], list[tuple[int, str]]]] = {
        "no split (a model that does not reason)": (lambda: None, think),
        "think markers (Qwen3, DeepSeek, GLM)": (lambda: ThinkSplit(markers, False), think),
        "harmony (gpt-oss)": (lambda: HarmonySplit(HARMONY), harmony),
    }
    rows: list[dict[str, Any]] = []
    for name, (make, run) in cases.items():
        micros = statistics.median(per_token(make, run) for _ in range(args.rounds))
        rows.append({"case": name, "us_per_token": round(micros, 3)})
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "reasoning.json").write_text(json.dumps({"tokens": args.tokens, "rows": rows}))
    lines = ["| split | µs per token |", "| --- | --- |"]
    lines += [f"| {r['case']} | {r['us_per_token']} |" for r in rows]
    (out / "reasoning.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def add_parser(sub: Any) -> None:
    p = sub.add_parser("reasoning", help="the reasoning split's cost per token")
    p.add_argument("--tokens", type=int, default=200_000)
    p.add_argument("--rounds", type=int, default=5)
    p.set_defaults(func=main)
