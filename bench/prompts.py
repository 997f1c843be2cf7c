"""What `bench serve` sends: prompts of a given length, each with its own text, and conversations.

Real OpenAI-SDK traffic carries documents, histories and tool definitions: hundreds to thousands
of prompt tokens. Each prompt here is made of words drawn from a seeded generator, so every
request has its own text from its first word (no prefix shared between requests, beyond the chat
template) and the same seed gives the same text on every run and for every system. Lengths are
counted with the model's own tokenizer (tokenizer.json in the model directory).

A workload is either one-shot requests of one length, or conversations: a first message carrying
a document, then turns whose request resends the whole history (earlier user messages and the
answers the server streamed back) plus a short new question.
"""

from __future__ import annotations

import random
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

_WORD_TEXT = (
    "river stone garden window market letter engine winter morning station harbour valley "
    "copper silver orchard bridge lantern meadow forest island mountain village painter "
    "teacher doctor farmer sailor baker writer student captain soldier merchant pilot "
    "quietly slowly often rarely always never almost nearly carefully suddenly together "
    "build carry follow gather listen measure notice open repair reach return share study "
    "travel wander wonder answer borrow change choose explain finish forget imagine invite "
    "green yellow purple bright narrow ancient modern gentle heavy hollow honest patient "
    "silent simple strange sudden tender warm wild early late distant hidden open rough "
    "the a of and to in on with for from under over between after before during against "
    "because while although when where which that this those these every each some many "
    "clock paper table bottle basket candle ladder mirror needle pocket rope saddle shovel "
    "thread tunnel wagon wheel anchor blanket button compass feather hammer kettle ribbon "
    "weather season harvest festival journey lesson promise question reason secret story "
    "theory balance history language machine network pattern signal system number record "
    "north south east west above below inside outside beyond across along around behind "
    "seven twelve forty hundred thousand first second third half double single several "
    "apple bread cheese honey lemon onion pepper rice salt sugar tea water wine butter "
    "cloud fire frost light rain shadow smoke snow storm sun thunder wind wave tide moon"
)
WORDS = _WORD_TEXT.split()
PUNCTUATION = (".", ".", ".", ",", ",", ";", "?")
TAIL = "\n\nSummarise the text above in a few sentences."


class TextMaker:
    """Deterministic text of a given token length, measured with the model's tokenizer."""

    def __init__(self, model_dir: Path) -> None:
        self.tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))

    def text(self, seed: str, tokens: int) -> str:
        """About `tokens` tokens of words (instruction included), the same for the same seed."""
        rng = random.Random(zlib.crc32(seed.encode()))
        body = _words(rng, tokens + 16)
        budget = max(1, tokens - len(self.tokenizer.encode(TAIL).ids))
        offsets = self.tokenizer.encode(body).offsets
        if len(offsets) > budget:
            body = body[: offsets[budget - 1][1]].rsplit(" ", 1)[0]
        return body + TAIL

    def count(self, text: str) -> int:
        return len(self.tokenizer.encode(text).ids)


def _words(rng: random.Random, count: int) -> str:
    out: list[str] = []
    sentence = 0
    for _ in range(count):
        word = rng.choice(WORDS)
        out.append(word.capitalize() if sentence == 0 else word)
        sentence += 1
        if sentence > rng.randint(6, 16):
            out[-1] += rng.choice(PUNCTUATION)
            sentence = 0
    return " ".join(out)


