"""instructor's `create_partial` (Mode.TOOLS) on the real default model: a forced tool call
streamed as it is written gives several partial objects, then the whole one.

instructor 1.17 pins jiter below 0.15 and openai 3.57 needs 0.16 or later, so it does not
install beside this project's openai: `scripts/setup.sh test` installs it without its pins into
.venv/apart (instructor's own code runs on the newer jiter), and this test imports it from there."""

from __future__ import annotations

import sys
from pathlib import Path

import openai
from pydantic import BaseModel, Field

from tests.support import MODEL

sys.path.append(str(Path(__file__).resolve().parents[2] / ".venv" / "apart"))
import instructor  # from .venv/apart, put on the path above


class Weather(BaseModel):
    city: str = Field(max_length=24)
    celsius: int
    summary: str = Field(max_length=40)


def test_create_partial_yields_the_call_as_it_is_written(client: openai.OpenAI) -> None:
    patched = instructor.from_openai(client, mode=instructor.Mode.TOOLS)
    partials = list(
        patched.chat.completions.create_partial(
            model=MODEL,
            response_model=Weather,
            messages=[{"role": "user", "content": "What is the weather in Paris?"}],
            temperature=0,
            max_tokens=80,
            max_retries=0,
        )
    )
    seen = [p.model_dump() for p in partials]
    distinct = [s for i, s in enumerate(seen) if s not in seen[:i]]
    assert len(distinct) > 2, seen
    assert distinct[0] != distinct[-1]
    Weather.model_validate(distinct[-1])
