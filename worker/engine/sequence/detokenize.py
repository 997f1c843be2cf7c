"""Streaming detokenizers: token ids in, text out, one sequence each.

For byte-level BPE vocabularies (GPT-2 style: SmolLM, Llama 3, Qwen) each token's bytes are
computed once per model, and a sequence feeds them through an incremental UTF-8 decoder: a
table lookup and a decode per token, and a character split over two tokens comes out whole.
(mlx-lm's BPE detokenizer also drops a leading space from a sequence's first token, which is
wrong for a text completion that continues its prompt.) Other vocabularies use mlx-lm's.
"""

from __future__ import annotations

import codecs
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from mlx_lm.tokenizer_utils import BPEStreamingDetokenizer, StreamingDetokenizer, _byte_decoder


class TextDecoder(Protocol):
    def add(self, token: int) -> str:
        """Take one token; return the text it completes (possibly empty)."""

    def finish(self) -> str:
        """Return whatever text is still pending at the end of the sequence."""


class ByteLevelDecoder:
    def __init__(self, token_bytes: Sequence[bytes]):
        self._token_bytes = token_bytes
        self._utf8 = codecs.getincrementaldecoder("utf-8")("replace")

    def add(self, token: int) -> str:
        piece = self._token_bytes[token] if token < len(self._token_bytes) else b""
        return str(self._utf8.decode(piece))

    def finish(self) -> str:
        return str(self._utf8.decode(b"", final=True))


class MlxLmDecoder:
    """mlx-lm's streaming detokenizer behind the same two methods."""

    def __init__(self, detokenizer: StreamingDetokenizer):
        self._detokenizer = detokenizer

    def add(self, token: int) -> str:
        self._detokenizer.add_token(token)
        return str(self._detokenizer.last_segment)

    def finish(self) -> str:
        self._detokenizer.finalize()
        return str(self._detokenizer.last_segment)


def byte_table(tokenmap: Sequence[str | None]) -> list[bytes]:
    """Each byte-level token string back to the bytes it stands for."""
    decoder: dict[str, int] = _byte_decoder()
    table = []
    for token in tokenmap:
        text = token or ""
        if all(ch in decoder for ch in text):
            table.append(bytes(decoder[ch] for ch in text))
        else:  # an added token written as plain text
            table.append(text.encode())
    return table


def byte_table_of(tokenizer: Any) -> list[bytes] | None:
    """Each token's bytes, for a byte-level BPE TokenizerWrapper; None for any other. Made once
    per model (about a second and a half for a 200k vocabulary) and shared by what needs it."""
    template: StreamingDetokenizer = tokenizer.detokenizer
    if isinstance(template, BPEStreamingDetokenizer):
        return byte_table(template.tokenmap)
    return None


def decoder_factory(tokenizer: Any, table: list[bytes] | None) -> Callable[[], TextDecoder]:
    """A constructor of per-sequence decoders suited to this mlx-lm TokenizerWrapper, whose
    `byte_table_of` is `table`."""
    if table is not None:
        return lambda: ByteLevelDecoder(table)
    return lambda: MlxLmDecoder(tokenizer.detokenizer)


def token_pieces(tokenizer: Any, table: list[bytes] | None) -> Callable[[int], bytes]:
    """Each token id's own bytes (the text a logprobs entry names), for this TokenizerWrapper,
    whose `byte_table_of` is `table`."""
    if table is not None:
        return lambda token: table[token] if token < len(table) else b""
    return lambda token: str(tokenizer.decode([token])).encode()
