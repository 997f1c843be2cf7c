"""The context-window rule, written once: the API checks it before a job is queued (when it can
count the prompt), the worker before prefill (always).

A prompt plus the completion's `max_tokens` must fit the model's window; without `max_tokens`
the completion may use whatever the prompt leaves, which must be at least one token. Anything
else is a 400 `context_length_exceeded` naming the numbers, as OpenAI words it.

Where `max_tokens` is a ceiling rather than a demand (Anthropic's Messages API: Claude Code asks
for 32,000 whatever the model), `ceiling` makes it one: the completion gets what the prompt
leaves, up to `max_tokens`, and ends as a length stop (`stop_reason: "max_tokens"`) there. Only
a prompt that leaves no room at all is refused.
"""

from __future__ import annotations

from shared.wire.errors import ContextLengthError


def completion_budget(
    prompt: int, max_tokens: int | None, window: int, where: str, *, ceiling: bool = False
) -> int:
    """How many tokens the completion may generate; `where` names the prompt's parameter."""
    completion = max_tokens or 1
    if prompt + completion <= window:
        return max_tokens if max_tokens is not None else window - prompt
    if ceiling and prompt < window:
        return window - prompt
    if max_tokens is None or ceiling:
        asked = f"your {where} resulted in {prompt} tokens"
        fix = f"Please reduce the length of the {where}."
    else:
        asked = (
            f"you requested {prompt + completion} tokens ({prompt} in the {where}, "
            f"{completion} in the completion)"
        )
        fix = f"Please reduce the length of the {where} or completion."
    raise ContextLengthError(
        f"This model's maximum context length is {window} tokens. However, {asked}. {fix}",
        param=where,
    )