# Paragraphs the copy workloads ask back (`repeat`, `edit`): plain prose a small model copies,
# where the prompt lookup of speculative decoding finds its drafts.
PARAGRAPHS = (
    "The lighthouse stood on the rocks at the edge of the bay. Every night the keeper climbed "
    "the stairs, lit the lamp and watched the ships pass safely into the harbour. In winter the "
    "storms came early, and the light was the only thing the sailors could see from the sea.",
    "The market opened at dawn in the square beside the old church. Farmers brought apples, "
    "bread and honey from the valley, and the baker sold warm rolls from a basket by the door. "
    "By noon the stalls were empty and the children played among the crates until evening.",
    "The train left the station a few minutes after seven and followed the river north. Through "
    "the window the passengers watched the fields turn from green to gold, and at the third stop "
    "a teacher with a heavy suitcase sat down and opened a book about the history of bridges.",
    "In the garden behind the house there was a pond with a wooden bridge across it. Each spring "
    "the frogs returned and sang through the night, and in the summer the family ate supper "
    "under the apple tree, talking about the weather, the harvest and the journeys they planned.",
)
EDIT = ("night", "evening")  # the edit workloads' change: every "night" becomes "evening"


def copy_ask(kind: str, paragraph: str) -> str:
    """The request of a copy workload: the paragraph back exactly, or with the one change."""
    if kind == "repeat":
        return f"Repeat the following text exactly, word for word:\n\n{paragraph}"
    old, new = EDIT
    return (
        f"Repeat the following text exactly, word for word, but write {new!r} wherever it says "
        f"{old!r}:\n\n{paragraph}"
    )


@dataclass(frozen=True)
class Workload:
    """One-shot requests of `first_tokens` (next_tokens None), or conversations whose first
    message carries `first_tokens` and whose next turns add `next_tokens` each. `turns` fixes a
    conversation's length (else `bench serve --turns`); `long_window`: sent to the copy of the
    model whose window is raised to 32k (bench/readme_stack.py `window_copy`). `copy`: a copy
    workload instead ("repeat" or "edit": a paragraph back, `copy_ask`), whose request carries
    the paragraph as OpenAI's `prediction` when `predicted`."""

    name: str
    first_tokens: int
    next_tokens: int | None = None
    turns: int | None = None
    long_window: bool = False
    copy: str | None = None
    predicted: bool = False

    @property
    def conversational(self) -> bool:
        return self.next_tokens is not None

    def messages(
        self, texts: TextMaker, seed: str, turn: int, history: list[dict[str, str]]
    ) -> list[dict[str, Any]]:
        """The messages of request `turn` (0-based) of one client; `history` holds the earlier
        turns of its conversation (empty for one-shot workloads)."""
        if self.copy is not None:
            return [{"role": "user", "content": copy_ask(self.copy, self.paragraph(seed, turn))}]
        tokens = self.first_tokens if turn == 0 or self.next_tokens is None else self.next_tokens
        ask = {"role": "user", "content": texts.text(f"{seed}/{turn}", tokens)}
        return [*history, ask] if self.conversational else [ask]

    def extra(self, seed: str, turn: int) -> dict[str, Any]:
        """Fields of the request beyond its messages: the prediction of a predicted workload."""
        if not self.predicted:
            return {}
        return {"prediction": {"type": "content", "content": self.paragraph(seed, turn)}}

    @staticmethod
    def paragraph(seed: str, turn: int) -> str:
        return PARAGRAPHS[zlib.crc32(f"{seed}/{turn}".encode()) % len(PARAGRAPHS)]


WORKLOADS = {
    "short": Workload("short", 40),
    "medium": Workload("medium", 600),
    "long": Workload("long", 2000),
    "multiturn": Workload("multiturn", 600, 40),
    # A long document, then one short question on it: the first turn's TTFT is the prefill of
    # the whole prompt, the next one's what the prefix cache leaves of it.
    "long16k": Workload("long16k", 16_000, 40, turns=2, long_window=True),
    "long30k": Workload("long30k", 30_000, 40, turns=2, long_window=True),
    # Copying: the answer repeats the prompt, as in code edits and quoting (speculation's case).
    "repeat": Workload("repeat", 80, copy="repeat"),
    "edit": Workload("edit", 90, copy="edit"),
    "edit-predicted": Workload("edit-predicted", 90, copy="edit", predicted=True),
}
