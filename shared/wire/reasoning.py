"""How much a reasoning model may think: the one control every API's own field maps onto.

Chat Completions' `reasoning_effort`, the Responses API's `reasoning.effort` and Anthropic's
`thinking` ({type: enabled, budget_tokens} or {type: disabled}) each become a `ReasoningControl`
on the job. The worker hands it to the chat template in the form the template reads (Qwen3's
`enable_thinking`, gpt-oss's `reasoning_effort`) and enforces `budget_tokens` by forcing the end
of reasoning when the budget runs out (worker/engine/sequence/reasoning.py).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

Effort = Literal["none", "minimal", "low", "medium", "high", "xhigh"]


class ReasoningControl(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    # None: the template's default; False: ask the template not to think.
    enabled: bool | None = None
    effort: Effort | None = None
    # Reasoning tokens at most; then the model's end-of-reasoning marker is forced.
    budget_tokens: Annotated[int, Field(ge=0)] | None = None
