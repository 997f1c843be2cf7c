"""The table of GGUF architectures mlxq imports, and what each one needs to become an mlx-lm model.

This module owns every per-family fact of the import: llama.cpp's tensor names against mlx-lm's,
the hyper-parameters `config.json` takes from `<arch>.*` metadata, and the ways a GGUF stores a
family differently from the Hugging Face weights mlx-lm reads:

- llama (and Mistral, which llama.cpp writes as llama): `convert_hf_to_gguf.py` permutes the Q
  and K rows for llama.cpp's rotate-adjacent-pairs RoPE. That is MLX's "traditional" RoPE, so
  `rope_traditional: true` makes the permuted weights right as they are. Llama 3.1's RoPE
  scaling is stored as a tensor of per-dimension factors (`rope_freqs`), not as its parameters:
  it is recognised, checked factor by factor, and written as mlx-lm's `llama3` rope_scaling.
- qwen2, qwen3, phi3, gemma3: NeoX RoPE, stored unpermuted.
- gemma3: Gemma's RMSNorm scales by (1 + w); the converter stores w + 1 for every `*norm.weight`
  (its `norm_shift`), while mlx-lm's gemma3_text adds the 1 itself: the import subtracts it.
  Gemma GGUFs often carry no chat template: Gemma's turn format is the fallback.
- phi3: Q, K and V stay fused (`attn_qkv`) and so do gate and up (`ffn_up`), as in mlx-lm's phi3.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from shared.wire.errors import ModelImportError
from worker.gguf.file import Metadata, get_float, get_int, get_optional_int

ConfigExtras = Callable[[Metadata, str, int], dict[str, Any]]
RopeFactors = Callable[[Metadata, str, int, np.ndarray[Any, Any]], dict[str, Any]]
ROPE_FREQS = "rope_freqs.weight"

GLOBAL_TENSORS = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}
_ATTENTION = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
}
_MLP = {"ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj"}
_NORMS = {"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm"}
_QK_NORMS = {"attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm"}

GEMMA_CHAT_TEMPLATE = (
    "{{ bos_token }}{% set ns = namespace(system='') %}"
    "{% if messages and messages[0]['role'] == 'system' %}"
    "{% set ns.system = messages[0]['content'] + '\n\n' %}{% endif %}"
    "{% for message in messages %}{% if message['role'] != 'system' %}"
    "{% set role = 'model' if message['role'] == 'assistant' else 'user' %}"
    "{{ '<start_of_turn>' + role + '\n' + ns.system + (message['content'] or '') | trim"
    " + '<end_of_turn>\n' }}{% set ns.system = '' %}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}"
)


@dataclass(frozen=True)
class Architecture:
    """One `general.architecture` value and how it becomes an mlx-lm model."""

    model_type: str  # mlx-lm's module under mlx_lm.models
    hf_class: str
    block_tensors: Mapping[str, str]
    extras: ConfigExtras = field(default=lambda meta, arch, head_dim: {})
    norm_shift: float = 0.0  # subtracted from every *norm.weight (Gemma stores w + 1)
    rope_factors: RopeFactors | None = None  # what a `rope_freqs` tensor becomes in config.json
    chat_template: str | None = None  # when the file carries none

    def mlx_name(self, gguf_name: str) -> str:
        """llama.cpp's tensor name as mlx-lm's, keeping the suffix (weight or bias)."""
        stem, _, suffix = gguf_name.rpartition(".")
        if suffix in ("weight", "bias"):
            if stem in GLOBAL_TENSORS:
                return f"{GLOBAL_TENSORS[stem]}.{suffix}"
            layer, _, part = stem.removeprefix("blk.").partition(".")
            if stem.startswith("blk.") and layer.isdigit() and part in self.block_tensors:
                return f"model.layers.{layer}.{self.block_tensors[part]}.{suffix}"
        # e.g. rope_freqs (Llama 3.1's rope scaling) or LongRoPE's factors: no faithful mapping.
        raise ModelImportError(f"unsupported tensor {gguf_name!r} in a {self.model_type} GGUF")

    def fix(self, name: str) -> Callable[[str, np.ndarray[Any, Any]], np.ndarray[Any, Any]] | None:
        """The rewrite a tensor's float values need for mlx-lm, or None."""
        if self.norm_shift and name.endswith("norm.weight"):
            return lambda _, values: values - np.float32(self.norm_shift)
        return None


def _llama_extras(meta: Metadata, arch: str, head_dim: int) -> dict[str, Any]:
    return {"rope_traditional": True, **_linear_rope_scaling(meta, arch)}


# Llama 3.1, 3.2 and 3.3's rope_scaling, but for `factor` (8 or 32), which the factors tell.
_LLAMA3_SCALING = {
    "rope_type": "llama3",
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}


def _llama3_rope_scaling(
    meta: Metadata, arch: str, head_dim: int, factors: np.ndarray[Any, Any]
) -> dict[str, Any]:
    scaling = {**_LLAMA3_SCALING, "factor": float(factors.max())}
    base = get_float(meta, f"{arch}.rope.freq_base", 10000.0)
    if factors.shape != (head_dim // 2,) or not np.allclose(
        factors, llama3_rope_factors(base, head_dim, scaling), rtol=1e-5
    ):
        raise ModelImportError("rope_freqs holds RoPE factors other than Llama 3's scaling")
    return {"rope_scaling": scaling}


