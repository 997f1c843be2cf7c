"""Speculative decoding (prompt lookup) against plain decode, side by side in one process.

`LD_PRELOAD=<openblas> python -m bench.speculation` runs the worker's own Engine (no Redis or
HTTP) on the default model: one client asking for a paragraph back word for word (greedy: the
workload where lookup pays), then `--clients` clients each writing a story (rows that copy
little, to show what the sync steps cost them). Each run is timed from the first token to the
last; rounds alternate off and on so a noisy machine affects both alike.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from shared.queue.config import Settings
from shared.queue.jobs import job_for
from shared.wire.chat.completions import ChatCompletionRequest
from worker.engine.generation.engine import Engine
from worker.engine.model import LoadedModel, load_model
from worker.runtime.serve import engine_settings

PARAGRAPH = (
    "The lighthouse stood on the rocks at the edge of the bay. Every night the keeper climbed "
    "the stairs, lit the lamp and watched the ships pass safely into the harbour. In winter the "
    "storms came early, and the light was the only thing the sailors could see."
)


def _request(content: str, max_tokens: int) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate(
        {
            "model": "m",
            "messages": [{"role": "user", "content": content}],
            "temperature": 0,
            "max_tokens": max_tokens,
        }
    )


def _tokens_per_second(loaded: LoadedModel, k: int, contents: list[str], tokens: int) -> float:
    settings = Settings(batch_size=16, default_max_tokens=tokens, speculation_tokens=k)
    engine = Engine(loaded, engine_settings(settings))
    for i, content in enumerate(contents):
        engine.insert(engine.prepare(job_for(f"j{i}", _request(content, tokens))))
    produced, started, left = 0, 0.0, len(contents)
    while left:
        for out in engine.step():
            if not started:
                started = time.perf_counter()
            if out.ends_job:
                produced += out.completion_tokens
                left -= 1
    return produced / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--draft", type=int, nargs="+", default=[3, 5])
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    loaded = load_model(str(Settings().models_dir / Settings().model))
    repeat = [f"Repeat this paragraph word for word:\n\n{PARAGRAPH}"]
    stories = [f"Tell me a long story about the number {i}." for i in range(args.clients)]
    rows: dict[str, list[float]] = {}
    for _ in range(args.rounds):
        for k in [0, *args.draft]:
            for name, contents in (("repeat c=1", repeat), (f"story c={args.clients}", stories)):
                rate = _tokens_per_second(loaded, k, contents, args.tokens)
                rows.setdefault(f"{name} k={k}", []).append(rate)
    print(json.dumps({name: statistics.median(v) for name, v in rows.items()}, indent=1))


if __name__ == "__main__":
    main()
