"""Each architecture the import takes, on a tiny random GGUF written with `gguf`'s GGUFWriter.

A reference model is built directly in mlx-lm from random float weights in Hugging Face's layout;
the same weights are then written as llama.cpp's converter writes them (its tensor names, the
llama Q/K row permutation, Gemma's norms stored as w + 1, Phi-3's fused projections), some of
them in quantized block types `gguf` can write (Q8_0, Q5_0, Q4_1, F16, BF16). The imported model
must give the reference's logits. The reference holds the values the blocks decode to, so at
float32 the two agree to rounding. The K-quants `gguf` can only read; the real Gemma 3 file
(test_gguf_gemma.py) covers them.
"""

from __future__ import annotations

import importlib
import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf import GGUFWriter
from gguf.quants import dequantize, quantize
from mlx.utils import tree_flatten

from worker.gguf.convert import import_gguf

HIDDEN, HEADS, KV_HEADS, FFN, HEAD_DIM = 64, 4, 2, 128, 16
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TOKENS = SPECIALS + [chr(c) for c in range(33, 127)] + ["Ġ", "Ċ", "he"]
# Long enough for RoPE's long wavelengths, which Llama 3's scaling stretches, to tell.
PROMPT = [1] + [3 + (7 * i) % 96 for i in range(1023)]