def llama3_rope_factors(
    base: float, head_dim: int, scaling: dict[str, Any]
) -> np.ndarray[Any, Any]:
    """The factors convert_hf_to_gguf.py stores for a Llama 3 rope_scaling: 1 for short
    wavelengths, `factor` for long ones, a smooth step between."""
    wavelens = 2 * np.pi * base ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    context, factor = scaling["original_max_position_embeddings"], scaling["factor"]
    low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
    smooth = (context / wavelens - low) / (high - low)
    medium = 1 / ((1 - smooth) / factor + smooth)
    step = np.where(wavelens > context / low, factor, medium)
    return np.where(wavelens < context / high, 1.0, step)


def _qwen3_extras(meta: Metadata, arch: str, head_dim: int) -> dict[str, Any]:
    return {"head_dim": head_dim, **_linear_rope_scaling(meta, arch)}


def _phi3_extras(meta: Metadata, arch: str, head_dim: int) -> dict[str, Any]:
    rope_dims = get_int(meta, f"{arch}.rope.dimension_count", head_dim)
    context = get_int(meta, f"{arch}.context_length", 4096)
    original = get_int(meta, f"{arch}.rope.scaling.original_context_length", context)
    return {
        "partial_rotary_factor": rope_dims / head_dim,
        "original_max_position_embeddings": original,
    }


def _gemma3_extras(meta: Metadata, arch: str, head_dim: int) -> dict[str, Any]:
    layers = get_int(meta, f"{arch}.block_count")
    hidden = get_int(meta, f"{arch}.embedding_length")
    heads = get_int(meta, f"{arch}.attention.head_count")
    # llama.cpp (llama-model.cpp, LLM_ARCH_GEMMA3) scales queries by 1/sqrt(head_dim), except for
    # the 27B (62 layers), scaled by hidden / heads; the local RoPE base and the pattern of five
    # sliding-window layers to one global layer are fixed there, not stored in the file.
    return {
        "head_dim": head_dim,
        "query_pre_attn_scalar": hidden // heads if layers == 62 else head_dim,
        "sliding_window": get_int(meta, f"{arch}.attention.sliding_window", 4096),
        "sliding_window_pattern": 6,
        "rope_local_base_freq": 10000.0,
        **_linear_rope_scaling(meta, arch),
    }


def _linear_rope_scaling(meta: Metadata, arch: str) -> dict[str, Any]:
    kind = meta.get(f"{arch}.rope.scaling.type", "none")
    if kind == "none":
        return {}
    if kind == "linear":
        factor = get_float(meta, f"{arch}.rope.scaling.factor")
        return {"rope_scaling": {"type": "linear", "factor": factor}}
    raise ModelImportError(f"unsupported RoPE scaling {kind!r}")


_LLAMA_BLOCK = {**_ATTENTION, **_MLP, **_NORMS}

ARCHITECTURES: dict[str, Architecture] = {
    "llama": Architecture(
        "llama",
        "LlamaForCausalLM",
        _LLAMA_BLOCK,
        _llama_extras,
        rope_factors=_llama3_rope_scaling,
    ),
    "qwen2": Architecture(
        "qwen2", "Qwen2ForCausalLM", _LLAMA_BLOCK, lambda m, a, h: _linear_rope_scaling(m, a)
    ),
    "qwen3": Architecture(
        "qwen3", "Qwen3ForCausalLM", {**_LLAMA_BLOCK, **_QK_NORMS}, _qwen3_extras
    ),
    "phi3": Architecture(
        "phi3",
        "Phi3ForCausalLM",
        {
            "attn_qkv": "self_attn.qkv_proj",
            "attn_output": "self_attn.o_proj",
            "ffn_up": "mlp.gate_up_proj",
            "ffn_down": "mlp.down_proj",
            **_NORMS,
        },
        _phi3_extras,
    ),
    "gemma3": Architecture(
        "gemma3_text",
        "Gemma3ForCausalLM",
        {
            **_ATTENTION,
            **_MLP,
            **_QK_NORMS,
            "attn_norm": "input_layernorm",
            "post_attention_norm": "post_attention_layernorm",
            "ffn_norm": "pre_feedforward_layernorm",
            "post_ffw_norm": "post_feedforward_layernorm",
        },
        _gemma3_extras,
        norm_shift=1.0,
        chat_template=GEMMA_CHAT_TEMPLATE,
    ),
}


def architecture(meta: Metadata) -> tuple[str, Architecture]:
    """The file's architecture name and entry; an architecture not in the table is refused."""
    name = str(meta.get("general.architecture"))
    if name not in ARCHITECTURES:
        known = ", ".join(sorted(ARCHITECTURES))
        raise ModelImportError(f"unsupported architecture {name!r}: mlxq imports {known}")
    return name, ARCHITECTURES[name]


def head_dim(meta: Metadata, arch: str) -> int:
    """The attention head size: key_length where stored, else hidden / heads."""
    hidden = get_int(meta, f"{arch}.embedding_length")
    heads = get_int(meta, f"{arch}.attention.head_count")
    size = get_int(meta, f"{arch}.attention.key_length", hidden // heads)
    if get_int(meta, f"{arch}.attention.value_length", size) != size:
        raise ModelImportError("attention with different key and value head sizes is unsupported")
    rope_dims = get_optional_int(meta, f"{arch}.rope.dimension_count")
    if rope_dims is not None and rope_dims != size and arch != "phi3":
        raise ModelImportError(f"partial RoPE ({rope_dims} of {size} dims) is unsupported")
    return size
