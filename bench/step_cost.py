"""What the OpenAI-parity features cost the decode step, measured side by side in one process.

`python -m bench parity` runs this module in a subprocess (OpenBLAS preloaded, as a worker
runs). For each scenario it puts 16 sequences in mlxq's engine (the worker's own Engine, no
Redis or HTTP), lets them prefill, then times the decode steps while all 16 are still running.
Scenarios run in interleaved rounds, each round in a rotated order, so that a noisy machine
affects them alike; the figure is
the median step over all rounds, and each ratio is against the plain step of the same run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

from shared.queue.config import Settings
from shared.queue.jobs import job_for
from shared.wire.chat.completions import ChatCompletionRequest
from worker.engine.generation.engine import Engine
from worker.engine.model import load_model
from worker.runtime.serve import engine_settings

BATCH = 16
# A schema that keeps every sequence writing for the whole measurement.
LONG_STRING: dict[str, Any] = {
    "type": "object",
    "properties": {"story": {"type": "string", "minLength": 400}},
    "required": ["story"],
    "additionalProperties": False,
}
SCHEMA_FORMAT = {"type": "json_schema", "json_schema": {"name": "s", "schema": LONG_STRING}}
SCENARIOS: dict[str, dict[str, Any]] = {
    "plain": {},
    "json_schema": {"response_format": SCHEMA_FORMAT},
    "one_json_schema_in_16": {},  # sequence 0 constrained, the other 15 plain
    "logprobs_top5": {"logprobs": True, "top_logprobs": 5},
    "penalties_and_bias": {
        "presence_penalty": 0.5,
        "frequency_penalty": 0.5,
        "repetition_penalty": 1.1,
        "logit_bias": {"42": -5.0},
    },
}


def story_messages(number: int | str) -> list[dict[str, str]]:
    """A request for a long story about `number`: a sequence that writes as long as it may."""
    return [{"role": "user", "content": f"Tell me a long story about the number {number}."}]


def story_request(number: int | str, max_tokens: int, **extra: Any) -> ChatCompletionRequest:
    """`story_messages` as a greedy chat request of `max_tokens`, with `extra` parameters."""
    body = {
        "model": "m",
        "messages": story_messages(number),
        "temperature": 0,
        "max_tokens": max_tokens,
        **extra,
    }
    return ChatCompletionRequest.model_validate(body)


def _requests(scenario: str, max_tokens: int) -> list[ChatCompletionRequest]:
    found = []
    for i in range(BATCH):
        extra = dict(SCENARIOS[scenario])
        if scenario == "one_json_schema_in_16" and i == 0:
            extra = {"response_format": SCHEMA_FORMAT}
        found.append(story_request(i, max_tokens, **extra))
    return found


def one_run(engine: Engine, scenario: str, max_tokens: int) -> list[float]:
    for i, req in enumerate(_requests(scenario, max_tokens)):
        engine.insert(engine.prepare(job_for(f"{scenario}{i}", req)))
    steps: list[float] = []
    while engine.active:
        started = time.perf_counter()
        outputs = engine.step()
        elapsed = time.perf_counter() - started
        finished = [o.job_id for o in outputs if o.finish_reason is not None]
        if len(outputs) == BATCH and not finished:
            steps.append(elapsed)
        elif finished:  # measure full batches only: end the rest now
            engine.remove([f"{scenario}{i}" for i in range(BATCH)])
    return steps[2:]  # the first steps still settle (first tokens, async pipeline)


def shared_prefill(engine: Engine, max_tokens: int) -> dict[str, int]:
    """Prompt tokens computed for one request with n=4, against the 4 prompts it asks for."""
    req = _requests("plain", max_tokens)[0].model_copy(update={"n": 4})
    before = engine.prefilled_tokens
    prepared = engine.prepare(job_for("n4", req))
    engine.insert(prepared)
    while engine.active:
        engine.step()
    prompt = len(prepared.prompts[0])
    return {"prompt": prompt, "requested": 4 * prompt, "computed": engine.prefilled_tokens - before}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=40)
    args = parser.parse_args()
    settings = Settings(batch_size=BATCH, default_max_tokens=args.max_tokens)
    engine = Engine(load_model(args.model), engine_settings(settings))
    one_run(engine, "json_schema", 8)  # warm up: grammar tokenizer, compiled kernels
    steps: dict[str, list[float]] = {name: [] for name in SCENARIOS}
    names = list(SCENARIOS)
    for round_ in range(args.rounds):
        # Each round starts at another scenario: none always runs first, or always last.
        for name in names[round_ % len(names) :] + names[: round_ % len(names)]:
            steps[name].extend(one_run(engine, name, args.max_tokens))
    medians = {name: statistics.median(s) * 1e3 for name, s in steps.items() if s}
    prefill = shared_prefill(engine, args.max_tokens)
    rows = [
        {
            "scenario": name,
            "steps": len(steps[name]),
            "step_ms": ms,
            "vs_plain": ms / medians["plain"],
        }
        for name, ms in medians.items()
    ]
    print(json.dumps({"batch": BATCH, "rows": rows, "n4_prefill": prefill}))


if __name__ == "__main__":
    main()
