"""A GGUF's vocabulary, rebuilt by the importer (worker/gguf/tokenizer.py), encodes like the
family's own tokenizer.json: Qwen 2.5/3's real ranks, written as llama.cpp's converter writes them
(`tokenizer.ggml.model` gpt2, `pre` qwen2, the tokens in id order, the merges, special tokens as
control and the text-like markers as user-defined tokens)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from tokenizers import Tokenizer

from tests.families.vocab import family_dir
from worker.gguf.tokenizer import build_tokenizer

TEXTS = [
    "Hello, world! It's 2026: 12345 apples cost $3.50.",
    "  leading spaces\tand\ttabs\n\n\nnew lines  ",
    "Ünïcödé 龘 鱻 🧑‍🚀🫠 你好, 😀 café",  # NFC composes the é in "café"
    "<|im_start|>user\nWhat's <think>up</think>?<|im_end|>\n",
    "def f(x):\n    return x**2  # don't\r\n",
]


def gguf_metadata(tokenizer_json: dict[str, Any]) -> dict[str, Any]:
    model = tokenizer_json["model"]
    added = {t["id"]: t for t in tokenizer_json["added_tokens"]}
    size = max([*model["vocab"].values(), *added]) + 1
    tokens = [""] * size
    for token, index in model["vocab"].items():
        tokens[index] = token
    types = [1] * size
    for index, token in added.items():
        tokens[index] = token["content"]
        types[index] = 3 if token["special"] else 4
    return {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "qwen2",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.merges": model["merges"],
        "tokenizer.ggml.eos_token_id": 151645,
        "tokenizer.ggml.add_bos_token": False,
    }


@pytest.fixture(scope="module")
def both() -> tuple[Tokenizer, Tokenizer]:
    path = family_dir("qwen3") / "tokenizer.json"
    rebuilt, _ = build_tokenizer(gguf_metadata(json.loads(path.read_text())), 40960)
    return rebuilt, Tokenizer.from_file(str(path))


@pytest.mark.parametrize("text", TEXTS)
def test_qwen_gguf_vocabulary_encodes_and_decodes_like_qwens_tokenizer(
    both: tuple[Tokenizer, Tokenizer], text: str
) -> None:
    rebuilt, own = both
    ids = own.encode(text).ids
    assert rebuilt.encode(text).ids == ids
    assert rebuilt.decode(ids, skip_special_tokens=False) == own.decode(
        ids, skip_special_tokens=False
    )
