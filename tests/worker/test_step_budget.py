"""An engine step's prefill budget on the real default model
(worker/engine/generation/engine.py): a prompt that arrives while another sequence decodes is
prefilled at most MLXQ_PREFILL_TOKENS_DECODING tokens a step, and only what
MLXQ_PREFILL_SECONDS_DECODING allows at the rate the batch's prefill ran lately, since that
sequence's next token waits for the step; with nothing decoding, a step takes up to
MLXQ_PREFILL_TOKENS."""

from __future__ import annotations

from dataclasses import replace

import pytest

from shared.queue.config import Settings
from shared.queue.jobs import job_for
from shared.wire.chat.completions import ChatCompletionRequest
from tests.support import MODEL
from worker.engine.batch.slot_batch import SlotBatch
from worker.engine.batch.token_batch import PREFILL_CHUNK
from worker.engine.generation.engine import Engine, EngineSettings
from worker.engine.model import LoadedModel, load_model
from worker.engine.prefill_policy import FIRST_CHUNK, MIN_PREFILL_TOKENS

WHILE_DECODING = 48
LONG = "Tell me about the sea. " * 14  # about 100 prompt tokens


@pytest.fixture(scope="module")
def loaded() -> LoadedModel:
    return load_model(str(Settings().models_dir / MODEL))


def _engine(loaded: LoadedModel, seconds: float | None = None) -> Engine:
    return Engine(
        loaded,
        EngineSettings(
            4,
            64,
            4096,
            "slots",
            prefill_tokens_decoding=WHILE_DECODING,
            prefill_seconds_decoding=seconds,
        ),
    )


def _decoding(engine: Engine) -> Engine:
    """The engine with one short sequence past its prompt (whose prefill measured the rate)."""
    _insert(engine, "running", "Hi")
    engine.step()
    engine.step()
    assert engine._batch.decoding
    return engine


def _insert(engine: Engine, job_id: str, text: str) -> int:
    """Queue a chat job; its prompt tokens."""
    req = ChatCompletionRequest.model_validate(
        {"model": MODEL, "messages": [{"role": "user", "content": text}], "max_tokens": 64}
    )
    prepared = engine.prepare(job_for(job_id, req))
    engine.insert(prepared)
    return prepared.prompt_tokens


def _prefilled(engine: Engine, job_id: str) -> int:
    """The positions of the job's row that hold its prompt's KV."""
    batch = engine._batch
    assert isinstance(batch, SlotBatch)
    (uid,) = engine._jobs[job_id].uids
    return next(r.offset for r in batch._rows if r.uid == uid)


def _prefilled_in_two_steps(engine: Engine) -> list[int]:
    """A long prompt joins: its prefilled positions after each of the next two steps."""
    _insert(engine, "long", LONG)
    done = []
    for _ in range(2):
        engine.step()
        done.append(_prefilled(engine, "long"))
    return done


def test_a_prompt_arriving_while_another_decodes_gets_the_smaller_budget_a_step(
    loaded: LoadedModel,
) -> None:
    engine = _decoding(_engine(loaded))
    assert _prefilled_in_two_steps(engine) == [WHILE_DECODING, 2 * WHILE_DECODING]


def test_while_another_decodes_a_step_prefills_only_what_its_time_allows(
    loaded: LoadedModel,
) -> None:
    # A microsecond of prefill is less than any step's: the floor, which keeps prompts moving.
    engine = _decoding(_engine(loaded, seconds=1e-6))
    assert engine._batch.prefill_rate is not None and engine._batch.prefill_rate > 0
    assert _prefilled_in_two_steps(engine) == [MIN_PREFILL_TOKENS, 2 * MIN_PREFILL_TOKENS]


def test_while_another_decodes_the_budget_is_the_prefill_rate_times_the_time_allowed(
    loaded: LoadedModel,
) -> None:
    engine = _decoding(_engine(loaded, seconds=1.0))
    rate = engine._batch.prefill_rate
    assert rate is not None
    # The time 30.5 tokens take at this rate: 30 tokens, between the floor and the cap.
    engine._prefill = replace(engine._prefill, seconds=30.5 / rate)
    _insert(engine, "long", LONG)
    engine.step()
    assert _prefilled(engine, "long") == 30


def test_with_nothing_decoding_a_step_prefills_up_to_the_full_budget(
    loaded: LoadedModel,
) -> None:
    engine = _engine(loaded)
    prompt = _insert(engine, "long", LONG)
    assert WHILE_DECODING < prompt < PREFILL_CHUNK
    engine.step()  # the prompt but its last token, then the first decode forward
    assert _prefilled(engine, "long") == prompt


def _started(engine: Engine, job_ids: list[str]) -> int:
    """How many of the jobs' rows are decoding: their prompts are in and their first token on
    its way."""
    batch = engine._batch
    assert isinstance(batch, SlotBatch)
    decoding = {r.uid for r in batch._rows[: batch._decoding]}
    return sum(engine._jobs[j].uids[0] in decoding for j in job_ids)


