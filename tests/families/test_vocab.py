"""The families' tokenizers (tests/families/vocab.py) on real vocabularies: they encode text as
the vocabularies' reference encoders do, their markers sit at the families' real ids, and they
are built once and reused.

Measured on this project's 2-core machine: building the six rank-table tokenizers takes about
11 s (merges for o200k 4 s, Qwen 2.5 s, Llama 3 2.5 s; each stand-in on ranks already merged,
under 1 s); loading one through mlx-lm 2 to 4 s. Built directories are kept in the user's cache
folder, so a later run, from any clone, pays only the loads.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import quicktok

from tests.families.vocab import FAMILIES, deepseek, family_dir, family_tokenizer, tokenizer_at

TEXTS = [
    "Hello world! How are you doing today?",
    "émoji 😀🧑‍🚀\n\ttabs  and   spaces\n\n\n",
    "日本語のテキスト、中文文本 한국어 텍스트",
    "def f(x):\n    return x**2 + 12345678\n",
    "I'm we'll THEY'RE don't HELLO'S",
    "https://example.com/path?q=1&x=2#frag <html>",
    "Ünïcödé ñ ß ø Ω ∑ ∫ √ ≈ ≠",
    "  leading and trailing  ",
    "مرحبا بالعالم",
    "Привет, мир! 1234567 3.14159",
]

# family -> (quicktok's encoding of the same ranks, how far the family shifts their ids)
REFERENCE = {
    "qwen3": ("qwen3", 0),
    "gpt-oss": ("o200k_base", 0),
    "llama3": ("llama3", 0),
    "phi4-mini": ("o200k_base", 0),
    "gemma": ("llama3", 108),
    "mistral": ("o200k_base", 1000),
}

# The ids of each family's chat markers (facts of the families; Gemma's and Mistral's at the
# real ids of their stand-ins).
MARKERS = {
    "qwen3": {
        "<|endoftext|>": 151643,
        "<|im_start|>": 151644,
        "<|im_end|>": 151645,
        "<tool_call>": 151657,
        "</tool_call>": 151658,
        "<tool_response>": 151665,
        "</tool_response>": 151666,
        "<think>": 151667,
        "</think>": 151668,
    },
    "gpt-oss": {
        "<|startoftext|>": 199998,
        "<|endoftext|>": 199999,
        "<|return|>": 200002,
        "<|constrain|>": 200003,
        "<|channel|>": 200005,
        "<|start|>": 200006,
        "<|end|>": 200007,
        "<|message|>": 200008,
        "<|call|>": 200012,
        "<|endofprompt|>": 200018,
    },
    "deepseek-r1": {
        deepseek("begin of sentence"): 0,
        deepseek("end of sentence"): 1,
        deepseek("User"): 128803,
        deepseek("Assistant"): 128804,
        deepseek("tool calls begin"): 128806,
        deepseek("tool sep"): 128814,
        "<think>": 128821,
        "</think>": 128822,
    },
    "llama3": {
        "<|begin_of_text|>": 128000,
        "<|end_of_text|>": 128001,
        "<|start_header_id|>": 128006,
        "<|end_header_id|>": 128007,
        "<|eom_id|>": 128008,
        "<|eot_id|>": 128009,
        "<|python_tag|>": 128010,
    },
    "phi4-mini": {
        "<|endoftext|>": 199999,
        "<|assistant|>": 200019,
        "<|end|>": 200020,
        "<|user|>": 200021,
        "<|tool|>": 200023,
    },
    "gemma": {"<pad>": 0, "<eos>": 1, "<bos>": 2, "<start_of_turn>": 106, "<end_of_turn>": 107},
    "mistral": {"<s>": 1, "</s>": 2, "[INST]": 3, "[/INST]": 4, "[TOOL_CALLS]": 9},
}

VOCABULARY = {  # tokens the tokenizer knows (the model's logits may be wider)
    "qwen3": 151669,
    "gpt-oss": 201088,
    "deepseek-r1": 129280,
    "llama3": 128256,
    "phi4-mini": 200064,
    "gemma": 128108,
    "mistral": 200998,
}


@pytest.mark.parametrize("family", sorted(REFERENCE))
def test_each_tokenizer_encodes_text_as_its_vocabularys_reference_encoder(family: str) -> None:
    encoding, shift = REFERENCE[family]
    reference = quicktok.get_encoding(encoding)
    tokenizer = family_tokenizer(family)
    for text in TEXTS:
        ids = tokenizer.encode(text, add_special_tokens=False)
        assert [i - shift for i in ids] == list(reference.encode_ordinary(text)), text
        assert tokenizer.decode(ids) == text


@pytest.mark.parametrize("family", FAMILIES)
def test_markers_sit_at_the_familys_real_ids_and_encode_as_one_token(family: str) -> None:
    tokenizer = family_tokenizer(family)
    assert len(tokenizer) == VOCABULARY[family]
    for marker, token_id in MARKERS[family].items():
        assert tokenizer.convert_tokens_to_ids(marker) == token_id, marker
        assert tokenizer.encode("a" + marker + "b", add_special_tokens=False)[1] == token_id


def test_qwen3_writes_its_think_and_tool_markers_as_text_not_as_special_tokens() -> None:
    tokenizer = family_tokenizer("qwen3")
    ids = tokenizer.encode("<think>\nhm\n</think>\n\nok<|im_end|>", add_special_tokens=False)
    assert tokenizer.decode(ids, skip_special_tokens=True) == "<think>\nhm\n</think>\n\nok"


def test_llama3_prepends_begin_of_text_when_asked_for_special_tokens() -> None:
    tokenizer = family_tokenizer("llama3")
    assert tokenizer.encode("hi")[0] == 128000
    assert 128000 not in tokenizer.encode("hi", add_special_tokens=False)


def test_a_family_directory_is_built_once_and_rebuilt_if_left_unfinished(tmp_path: Path) -> None:
    built = family_dir("deepseek-r1", tmp_path)
    assert family_dir("deepseek-r1", tmp_path) == built
    stamp = (built / "tokenizer.json").stat().st_mtime_ns
    assert {p.name for p in built.iterdir()} == {
        "tokenizer.json",
        "tokenizer_config.json",
        "generation_config.json",
        "family.json",
    }
    other = tmp_path / "again"
    (other / "deepseek-r1").mkdir(parents=True)  # as a build that died would leave it
    (other / "deepseek-r1" / "tokenizer.json").write_text("{")
    rebuilt = family_dir("deepseek-r1", other)
    assert (rebuilt / "family.json").is_file()
    assert (built / "tokenizer.json").stat().st_mtime_ns == stamp
    assert len(tokenizer_at(rebuilt)) == VOCABULARY["deepseek-r1"]


def test_an_unknown_family_is_named_in_the_error() -> None:
    with pytest.raises(KeyError, match="qwen3"):
        family_dir("qwen9")
