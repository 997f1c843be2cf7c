"""Speculative decoding in the slot batch (worker/engine/sequence/drafts.py, worker/engine/batch/
speculation.py): a sequence that drafts by prompt lookup gets exactly the tokens it gets without
drafting, greedy or seeded, with logits processors, and the prefix cache's copy holds only kept
tokens. A tiny random llama falls into loops when greedy, which prompt lookup then predicts."""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import numpy as np
import pytest

from shared.wire.generation.sampling import SamplingParams
from tests.worker.tiny_models import TINY_LLAMA, tiny_model
from worker.engine.batch.slot_batch import SlotBatch
from worker.engine.batch.types import Entry, Token
from worker.engine.sequence.drafts import PromptLookup, Speculation
from worker.engine.sequence.processors import processors_for
from worker.engine.sequence.sampling import Sampler, greedy, make_sampler

PROMPTS = [[5, 9, 11, 5, 9, 11, 5, 9], [7, 1, 30, 2, 7, 1], [12, 13, 12]]
TOKENS = 40


@pytest.fixture(scope="module")
def tiny() -> Any:
    return tiny_model({**TINY_LLAMA, "vocab_size": 100, "max_position_embeddings": 512}, seed=0)


def _run(model: Any, entries: list[Entry]) -> tuple[list[list[int]], dict[int, Token]]:
    batch = SlotBatch(model, 4, frozenset({3}), 64, keep_caches=True, positions=512)
    uids = batch.insert(entries)
    got: dict[int, list[int]] = {u: [] for u in uids}
    ends: dict[int, Token] = {}
    while len(ends) < len(uids):
        for token in batch.next(None):
            got[token.uid].append(token.token)
            if token.finish_reason is not None:
                ends[token.uid] = token
    return [got[u] for u in uids], {i: ends[u] for i, u in enumerate(uids)}


def _entries(
    samplers: list[Sampler], k: int, processors: bool = False
) -> tuple[list[Entry], list[PromptLookup | None]]:
    drafters = [PromptLookup(Speculation(k, 4)) if k else None for _ in PROMPTS]
    params = SamplingParams(frequency_penalty=0.5, logit_bias={4: 2.0})
    entries = [
        Entry(p, [], None, TOKENS, s, processors_for(params) if processors else [], d)
        for p, s, d in zip(PROMPTS, samplers, drafters, strict=True)
    ]
    return entries, drafters


def test_greedy_rows_that_draft_get_the_tokens_they_get_without_drafting(tiny: Any) -> None:
    plain, _ = _run(tiny, _entries([greedy] * 3, 0)[0])
    entries, drafters = _entries([greedy] * 3, 4)
    drafted, _ = _run(tiny, entries)
    assert drafted == plain
    assert sum(d.accepted for d in drafters if d is not None) > 0


def test_seeded_rows_with_penalties_and_bias_draw_the_same_tokens_when_drafting(
    tiny: Any,
) -> None:
    def seeded() -> list[Sampler]:
        return [make_sampler(SamplingParams(temperature=0.7, seed=s)) for s in (1, 2, 3)]

    plain, _ = _run(tiny, _entries(seeded(), 0, processors=True)[0])
    entries, drafters = _entries(seeded(), 4, processors=True)
    drafted, _ = _run(tiny, entries)
    assert drafted == plain
    assert sum(d.drafted for d in drafters if d is not None) > 0


def test_a_row_s_kept_kv_holds_only_the_tokens_it_kept(tiny: Any) -> None:
    drafted, ends = _run(tiny, _entries([greedy] * 3, 4)[0])
    _, plain_ends = _run(tiny, _entries([greedy] * 3, 0)[0])
    for i, prompt in enumerate(PROMPTS):
        end = ends[i]
        assert end.all_tokens is not None and end.prompt_cache is not None
        kept = len(end.all_tokens)
        assert end.all_tokens == (prompt + drafted[i])[:kept]
        assert end.prompt_cache[0].offset == kept
        reference = plain_ends[i].prompt_cache
        assert reference is not None
        ours, theirs = end.prompt_cache[0].keys, reference[0].keys[:, :, :kept]
        assert np.allclose(np.array(ours), np.array(theirs), atol=1e-4)