def test_short_prompts_arriving_together_while_another_decodes_start_in_one_step(
    loaded: LoadedModel,
) -> None:
    # Sixteen prompts of about 30 tokens: ten times the cap on chunks, well within the time.
    engine = _decoding(Engine(loaded, EngineSettings(17, 64, 4096, "slots", **BURST)))
    burst = [f"short-{i}" for i in range(16)]
    tokens = sum(_insert(engine, job_id, f"Say {i}.") for i, job_id in enumerate(burst))
    assert tokens > 8 * WHILE_DECODING
    engine.step()
    assert _started(engine, burst) == 16


def test_a_long_prompt_among_short_ones_still_moves_a_capped_chunk_a_step(
    loaded: LoadedModel,
) -> None:
    engine = _decoding(Engine(loaded, EngineSettings(6, 64, 4096, "slots", **BURST)))
    _insert(engine, "long", LONG)
    shorts = [f"short-{i}" for i in range(4)]
    for i, job_id in enumerate(shorts):
        _insert(engine, job_id, f"Say {i}.")
    engine.step()
    assert _started(engine, shorts) == 4
    assert _prefilled(engine, "long") == WHILE_DECODING


def test_a_burst_outnumbering_the_streams_starts_in_one_step_past_the_time_allowed(
    loaded: LoadedModel,
) -> None:
    # A microsecond allows the floor (16 tokens): less than one of these prompts.
    engine = _decoding(Engine(loaded, EngineSettings(17, 64, 4096, "slots", **NO_TIME)))
    burst = [f"short-{i}" for i in range(16)]
    for i, job_id in enumerate(burst):
        _insert(engine, job_id, f"Say {i}.")
    engine.step()
    assert _started(engine, burst) == 16


def test_a_burst_never_takes_a_chunked_long_prompts_tail_whole(loaded: LoadedModel) -> None:
    engine = _decoding(Engine(loaded, EngineSettings(8, 64, 4096, "slots", **NO_TIME)))
    prompt = _insert(engine, "long", LONG)
    engine.step()
    while prompt - 1 - _prefilled(engine, "long") > WHILE_DECODING:  # a chunk a step
        engine.step()
    before = _prefilled(engine, "long")  # what is left would pass as a short prompt
    shorts = [f"short-{i}" for i in range(4)]
    for i, job_id in enumerate(shorts):
        _insert(engine, job_id, f"Say {i}.")
    engine.step()
    assert _started(engine, shorts) == 4
    assert _prefilled(engine, "long") == before + MIN_PREFILL_TOKENS


def test_prompts_fewer_than_the_streams_keep_the_time_allowed(loaded: LoadedModel) -> None:
    engine = Engine(loaded, EngineSettings(6, 64, 4096, "slots", **NO_TIME))
    for i in range(3):
        _insert(engine, f"running-{i}", "Hi")
    engine.step()
    engine.step()
    shorts = ["short-0", "short-1"]
    for i, job_id in enumerate(shorts):
        assert _insert(engine, job_id, f"Say {i}.") > MIN_PREFILL_TOKENS
    engine.step()
    assert _started(engine, shorts) == 0  # a floor's chunk each step, as the time allows


def test_without_the_burst_rule_a_burst_waits_for_the_time_allowed(loaded: LoadedModel) -> None:
    engine = _decoding(
        Engine(loaded, EngineSettings(17, 64, 4096, "slots", prefill_burst=False, **NO_TIME))
    )
    burst = [f"short-{i}" for i in range(16)]
    for i, job_id in enumerate(burst):
        _insert(engine, job_id, f"Say {i}.")
    engine.step()
    assert _started(engine, burst) == 0


# The cap on chunks while another decodes, and time enough for any burst here.
BURST = {"prefill_tokens_decoding": WHILE_DECODING, "prefill_seconds_decoding": 60.0}
# The cap, and no time to speak of: the floor.
NO_TIME = {"prefill_tokens_decoding": WHILE_DECODING, "prefill_seconds_decoding": 1e-6}


def test_bulk_work_alone_is_prefilled_no_more_a_step_than_with_nothing_decoding(
    loaded: LoadedModel,
) -> None:
    engine = _engine(loaded)
    req = ChatCompletionRequest.model_validate(
        {"model": MODEL, "messages": [{"role": "user", "content": LONG * 6}], "max_tokens": 4}
    )
    bulk = job_for("bulk", req).model_copy(update={"lane": "batch"})
    prepared = engine.prepare(bulk)
    assert not prepared.interactive and prepared.prompt_tokens > FIRST_CHUNK + 1
    engine.insert(prepared)
    engine.step()  # no rate measured yet: one chunk of a long prompt
    assert _prefilled(engine, "bulk") == FIRST_CHUNK
