"""Log probabilities as OpenAI shapes them: a token's entry with its alternatives (chat, and the
events a worker publishes) and the legacy completions' parallel lists."""

from __future__ import annotations

from pydantic import BaseModel


class TopLogprob(BaseModel):
    """One candidate token: its decoded text, its log probability and its UTF-8 bytes."""

    token: str
    logprob: float | None = None  # None only for a prompt's first token: nothing predicts it
    bytes: list[int] | None = None


class TokenLogprob(TopLogprob):
    """A generated token's log probability and the most likely alternatives at its place."""

    top_logprobs: list[TopLogprob] = []


class ChoiceLogprobs(BaseModel):
    content: list[TokenLogprob] | None
    refusal: None = None


class TextLogprobs(BaseModel):
    """The legacy completions' logprobs: parallel lists, one entry per generated token."""

    tokens: list[str]
    token_logprobs: list[float | None]
    top_logprobs: list[dict[str, float]]
    text_offset: list[int]

    @classmethod
    def of(cls, entries: list[TokenLogprob], offset: int) -> TextLogprobs:
        """`offset`: where the first token's text starts in the choice's text."""
        offsets = []
        for entry in entries:
            offsets.append(offset)
            offset += len(entry.token)
        return cls(
            tokens=[e.token for e in entries],
            token_logprobs=[e.logprob for e in entries],
            top_logprobs=[
                {t.token: t.logprob for t in e.top_logprobs if t.logprob is not None}
                for e in entries
            ],
            text_offset=offsets,
        )
