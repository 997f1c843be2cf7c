"""Stop handling: which token ids end a sequence, and stop strings matched on decoded text.

Stop tokens come from the tokenizer's eos ids, the model's generation config and, per model
family, the end-of-turn tokens its chat template uses (a Llama 3 chat ends a turn with
`<|eot_id|>` while its eos is `<|end_of_text|>`: both must stop). A stop token is never shown.

gpt-oss's harmony vocabulary (one with `<|channel|>` and `<|return|>`) is the exception: there
`<|end|>`, Phi's end of turn, only closes one message of a reply (the analysis before the
answer), and a reply ends with `<|return|>`, or `<|call|>` for a tool call. tests/families/
checks each family's stop tokens on its real vocabulary.

Stop strings are matched on the decoded text, across token boundaries. While the tail of the
output could still grow into a stop string it is held back, so no part of a stop string ever
reaches the client, and the text before a match is cut exactly there.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

# End-of-turn and end-of-text tokens by family (Llama 3, whose `<|eom_id|>` ends a message that
# calls a built-in tool; ChatML; Gemma; Mistral/Llama 2; Phi).
FAMILY_STOP_TOKENS = (
    "<|eot_id|>",
    "<|eom_id|>",
    "<|end_of_text|>",
    "<|im_end|>",
    "<end_of_turn>",
    "</s>",
    "<|end|>",
    "<|endoftext|>",
)
# Harmony (gpt-oss): the tokens that tell its vocabulary, the ones that end its replies, and the
# one that ends a message but not the reply.
HARMONY_MARKERS = ("<|channel|>", "<|return|>")
HARMONY_STOP_TOKENS = ("<|return|>", "<|call|>")
HARMONY_MESSAGE_END = "<|end|>"


def stop_token_ids(
    eos_ids: Iterable[int],
    generation_config_eos: Iterable[int],
    token_to_id: Callable[[str], int | None],
) -> frozenset[int]:
    """The ids that end a sequence: eos ids, the generation config's, and family extras."""
    ids = set(eos_ids) | set(generation_config_eos)
    harmony = all(token_to_id(marker) is not None for marker in HARMONY_MARKERS)
    family = HARMONY_STOP_TOKENS if harmony else ()
    for token in FAMILY_STOP_TOKENS + family:
        token_id = token_to_id(token)
        if token_id is not None:
            ids.add(token_id)
    message_end = token_to_id(HARMONY_MESSAGE_END)
    if harmony and message_end is not None:
        ids.discard(message_end)  # even where a config names it: the answer comes after it
    return frozenset(ids)


@dataclass
class StopStringMatcher:
    """Feeds decoded text in, lets out only text that cannot be part of a stop string."""

    stops: tuple[str, ...]
    _held: str = field(default="", init=False)
    # The stop string that ended the sequence (Anthropic's API reports it as `stop_sequence`).
    matched_stop: str | None = field(default=None, init=False)

    @property
    def matched(self) -> bool:
        return self.matched_stop is not None

    def feed(self, text: str) -> str:
        """Take new text; return what may be shown now. After a match, `matched` is True."""
        if not self.stops:
            return text
        held = self._held + text
        match = self._first_match(held)
        if match is not None:
            cut, self.matched_stop = match
            self._held = ""
            return held[:cut]
        keep = self._longest_partial_suffix(held)
        self._held = held[len(held) - keep :]
        return held[: len(held) - keep]

    def flush(self) -> str:
        """The held-back text, released when the sequence ends for another reason."""
        held, self._held = self._held, ""
        return held

    def _first_match(self, text: str) -> tuple[int, str] | None:
        """Where the earliest stop string starts, and which (the first listed, on a tie)."""
        found = [(at, stop) for stop in self.stops if (at := text.find(stop)) >= 0]
        return min(found, key=lambda match: match[0]) if found else None

    def _longest_partial_suffix(self, text: str) -> int:
        """Length of the longest suffix of `text` that is a proper prefix of some stop string."""
        best = 0
        for stop in self.stops:
            for n in range(min(len(stop) - 1, len(text)), best, -1):
                if text.endswith(stop[:n]):
                    best = n
                    break
        return best
