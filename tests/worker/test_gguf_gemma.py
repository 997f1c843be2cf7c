"""The real Gemma 3 270M in Q4_K_M, imported from its GGUF: Q4_K, Q5_0, Q6_K and Q8_0 tensors
dequantized by `gguf`, Gemma's norms and SentencePiece vocabulary, against llama.cpp itself.

tests/data/gemma3_llamacpp_reference.json holds llama.cpp's tokens for five prompts, from two
runs: "f32", llama.cpp on the same weights dequantized to F32 (the weights the import keeps),
and "q4_k_m", llama.cpp on the file as shipped, whose CPU kernels quantize the activations too.
The import must tokenize each prompt as llama.cpp does and continue it greedily, 32 tokens, as
llama.cpp does on the F32 weights. Against the Q4_K_M run, the prompts agree on the tokens
listed in Q4_K_M_AGREEMENT (measured): after that a close call goes the other way.
"""

from __future__ import annotations

import json
from typing import Any

import mlx.core as mx
import pytest

from tests.gemma3 import END_OF_TURN, REFERENCE, imported_gemma

# How many leading tokens of each prompt's greedy answer equal llama.cpp's on the Q4_K_M file.
Q4_K_M_AGREEMENT = [15, 32, 4, 32, 32]


@pytest.fixture(scope="module")
def gemma() -> tuple[Any, Any]:
    import mlx_lm

    model, tokenizer = mlx_lm.load(str(imported_gemma()))
    return model, tokenizer


def greedy(model: Any, tokenizer: Any, prompt_tokens: list[int], limit: int) -> list[int]:
    from mlx_lm.generate import stream_generate

    out = []
    for step in stream_generate(model, tokenizer, mx.array(prompt_tokens), max_tokens=limit):
        if step.token in tokenizer.eos_token_ids:
            break
        out.append(step.token)
    return out


def test_gemma_config_is_gemma3_text_with_its_end_of_turn_as_an_end_token() -> None:
    config = json.loads((imported_gemma() / "config.json").read_text())
    assert config["model_type"] == "gemma3_text"
    assert (config["head_dim"], config["sliding_window"], config["query_pre_attn_scalar"]) == (
        256,
        512,
        256,
    )
    assert config["eos_token_id"] == [1, END_OF_TURN]  # <eos>, then <end_of_turn>
    assert "quantization" not in config  # float32: the CPU's fast path


@pytest.mark.parametrize("case", range(len(REFERENCE["runs"]["f32"])))
def test_gemma_tokenizes_like_llama_cpp(gemma: tuple[Any, Any], case: int) -> None:
    _, tokenizer = gemma
    expected = REFERENCE["runs"]["f32"][case]
    assert tokenizer.encode(expected["prompt"]) == expected["prompt_tokens"]


def argmax_path(model: Any, case: dict[str, Any]) -> list[int]:
    """The model's argmax after the prompt and after each of llama.cpp's tokens, in one forward
    pass: where every one equals llama.cpp's next token, greedy decoding gives llama.cpp's."""
    tokens = case["prompt_tokens"] + case["tokens"]
    logits = model(mx.array([tokens[:-1]]))[0, len(case["prompt_tokens"]) - 1 :]
    return [int(t) for t in mx.argmax(logits, axis=-1).tolist()]


def test_gemma_greedy_tokens_equal_llama_cpp_on_the_same_weights(gemma: tuple[Any, Any]) -> None:
    model, _ = gemma
    for case in REFERENCE["runs"]["f32"]:
        assert len(case["tokens"]) == REFERENCE["new_tokens"] == 32
        assert argmax_path(model, case) == case["tokens"], case["prompt"]


def test_gemma_follows_llama_cpp_on_the_q4_k_m_file_until_its_arithmetic_parts(
    gemma: tuple[Any, Any],
) -> None:
    model, _ = gemma
    for case, agree in zip(REFERENCE["runs"]["q4_k_m"], Q4_K_M_AGREEMENT, strict=True):
        assert argmax_path(model, case)[:agree] == case["tokens"][:agree], case["prompt"]


def test_gemma_decodes_llama_cpps_answer_token_by_token(gemma: tuple[Any, Any]) -> None:
    # Real decoding, the KV cache and its sliding window included, on the first prompt.
    model, tokenizer = gemma
    case = REFERENCE["runs"]["f32"][0]
    answer = greedy(model, tokenizer, case["prompt_tokens"], 16)
    assert answer == case["tokens"][:16]
    assert tokenizer.decode(answer).startswith(" the capital of the country of France.")
