"""Prompts computed before their choices enter the batch (worker/engine/staged_prompt.py), on the
real default model: a scored prompt (echo with logprobs) and the prompt a job's choices share
(n > 1) take at most the step's prefill budget a step, however long, and give what one whole
forward over the prompt gives."""

from __future__ import annotations

import math
from typing import Any, cast

import mlx.core as mx
import pytest

from shared.queue.config import Settings
from shared.queue.jobs import job_for
from shared.wire.chat.completions import CompletionRequest
from tests.support import MODEL
from worker.engine.generation.engine import Engine, EngineSettings
from worker.engine.generation.step_output import StepOutput
from worker.engine.model import LoadedModel, load_model

BUDGET = 96  # MLXQ_PREFILL_TOKENS: what a step prefills with nothing decoding
# What a step counts beyond its budget: the last prompt token of each choice entering the batch
# in it, which the decode forward feeds (two prompts, or three choices, may enter in one step).
ENTERING = 3
TEXT = "The sea is wide and the waves are high; the ships sail on through the night. "


@pytest.fixture(scope="module")
def loaded() -> LoadedModel:
    return load_model(str(Settings().models_dir / MODEL))


def _engine(loaded: LoadedModel) -> Engine:
    return Engine(loaded, EngineSettings(4, 16, BUDGET, "slots"))


def _run(engine: Engine, job_id: str, **body: Any) -> tuple[list[StepOutput], list[int]]:
    """Run one completion job to its end: its outputs, and the prompt tokens each step
    computed."""
    req = CompletionRequest.model_validate({"model": MODEL, **body})
    engine.insert(engine.prepare(job_for(job_id, req)))
    outputs: list[StepOutput] = []
    per_step: list[int] = []
    while engine.active:
        before = engine.prefilled_tokens
        outputs += engine.step()
        per_step.append(engine.prefilled_tokens - before)
        assert len(per_step) < 200, "the job never ended"
    return outputs, per_step


def _whole_forward_logprobs(loaded: LoadedModel, prompt: list[int]) -> list[float]:
    """Each prompt token's logprob from one forward over the whole prompt (no chunks)."""
    logits = loaded.model(mx.array([prompt]))[0].astype(mx.float32)
    logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    chosen = mx.take_along_axis(logprobs[:-1], mx.array(prompt[1:])[:, None], axis=-1)[:, 0]
    return cast(list[float], chosen.tolist())


def test_scored_prompts_take_at_most_the_step_budget_a_step_and_score_as_one_forward(
    loaded: LoadedModel,
) -> None:
    engine = _engine(loaded)
    prompts = [TEXT * 12, "Once upon a time " + TEXT * 10]
    outputs, per_step = _run(
        engine, "scored", prompt=prompts, echo=True, logprobs=1, max_tokens=1, temperature=0
    )

    assert max(per_step) <= BUDGET + ENTERING
    tokens = [loaded.tokenizer.encode(p) for p in prompts]
    assert sum(per_step) >= sum(len(t) - 1 for t in tokens)  # the prompts are long: many steps
    assert sum(1 for n in per_step if n) >= sum(len(t) for t in tokens) // BUDGET
    ends = [o for o in outputs if o.finish_reason is not None]
    assert len(ends) == 2 and ends[-1].ends_job
    compared = 0
    for out in outputs:
        if out.logprobs is None or len(out.logprobs) < 2:
            continue
        compared += 1
        prompt = tokens[out.index]
        got = [e.logprob for e in out.logprobs[1 : len(prompt)]]
        want = _whole_forward_logprobs(loaded, prompt)
        assert out.logprobs[0].logprob is None
        pairs = zip(got, want, strict=True)
        assert all(g is not None and math.isclose(g, w, abs_tol=2e-3) for g, w in pairs)
        for entry in out.logprobs[1 : len(prompt)]:  # its one alternative: the likeliest token
            (top,) = entry.top_logprobs
            assert entry.logprob is not None and top.logprob >= entry.logprob - 1e-4
    assert compared == 2  # each prompt's echo, with its first token


def test_a_job_that_only_scores_ends_when_its_last_prompt_is_scored(
    loaded: LoadedModel,
) -> None:
    engine = _engine(loaded)
    outputs, per_step = _run(
        engine, "only", prompt=[TEXT * 12, TEXT], echo=True, logprobs=0, max_tokens=0
    )
    assert max(per_step) <= BUDGET + ENTERING
    assert [o.index for o in outputs] == [0, 1]
    assert outputs[-1].ends_job and not outputs[0].ends_job
    assert outputs[0].logprobs is not None and len(outputs[0].logprobs) > 2 * BUDGET


def test_the_prompt_several_choices_share_is_prefilled_within_the_budget_once(
    loaded: LoadedModel,
) -> None:
    body = {"prompt": TEXT * 12, "max_tokens": 6, "temperature": 0}
    single, _ = _run(_engine(loaded), "one", **body)
    shared, per_step = _run(_engine(loaded), "three", n=3, **body)

    assert max(per_step) <= BUDGET + ENTERING
    prompt = len(loaded.tokenizer.encode(TEXT * 12))
    assert sum(per_step) == prompt - 1 + 3  # once, then each choice's last token
    text = "".join(o.text for o in single)
    for index in range(3):
        assert "".join(o.text for o in shared if o.index == index) == text
    assert sum(1 for o in shared if o.ends_job) == 1
