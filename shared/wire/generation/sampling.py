"""How a job samples: the parameters the worker turns into a sampler and logits processors."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, Field


class SamplingParams(BaseModel):
    temperature: Annotated[float, Field(ge=0, le=2)] = 1.0
    top_p: Annotated[float, Field(gt=0, le=1)] = 1.0
    seed: int | None = None
    top_k: Annotated[int, Field(ge=0)] = 0  # 0: off
    min_p: Annotated[float, Field(ge=0, le=1)] = 0.0  # 0: off
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: Annotated[float, Field(gt=0)] = 1.0  # 1: off
    logit_bias: dict[int, float] = {}
