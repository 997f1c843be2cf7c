"""A job's choices hold at most its share of the batch's rows (worker/engine/generation/
held_choices.py), on the real default model: the others wait and enter as its rows end, every
choice ends with what it would have said, and a later job gets a row meanwhile."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from shared.queue.config import Settings
from shared.queue.jobs import job_for
from shared.wire.chat.completions import CompletionRequest
from tests.support import MODEL
from worker.engine.generation.engine import Engine, EngineSettings
from worker.engine.generation.step_output import StepOutput
from worker.engine.model import LoadedModel, load_model

ROWS = 4
PROMPT = "The three best things about the sea are"


@pytest.fixture(scope="module")
def loaded() -> LoadedModel:
    return load_model(str(Settings().models_dir / MODEL))


def _engine(loaded: LoadedModel, job_rows: int | None) -> Engine:
    return Engine(loaded, EngineSettings(ROWS, 16, 256, "slots", job_rows=job_rows))


def _insert(engine: Engine, job_id: str, **body: Any) -> None:
    req = CompletionRequest.model_validate({"model": MODEL, "prompt": PROMPT, **body})
    engine.insert(engine.prepare(job_for(job_id, req)))


def _steps(engine: Engine) -> list[list[StepOutput]]:
    """Each step's outputs until nothing is left."""
    steps: list[list[StepOutput]] = []
    while engine.active:
        steps.append(engine.step())
        assert len(steps) < 500, "the jobs never ended"
    return steps


def _texts(steps: list[list[StepOutput]], job_id: str) -> dict[int, str]:
    texts: Counter[int] = Counter()
    out: dict[int, str] = {}
    for step in steps:
        for o in step:
            if o.job_id == job_id:
                out[o.index] = out.get(o.index, "") + o.text
                texts[o.index] += 1
    return out


@pytest.mark.parametrize("body", [{"n": 6}, {"n": 3, "prompt": [PROMPT, PROMPT + " the"]}])
def test_a_job_holds_at_most_its_share_of_rows_and_each_choice_says_what_it_would(
    loaded: LoadedModel, body: dict[str, Any]
) -> None:
    request = {"max_tokens": 8, "temperature": 0, **body}
    capped = _engine(loaded, job_rows=2)
    _insert(capped, "many", **request)
    steps = _steps(capped)
    free = _engine(loaded, job_rows=None)
    _insert(free, "many", **request)

    most = max(sum(1 for o in step if o.finish_reason is None or o.text) for step in steps)
    assert most <= 2
    assert _texts(steps, "many") == _texts(_steps(free), "many")
    ends = [o for step in steps for o in step if o.finish_reason is not None]
    assert len(ends) == 6 and ends[-1].ends_job and not any(o.ends_job for o in ends[:-1])


def test_a_later_job_gets_a_row_while_a_job_of_many_choices_is_running(
    loaded: LoadedModel,
) -> None:
    engine = _engine(loaded, job_rows=ROWS - 1)
    _insert(engine, "many", n=8, max_tokens=24, temperature=0)
    engine.step()
    _insert(engine, "later", max_tokens=4, temperature=0)
    steps = _steps(engine)

    first_of_later = next(
        i for i, step in enumerate(steps) if any(o.job_id == "later" for o in step)
    )
    last_of_many = max(i for i, step in enumerate(steps) if any(o.job_id == "many" for o in step))
    assert first_of_later <= 2
    assert first_of_later < last_of_many
