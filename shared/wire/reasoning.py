"""How much a reasoning model may think: the one control every API's own field maps onto.

Chat Completions' `reasoning_effort`, the Responses API's `reasoning.effort` and Anthropic's
`thinking` ({type: enabled, budget_tokens} or {type: disabled}) each become a `ReasoningControl`
on the job. The worker hands it to the chat template in the form the template reads (Qwen3's
`enable_thinking`, gpt-oss's `reasoning_effort`: `template_kwargs`) and enforces `budget_tokens`
by forcing the end of reasoning when the budget runs out (worker/engine/sequence/reasoning.py).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

# OpenAI's levels (`max` is the newest); Anthropic's `output_config.effort` is a subset.
Effort = Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"]

# gpt-oss's template knows three levels (its system message's `Reasoning: low|medium|high`); the
# others go to the nearest. `none` is `low` there: harmony has no way to skip the analysis.
TEMPLATE_EFFORT: dict[Effort, str] = {
    "none": "low",
    "minimal": "low",
    "low": "low",
    "medium": "medium",
    "high": "high",
    "xhigh": "high",
    "max": "high",
}


class ReasoningControl(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    # None: the template's default; False: ask the template not to think.
    enabled: bool | None = None
    effort: Effort | None = None
    # Reasoning tokens at most; then the model's end-of-reasoning marker is forced.
    budget_tokens: Annotated[int, Field(ge=0)] | None = None

    @classmethod
    def of_effort(cls, effort: Effort | None, budget_tokens: int | None = None) -> ReasoningControl:
        """OpenAI's effort as the control: `none` asks the template not to think."""
        return cls(
            enabled=False if effort == "none" else None,
            effort=effort,
            budget_tokens=budget_tokens,
        )

    def template_kwargs(self) -> dict[str, Any]:
        """The chat template variables that carry this control. Each family reads its own name
        (Qwen3 and GLM `enable_thinking`, DeepSeek V3.1 `thinking`, gpt-oss `reasoning_effort`),
        and a template ignores the names it does not read, so every one is set."""
        kwargs: dict[str, Any] = {}
        if self.enabled is not None:
            kwargs["enable_thinking"] = kwargs["thinking"] = self.enabled
        if self.effort is not None:
            kwargs["reasoning_effort"] = TEMPLATE_EFFORT[self.effort]
        return kwargs