COMMON = {
    "hidden_size": HIDDEN,
    "intermediate_size": FFN,
    "num_attention_heads": HEADS,
    "num_key_value_heads": KV_HEADS,
    "rms_norm_eps": 1e-6,
    "vocab_size": len(TOKENS),
    "rope_theta": 10000.0,
    "max_position_embeddings": 256,
}
# The reference models, as a Hugging Face config.json would give them to mlx-lm.
REFERENCES: dict[str, dict[str, Any]] = {
    "llama": {"model_type": "llama", "num_hidden_layers": 2, "tie_word_embeddings": False},
    "llama3.1": {  # Llama 3.1's RoPE scaling, which llama.cpp stores as rope_freqs
        "model_type": "llama",
        "num_hidden_layers": 2,
        "tie_word_embeddings": True,
        "rope_theta": 500000.0,
        "rope_scaling": {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
    },
    "qwen2": {"model_type": "qwen2", "num_hidden_layers": 2, "tie_word_embeddings": True},
    "qwen3": {
        "model_type": "qwen3",
        "num_hidden_layers": 2,
        "head_dim": 32,  # unlike hidden / heads, as Qwen3's own
        "tie_word_embeddings": False,
    },
    "phi3": {"model_type": "phi3", "num_hidden_layers": 2, "tie_word_embeddings": False},
    "gemma3": {
        "model_type": "gemma3_text",
        "num_hidden_layers": 6,  # five sliding-window layers, then a global one
        "head_dim": 32,
        "query_pre_attn_scalar": 32,
        "sliding_window": 4,  # shorter than the prompt: the window matters
        "sliding_window_pattern": 6,
        "rope_theta": 1_000_000.0,
        "rope_local_base_freq": 10000.0,
    },
}

_LAYER_NAMES = {
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "self_attn.qkv_proj": "attn_qkv",
    "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.gate_up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
}
_GEMMA_NORMS = {
    "post_attention_layernorm": "post_attention_norm",
    "pre_feedforward_layernorm": "ffn_norm",
    "post_feedforward_layernorm": "post_ffw_norm",
}
# Block types per tensor kind: what llama.cpp's quantizer would mix in one file.
_TYPES = {"attn_q": Q.Q8_0, "attn_v": Q.Q5_0, "ffn_down": Q.Q4_1, "ffn_up": Q.F16}
_TYPES |= {"token_embd": Q.Q8_0, "attn_qkv": Q.Q8_0, "ffn_gate": Q.BF16, "output": Q.Q5_0}


def gguf_arch(case: str) -> str:
    return "llama" if case.startswith("llama") else case


def reference_model(case: str) -> tuple[Any, dict[str, np.ndarray], dict[str, Any]]:
    """mlx-lm's own model for a case of REFERENCES with random weights: (model, HF weights,
    config)."""
    config = {**COMMON, **REFERENCES[case]}
    arch = gguf_arch(case)
    module = importlib.import_module(f"mlx_lm.models.{config['model_type']}")
    model = module.Model(module.ModelArgs.from_dict(config))
    rng = np.random.default_rng(sum(map(ord, case)))
    weights = {}
    for name, param in tree_flatten(model.parameters()):
        scale = 0.3 if param.ndim == 2 else 0.1
        center = 1.0 if name.endswith("norm.weight") and arch != "gemma3" else 0.0
        weights[name] = rng.normal(center, scale, param.shape).astype(np.float32)
    stored = {n: _round_trip(_gguf_name(arch, n), w) for n, w in weights.items()}
    model.load_weights([(n, mx.array(w)) for n, w in stored.items()])
    return model, stored, config


def _block_type(gguf_name: str, values: np.ndarray) -> Q | None:
    if values.ndim != 2:
        return None
    stem = gguf_name.removesuffix(".weight")
    return _TYPES.get(stem.split(".")[-1] if stem.startswith("blk.") else stem)


def _round_trip(gguf_name: str, values: np.ndarray) -> np.ndarray:
    """The values a tensor holds once stored in its block type, as the reference must see."""
    kind = _block_type(gguf_name, values)
    if kind is None:
        return values
    return dequantize(quantize(values, kind), kind).reshape(values.shape)


def _gguf_name(arch: str, name: str) -> str:
    if name.startswith("model.layers."):
        layer, _, rest = name.removeprefix("model.layers.").partition(".")
        module, _, suffix = rest.rpartition(".")
        table = {**_LAYER_NAMES, **_GEMMA_NORMS} if arch == "gemma3" else _LAYER_NAMES
        return f"blk.{layer}.{table[module]}.{suffix}"
    top = {"model.embed_tokens": "token_embd", "model.norm": "output_norm", "lm_head": "output"}
    module, _, suffix = name.rpartition(".")
    return f"{top[module]}.{suffix}"


def _llama_permute(rows: np.ndarray, heads: int) -> np.ndarray:
    """convert_hf_to_gguf.py's LlamaModel.permute: HF's rotate-half rows to adjacent pairs."""
    return (
        rows.reshape(heads, 2, rows.shape[0] // heads // 2, *rows.shape[1:])
        .swapaxes(1, 2)
        .reshape(rows.shape)
    )


def gguf_tensor(arch: str, gguf_name: str, values: np.ndarray) -> np.ndarray:
    """`values` as llama.cpp's converter stores them for `arch`."""
    if arch == "llama" and gguf_name.split(".")[-2] in ("attn_q", "attn_k"):
        values = _llama_permute(values, HEADS if "attn_q" in gguf_name else KV_HEADS)
    if arch == "gemma3" and gguf_name.endswith("norm.weight"):
        values = values + 1  # Gemma3Model's norm_shift
    return values


def llama3_rope_factors(config: dict[str, Any]) -> np.ndarray:
    """convert_hf_to_gguf.py's LlamaModel.generate_extra_tensors, for a llama3 rope_scaling."""
    scaling, base, dim = config["rope_scaling"], config["rope_theta"], HIDDEN // HEADS
    context = scaling["original_max_position_embeddings"]
    low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
    factors = []
    for freq in 1.0 / (base ** (np.arange(0, dim, 2, dtype=np.float32) / dim)):
        wavelen = 2 * math.pi / freq
        if wavelen < context / high:
            factors.append(1.0)
        elif wavelen > context / low:
            factors.append(scaling["factor"])
        else:
            smooth = (context / wavelen - low) / (high - low)
            factors.append(1 / ((1 - smooth) / scaling["factor"] + smooth))
    return np.array(factors, dtype=np.float32)


def write_gguf(
    path: Path, case: str, weights: dict[str, np.ndarray], config: dict[str, Any]
) -> Path:
    arch = gguf_arch(case)
    writer = GGUFWriter(str(path), arch)
    _write_hyper_parameters(writer, arch, config)
    _write_vocabulary(writer)
    if "rope_scaling" in config:
        writer.add_tensor("rope_freqs.weight", llama3_rope_factors(config))
    for name, values in weights.items():
        gguf_name = _gguf_name(arch, name)
        stored = gguf_tensor(arch, gguf_name, values)
        kind = _block_type(gguf_name, stored)
        if kind is None:
            writer.add_tensor(gguf_name, stored)
        else:
            writer.add_tensor(gguf_name, quantize(stored, kind), raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _write_hyper_parameters(writer: GGUFWriter, arch: str, config: dict[str, Any]) -> None:
    head_dim = config.get("head_dim", HIDDEN // HEADS)
    for key, value in {
        "embedding_length": HIDDEN,
        "block_count": config["num_hidden_layers"],
        "feed_forward_length": FFN,
        "attention.head_count": HEADS,
        "attention.head_count_kv": KV_HEADS,
        "attention.key_length": head_dim,
        "attention.value_length": head_dim,
        "rope.dimension_count": head_dim,
        "context_length": 256,
    }.items():
        writer.add_uint32(f"{arch}.{key}", value)
    writer.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", 1e-6)
    writer.add_float32(f"{arch}.rope.freq_base", config["rope_theta"])
    if arch == "gemma3":
        writer.add_uint32(f"{arch}.attention.sliding_window", config["sliding_window"])


def _write_vocabulary(writer: GGUFWriter) -> None:
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2")
    writer.add_token_list(TOKENS)
    writer.add_token_types([3] * len(SPECIALS) + [1] * (len(TOKENS) - len(SPECIALS)))
    writer.add_token_merges(["h e"])
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)


def logits_of(model: Any) -> np.ndarray:
    return np.array(model(mx.array([PROMPT])).astype(mx.float32))


def imported_logits(out: Path) -> np.ndarray:
    import mlx_lm

    model, _ = mlx_lm.load(str(out))
    return logits_of(model)


Build = Callable[[str, Path], tuple[Path, np.ndarray]]


@pytest.fixture
def tiny_gguf(tmp_path: Path) -> Build:
    def build(arch: str, path: Path) -> tuple[Path, np.ndarray]:
        model, weights, config = reference_model(arch)
        return write_gguf(path, arch, weights, config), logits_of(model)

    return build


@pytest.mark.parametrize("arch", sorted(REFERENCES))
def test_imported_gguf_gives_the_logits_of_the_same_weights_in_mlx_lm(
    tmp_path: Path, tiny_gguf: Build, arch: str
) -> None:
    gguf, expected = tiny_gguf(arch, tmp_path / f"{arch}.gguf")
    out = import_gguf(gguf, tmp_path / "out", dtype="float32")
    got = imported_logits(out)
    assert got.shape == expected.shape
    np.testing.assert_allclose(got, expected, atol=2e-4, rtol=1e-4)
    # The same next token everywhere: what greedy decoding would pick.
    assert (got.argmax(-1) == expected.argmax(-1)).all()


@pytest.mark.parametrize(
    ("case", "key", "value"),
    [("llama", "rope_traditional", False), ("llama3.1", "rope_scaling", None)],
)
def test_without_what_the_import_writes_for_llamas_rope_the_logits_differ(
    tmp_path: Path, tiny_gguf: Build, case: str, key: str, value: Any
) -> None:
    # The check above has teeth: read as NeoX RoPE, the permuted rows give other logits; without
    # the scaling rope_freqs told, so do Llama 3.1's.
    gguf, expected = tiny_gguf(case, tmp_path / "llama.gguf")
    out = import_gguf(gguf, tmp_path / "out", dtype="float32")
    config = json.loads((out / "config.json").read_text())
    assert config[key] not in (None, False)
    (out / "config.json").write_text(json.dumps({**config, key: value}))
    assert np.abs(imported_logits(out) - expected).max() > 1e-2


# The mean error relative to the mean logit: 8 bits lose little, 4 bits of random weights more.
@pytest.mark.parametrize(("dtype", "tolerance"), [("keep", 0.03), ("q8", 0.03), ("q4", 0.4)])
def test_quantized_imports_stay_near_the_float_model(
    tmp_path: Path, tiny_gguf: Build, dtype: str, tolerance: float
) -> None:
    gguf, expected = tiny_gguf("qwen3", tmp_path / "qwen3.gguf")
    out = import_gguf(gguf, tmp_path / "out", dtype=dtype)
    config = json.loads((out / "config.json").read_text())
    quantization = config["quantization"]
    assert quantization["group_size"] == 32
    if dtype == "keep":  # Q8_0 and Q5_0 become 8 bits, Q4_1 4 bits; F16 and BF16 stay float
        assert quantization["bits"] == 8
        assert quantization["model.layers.0.mlp.down_proj"] == {"group_size": 32, "bits": 4}
        weights = mx.load(str(out / "model.safetensors"))
        assert isinstance(weights, dict) and "model.layers.0.mlp.up_proj.scales" not in weights
        assert weights["model.layers.0.mlp.up_proj.weight"].dtype == mx.float16
        assert weights["model.layers.0.mlp.gate_proj.weight"].dtype == mx.bfloat16
    else:
        assert quantization["bits"] == {"q8": 8, "q4": 4}[dtype]
    error = np.abs(imported_logits(out) - expected).mean() / np.abs(expected).mean()
    assert error < tolerance
