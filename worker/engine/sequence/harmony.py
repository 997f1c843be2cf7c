"""gpt-oss's harmony format, read token by token into reasoning, content and tool calls.

A harmony answer is a run of messages, each `<|channel|>NAME[ to=RECIPIENT][ <|constrain|>TYPE]
<|message|>TEXT<|end|>`, the next one opened by `<|start|>assistant`; the last ends with
`<|return|>` (an answer) or `<|call|>` (a tool call), which are the model's stop tokens, never
`<|end|>`. The `analysis` channel is the reasoning, `final` the answer, and a message to
`functions.NAME` (on `commentary`) a call whose text is the arguments' JSON. A commentary
message to nobody is a preamble the user may read: content.

mlx-lm has no harmony parser. `HarmonySplit` has the `ThinkSplit` surface
(worker/engine/sequence/reasoning.py): tokens in, (content, reasoning) out. A call goes out as
content in the JSON-tools text format (`<tool_call>{"name": ..., "arguments": ...}</tool_call>`),
arguments streamed as written, so the tool-call scanner that follows it reads it as any other
call (ids, stream pieces, `finish_reason: "tool_calls"`).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from shared.wire.generation.tools import CALL_END, CALL_START

_RECIPIENT = re.compile(r"to=(\S+)")


@dataclass(frozen=True)
class HarmonyTokens:
    """The harmony special tokens' ids in one vocabulary."""

    start: int
    end: int
    message: int
    channel: int
    constrain: int

    @classmethod
    def of(cls, tokenizer: Any) -> HarmonyTokens | None:
        """The ids, for a vocabulary that speaks harmony (has `<|channel|>` and `<|return|>`);
        None for any other."""
        vocab: dict[str, int] = tokenizer.get_vocab()
        names = ("<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>")
        if "<|return|>" not in vocab or not all(n in vocab for n in names):
            return None
        return cls(*(vocab[n] for n in names))


class HarmonySplit:
    """One sequence's harmony messages routed to reasoning, content or a call (module
    docstring). Output starts in a message's header: the prompt ends with `<|start|>assistant`."""

    def __init__(self, tokens: HarmonyTokens):
        self._tokens = tokens
        self._specials = frozenset(
            (tokens.start, tokens.end, tokens.message, tokens.channel, tokens.constrain)
        )
        self._state = "header"  # header, message, or between (after <|end|>)
        self._header: list[str] = []
        self._route = "content"  # the open message's: content, reasoning or call
        self.inside = False  # in an analysis message
        self.reasoning_tokens = 0

    def feed(self, token: int, piece: str) -> tuple[str, str]:
        """Take one token and its text; return (content, reasoning) that may be shown now."""
        if token not in self._specials:
            if self._state == "message":
                if self._route == "reasoning":
                    self.reasoning_tokens += 1
                    return "", piece
                return piece, ""
            if self._state == "header":
                self._header.append(piece)
            return "", ""
        return self._special(token)

    def finish(self, rest: str) -> tuple[str, str]:
        """At the end (`<|call|>`, `<|return|>`, or a limit), with the detokenizer's last
        text: that text where it belongs, and the end of a call being written."""
        content, reasoning = self.feed(-1, rest) if rest else ("", "")
        if self._state == "message" and self._route == "call":
            self._state = "between"
            content += "}" + CALL_END
        return content, reasoning

    def _special(self, token: int) -> tuple[str, str]:
        t = self._tokens
        if token == t.message and self._state == "header":
            return self._open()
        if token == t.end:
            closed = self.finish("")
            self._state, self.inside = "between", False
            return closed
        if token == t.start:
            self._state, self._header = "header", []
        elif token in (t.channel, t.constrain) and self._state == "header":
            self._header.append(" <|channel|>" if token == t.channel else " <|constrain|>")
        return "", ""

    def _open(self) -> tuple[str, str]:
        """A message's header is complete: where its text goes."""
        header = "".join(self._header)
        self._header, self._state = [], "message"
        channel = header.partition("<|channel|>")[2].split()
        recipient = _RECIPIENT.search(header)
        if recipient is not None and recipient.group(1).startswith("functions."):
            self._route = "call"
            name = recipient.group(1).removeprefix("functions.")
            return CALL_START + '{"name": ' + json.dumps(name) + ', "arguments": ', ""
        self._route = "reasoning" if channel[:1] == ["analysis"] else "content"
        self.inside = self._route == "reasoning"
        return "", ""