def test_prompt_lookup_drafts_what_followed_the_last_tokens_before() -> None:
    lookup = PromptLookup(Speculation(3, 1))
    assert lookup.draft([1, 2, 3, 4, 9, 2, 3], 3) == [4, 9, 2]
    assert PromptLookup(Speculation(3, 1), predicted=[7, 8, 9]).draft([1, 2], 2) == [7, 8]
    missed = PromptLookup(Speculation(3, 1))
    assert missed.draft([1, 2, 3], 3) == []
    assert not missed.hopeful(3) and missed.hopeful(4)


def test_the_sampler_draws_each_drafted_position_from_its_own_logits() -> None:
    from worker.engine.batch.speculation import matched

    logits = mx.log(mx.array([[0.0, 1.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 1.0]]) + 1e-9)
    entry = Entry([], [], None, 8, greedy, [])
    assert matched(entry, [], logits, [1, 0], frozenset()) == [1, 0, 2]
    assert matched(entry, [], logits, [1, 2], frozenset()) == [1, 0]
    assert matched(entry, [], logits, [2, 0], frozenset()) == [1]
    assert matched(entry, [], logits, [1, 0], frozenset({0})) == [1, 0]


def test_a_row_that_predicted_its_answer_keeps_the_prediction_as_drafts(tiny: Any) -> None:
    prompt = [20, 41, 7]
    (plain,), _ = _run(tiny, [Entry(prompt, [], None, 16, greedy, [])])
    drafter = PromptLookup(Speculation(4, 4), predicted=plain)
    (drafted,), _ = _run(tiny, [Entry(prompt, [], None, 16, greedy, [], drafter)])
    assert drafted == plain
    assert drafter.accepted >= len(plain) // 2


def test_a_chat_request_s_prediction_reaches_its_job_as_text() -> None:
    from shared.queue.jobs import job_for
    from shared.wire.chat.completions import ChatCompletionRequest

    body = {
        "model": "m",
        "messages": [{"role": "user", "content": "hi"}],
        "prediction": {"type": "content", "content": [{"type": "text", "text": "a b"}]},
    }
    assert job_for("j", ChatCompletionRequest.model_validate(body)).prediction == "a b"


def test_the_default_model_repeating_its_prediction_reports_the_accepted_tokens() -> None:
    from shared.queue.config import Settings
    from shared.queue.jobs import job_for
    from shared.wire.chat.completions import ChatCompletionRequest
    from worker.engine.generation import Engine, EngineSettings
    from worker.engine.model import load_model

    loaded = load_model(str(Settings().models_dir / "SmolLM2-135M-Instruct"))
    line = "The lighthouse stood on the rocks at the edge of the bay."
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": f"Repeat this sentence word for word:\n\n{line}"}],
        "temperature": 0,
        "max_tokens": 24,
        "prediction": {"type": "content", "content": line},
    }
    engine = Engine(loaded, EngineSettings(2, 24, 4096, "slots", speculation=Speculation(5, 2)))
    engine.insert(engine.prepare(job_for("j", ChatCompletionRequest.model_validate(body))))
    text, last = "", None
    while last is None:
        for out in engine.step():
            text += out.text
            last = out if out.ends_job else None
    assert text == line
    assert last.accepted_prediction_tokens >= last.completion_tokens // 2


def test_a_drafts_length_follows_what_the_batch_kept_of_recent_drafts() -> None:
    drafter = PromptLookup(Speculation(8, 4))
    assert drafter.length == 8
    drafter.checked(8, 0)
    drafter.checked(8, 0)
    assert drafter.length <= 3  # two drafts broken at once: short drafts
    drafter.checked(3, 3)
    drafter.checked(4, 4)
    drafter.checked(5, 5)
    assert drafter.length >= 5  # copying again: long ones
    for _ in range(6):
        drafter.checked(drafter.length, drafter.length)
    assert drafter.length == 8  # never past the setting
