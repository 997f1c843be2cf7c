"""How much a reasoning model may think: the one control every API's own field maps onto.

Chat Completions' `reasoning_effort`, the Responses API's `reasoning.effort` and Anthropic's
`thinking` ({type: enabled, budget_tokens} or {type: disabled}) each become a `ReasoningControl`
on the job. The worker hands it to the chat template in the form the template reads (Qwen3's
`enable_thinking`, gpt-oss's `reasoning_effort`: `template_kwargs`) and enforces `budget_tokens`
by forcing the end of reasoning when the budget runs out (worker/engine/sequence/reasoning.py).
A template that sets its reasoning length by effort (gpt-oss) gets a budget as an effort
(`budget_effort`) where no effort was given: Claude Code sends a budget whenever thinking is on.
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

# A token budget as gpt-oss's levels: the most reasoning tokens each level is taken to mean
# (its analysis runs to a few hundred tokens at low, a few thousand at medium); above the
# last, `high`.
BUDGET_EFFORT: tuple[tuple[int, Effort], ...] = ((2048, "low"), (8192, "medium"))


def budget_effort(budget_tokens: int) -> Effort:
    """The effort a budget of reasoning tokens stands for, on a template that reads efforts."""
    for most, effort in BUDGET_EFFORT:
        if budget_tokens <= most:
            return effort
    return "high"


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
        and a template ignores the names it does not read, so every one is set. An effort
        given wins over the one a budget stands for."""
        kwargs: dict[str, Any] = {}
        if self.enabled is not None:
            kwargs["enable_thinking"] = kwargs["thinking"] = self.enabled
        effort = self.effort
        if effort is None and self.budget_tokens is not None:
            effort = budget_effort(self.budget_tokens)
        if effort is not None:
            kwargs["reasoning_effort"] = TEMPLATE_EFFORT[effort]
        return kwargs
