"""The worker's streaming detokenizer (worker/engine/sequence/detokenize.py) on each family's
real vocabulary: fed one token at a time it writes exactly what the tokenizer's own decode
writes, special tokens and characters split across tokens included."""

from __future__ import annotations

import functools
from collections.abc import Callable

import pytest

from tests.families.vocab import FAMILIES, deepseek, family_tokenizer
from worker.engine.sequence.detokenize import (
    ByteLevelDecoder,
    TextDecoder,
    byte_table_of,
    decoder_factory,
    token_pieces,
)

# Characters that byte-level vocabularies split across tokens (rare CJK, emoji sequences).
TEXT = "Ünïcödé 龘 鱻 🧑‍🚀🫠 ok: 你好, 😀\n"
MARKED = {  # text with the family's markers written in it
    "qwen3": "<think>\n" + TEXT + "</think>\n\n" + TEXT + "<|im_end|>",
    "gpt-oss": "<|channel|>analysis<|message|>" + TEXT + "<|end|><|start|>assistant"
    "<|channel|>final<|message|>" + TEXT + "<|return|>",
    "deepseek-r1": TEXT + "</think>\n\n" + TEXT + deepseek("end of sentence"),
    "llama3": "<|python_tag|>" + TEXT + "<|eom_id|><|eot_id|>",
    "phi4-mini": TEXT + "<|end|>",
    "gemma": TEXT + "<end_of_turn>",
    "mistral": "[TOOL_CALLS]" + TEXT + "</s>",
}


@functools.cache
def table_of(family: str) -> list[bytes] | None:
    """The family's byte table (its whole vocabulary: a second or so to make)."""
    return byte_table_of(family_tokenizer(family))


def new_decoder(family: str) -> Callable[[], TextDecoder]:
    """The worker's decoder constructor for the family."""
    return decoder_factory(family_tokenizer(family), table_of(family))


def piece_of(family: str) -> Callable[[int], bytes]:
    return token_pieces(family_tokenizer(family), table_of(family))


def streamed(family: str, ids: list[int]) -> list[str]:
    decoder = new_decoder(family)()
    pieces = [decoder.add(token) for token in ids]
    return [*pieces, decoder.finish()]


def test_every_family_has_a_marked_text() -> None:
    assert set(MARKED) == set(FAMILIES)


@pytest.mark.parametrize("family", FAMILIES)
def test_the_stream_decodes_each_familys_markers_and_text_as_its_tokenizer_does(
    family: str,
) -> None:
    tokenizer = family_tokenizer(family)
    ids = tokenizer.encode(MARKED[family], add_special_tokens=False)
    assert isinstance(new_decoder(family)(), ByteLevelDecoder)
    assert "".join(streamed(family, ids)) == tokenizer.decode(ids) == MARKED[family]


@pytest.mark.parametrize("family", FAMILIES)
def test_a_character_split_across_tokens_comes_out_whole_at_its_last_token(family: str) -> None:
    tokenizer = family_tokenizer(family)
    piece = piece_of(family)
    ids = tokenizer.encode(TEXT, add_special_tokens=False)
    split = [i for i, token in enumerate(ids) if not _is_utf8(piece(token))]
    assert split, "the text must split a character across tokens to test this"
    shown = streamed(family, ids)
    assert all("\ufffd" not in text for text in shown)
    assert "".join(shown) == TEXT


@pytest.mark.parametrize("family", FAMILIES)
def test_a_special_tokens_piece_is_its_text(family: str) -> None:
    tokenizer = family_tokenizer(family)
    piece = piece_of(family)
    for token in sorted(tokenizer.eos_token_ids):
        assert piece(token) == tokenizer.convert_ids_to_tokens(token).encode()


def _is_utf8(data: bytes) -> bool:
    try:
        data.decode()
    except UnicodeDecodeError:
        return False
    return True
