"""The synthetic engine's prefill model (worker/engine/doubles/synthetic_prefill.py): real token
ids, a
prefix cache whose `held` the worker publishes, and a step that is longer by the prefill of
what the cache lacks. Built as a synthetic worker builds it (worker/runtime/serve.py), on the
default model's tokenizer; nothing here runs a model or Redis."""

from __future__ import annotations

import time

import pytest

from shared.queue.config import Settings
from shared.queue.jobs import GenerationJob
from shared.queue.keys import Keys
from shared.queue.prefix.prefix_blocks import block_hashes
from shared.queue.prompt.prompt_tokens import PromptCounter
from shared.wire.chat.completions import ChatMessage
from worker.engine.doubles.synthetic import SyntheticEngine
from worker.engine.doubles.synthetic_prefill import SyntheticPrefill, SyntheticPrefixCache
from worker.engine.generation.step_output import StepOutput
from worker.runtime.prefix.prefix_report import PrefixReport
from worker.runtime.serve import build_synthetic

COST_S = 0.0005  # per uncached prompt token
DOCUMENT = " ".join(f"item{i} left the depot on day {i}." for i in range(120))


@pytest.fixture(scope="module")
def counter() -> PromptCounter:
    settings = Settings(engine="synthetic", synthetic_prefill_s_per_token=COST_S)
    _, _, spec, cache = build_synthetic(settings)
    assert spec is not None and spec.tokenizer_json is not None and cache is not None
    return PromptCounter(spec)


def engine(
    counter: PromptCounter, budget: int = 4096
) -> tuple[SyntheticEngine, SyntheticPrefixCache]:
    cache = SyntheticPrefixCache(entries=8)
    prefill = SyntheticPrefill(counter, cache, COST_S, budget)
    return SyntheticEngine(0.001, 4, prefill), cache


def chat(job_id: str, *turns: str) -> GenerationJob:
    messages = [ChatMessage(role="system", content=DOCUMENT)]
    messages += [ChatMessage(role="user", content=t) for t in turns]
    return GenerationJob(job_id=job_id, model="m", messages=messages, max_tokens=4)


def run(engine: SyntheticEngine, job: GenerationJob) -> tuple[float, list[StepOutput], int]:
    """(seconds to the first token, every output, steps until the first token)."""
    engine.insert(engine.prepare(job))
    started, outputs, steps, first = time.perf_counter(), [], 0, None
    while not any(o.ends_job for o in outputs):
        step = engine.step()
        steps += 1
        if step and first is None:
            first = time.perf_counter() - started, steps
        outputs += step
    assert first is not None
    return first[0], outputs, first[1]


def test_prompts_are_the_token_ids_the_api_counts(counter: PromptCounter) -> None:
    synthetic, _ = engine(counter)
    job = chat("a", "Which item left first?")
    assert synthetic.prepare(job).prompts == (counter.ids(job),)


def test_the_first_token_waits_for_the_prefill_of_what_the_cache_lacks(
    counter: PromptCounter,
) -> None:
    synthetic, _ = engine(counter)
    first = chat("a", "Which item left first?")
    tokens = len(counter.ids(first) or [])
    cold_s, outputs, _ = run(synthetic, first)
    assert tokens * COST_S <= cold_s < tokens * COST_S + 0.3
    assert outputs[-1].cached_tokens == 0
    # Another question on the same document: only what follows the shared part is prefilled.
    warm_s, outputs, _ = run(synthetic, chat("b", "And which one last?"))
    assert outputs[-1].cached_tokens > tokens - 16
    assert warm_s < cold_s / 4


def test_the_cache_holds_what_the_worker_publishes(counter: PromptCounter) -> None:
    synthetic, cache = engine(counter)
    job = chat("a", "Which item left first?")
    run(synthetic, job)
    report = PrefixReport(cache, Keys("t"), worker_id="w")
    assert set(block_hashes(counter.ids(job) or [])) <= report.held_blocks()


def test_a_prefill_longer_than_the_step_budget_is_spread_over_steps(
    counter: PromptCounter,
) -> None:
    synthetic, _ = engine(counter, budget=256)
    job = chat("a", "Which item left first?")
    tokens = len(counter.ids(job) or [])
    _, _, steps = run(synthetic, job)
    assert steps == -(-tokens // 256)
