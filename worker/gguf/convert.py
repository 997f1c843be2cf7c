"""Import a llama-architecture GGUF file into a model directory that `mlx_lm.load` accepts.

This module owns the import itself, from llama.cpp's single-file format to mlx-lm's layout:
renaming llama.cpp's tensors to mlx-lm's, keeping quantized tensors quantized or dequantizing
them to a chosen dtype, writing `config.json` and `generation_config.json`, and writing the
model directory atomically. Reading the file lives in `worker.gguf.file` and rebuilding the
tokenizer in `worker.gguf.tokenizer`. Anything it cannot convert faithfully is refused with
`ModelImportError` rather than approximated.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import mlx.core as mx
from tokenizers import Tokenizer

from shared.wire.errors import ModelImportError
from worker.gguf.file import (
    Metadata,
    Weights,
    check_header,
    get_float,
    get_int,
    get_optional_int,
    get_strings,
    load,
)
from worker.gguf.tokenizer import build_tokenizer, special_tokens_map

GROUP_SIZE = 32  # every GGUF block type we accept packs 32 values per scale

_DTYPES = {"float32": mx.float32, "float16": mx.float16, "bfloat16": mx.bfloat16}

_GLOBAL_TENSORS = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}
_BLOCK_TENSORS = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}

_BLOCK_NAME = re.compile(r"blk\.(\d+)\.(\w+)")


def import_gguf(
    gguf_path: Path, out_dir: Path, *, dtype: str | None = None, overwrite: bool = False
) -> Path:
    """Convert `gguf_path` into an mlx-lm model directory at `out_dir` and return `out_dir`.

    `dtype=None` keeps the file's layout (quantized tensors stay quantized); "float32",
    "float16" or "bfloat16" dequantizes everything and casts every floating tensor to it.
    The directory appears whole or not at all. Raises `ModelImportError` for anything that
    cannot be converted faithfully.
    """
    gguf_path, out_dir = Path(gguf_path), Path(out_dir)
    if dtype is not None and dtype not in _DTYPES:
        raise ModelImportError(f"dtype must be one of {sorted(_DTYPES)} or None, not {dtype!r}")
    _check_target(out_dir, overwrite)
    check_header(gguf_path)
    raw, meta = load(gguf_path)
    weights = {_mlx_name(name): array for name, array in raw.items()}
    bits = _quantized_bits(weights)
    if dtype is not None:
        weights, bits = _dequantized(weights, bits, _DTYPES[dtype]), {}
    tokenizer, tokenizer_config = build_tokenizer(meta)
    eos_ids = _eos_token_ids(meta)
    config = _model_config(meta, weights, bits, eos_ids)
    files = {
        "config.json": config,
        "tokenizer_config.json": tokenizer_config,
        "special_tokens_map.json": special_tokens_map(tokenizer_config),
        "generation_config.json": _generation_config(meta, eos_ids),
    }
    _write_model_dir(out_dir, weights, tokenizer, files, overwrite)
    return out_dir


def _check_target(out_dir: Path, overwrite: bool) -> None:
    if out_dir.is_file():
        raise ModelImportError(f"{out_dir} is a file, not a model directory")
    if out_dir.is_dir() and any(out_dir.iterdir()) and not overwrite:
        raise ModelImportError(f"{out_dir} already exists and is not empty (pass overwrite=True)")


def _mlx_name(gguf_name: str) -> str:
    """Map a llama.cpp tensor name to mlx-lm's llama name, keeping the suffix."""
    stem, _, suffix = gguf_name.rpartition(".")
    if suffix in ("weight", "scales", "biases"):
        if stem in _GLOBAL_TENSORS:
            return f"{_GLOBAL_TENSORS[stem]}.{suffix}"
        block = _BLOCK_NAME.fullmatch(stem)
        if block is not None and block[2] in _BLOCK_TENSORS:
            return f"model.layers.{block[1]}.{_BLOCK_TENSORS[block[2]]}.{suffix}"
    # e.g. rope_freqs (Llama 3.1 rope scaling) or attention biases: no faithful mapping here.
    raise ModelImportError(f"unsupported tensor {gguf_name!r} in a llama GGUF")


def _quantized_bits(weights: Weights) -> dict[str, int]:
    """Return {module path: bits} for every module mlx unpacked into weight/scales/biases."""
    bits: dict[str, int] = {}
    for name in weights:
        if not name.endswith(".scales"):
            continue
        prefix = name.removesuffix(".scales")
        weight, scales = weights.get(f"{prefix}.weight"), weights[name]
        if weight is None or weight.dtype != mx.uint32 or f"{prefix}.biases" not in weights:
            raise ModelImportError(f"{prefix} has scales but no packed uint32 weight and biases")
        # A uint32 packs 32 // bits values and each scale covers GROUP_SIZE of them.
        packed_bits = weight.shape[-1] * 32
        n_values = scales.shape[-1] * GROUP_SIZE
        if packed_bits % n_values or packed_bits // n_values not in (4, 8):
            raise ModelImportError(f"{prefix} has an unexpected quantized layout {weight.shape}")
        bits[prefix] = packed_bits // n_values
    return bits


def _dequantized(weights: Weights, bits: dict[str, int], dtype: mx.Dtype) -> Weights:
    out: Weights = {}
    for name, array in weights.items():
        prefix, _, suffix = name.rpartition(".")
        if prefix in bits:
            if suffix != "weight":
                continue
            # Dequantize in float32: float16 scales times codes would round twice.
            scales = weights[f"{prefix}.scales"].astype(mx.float32)
            biases = weights[f"{prefix}.biases"].astype(mx.float32)
            array = mx.dequantize(array, scales, biases, group_size=GROUP_SIZE, bits=bits[prefix])
        if not mx.issubdtype(array.dtype, mx.floating):
            raise ModelImportError(f"tensor {name} has non-float type {array.dtype}")
        out[name] = array.astype(dtype)
    return out


def _model_config(
    meta: Metadata, weights: Weights, bits: dict[str, int], eos_ids: list[int]
) -> dict[str, Any]:
    hidden = get_int(meta, "llama.embedding_length")
    heads = get_int(meta, "llama.attention.head_count")
    head_dim = _head_dim(meta, weights, hidden, heads)
    config: dict[str, Any] = {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": hidden,
        "num_hidden_layers": get_int(meta, "llama.block_count"),
        "intermediate_size": get_int(meta, "llama.feed_forward_length"),
        "num_attention_heads": heads,
        "num_key_value_heads": get_int(meta, "llama.attention.head_count_kv", heads),
        "rms_norm_eps": get_float(meta, "llama.attention.layer_norm_rms_epsilon", 1e-5),
        "rope_theta": get_float(meta, "llama.rope.freq_base", 10000.0),
        "max_position_embeddings": get_int(meta, "llama.context_length", 2048),
        "vocab_size": _vocab_size(meta, weights),
        "tie_word_embeddings": "lm_head.weight" not in weights,
        # llama.cpp permutes the Q and K rows for its rotate-adjacent-pairs RoPE, which is
        # MLX's "traditional" RoPE: the permuted weights then work as they are.
        "rope_traditional": True,
        "eos_token_id": eos_ids,
    }
    if head_dim != hidden // heads:
        config["head_dim"] = head_dim
    if (rope_scaling := _rope_scaling(meta)) is not None:
        config["rope_scaling"] = rope_scaling
    if (bos := get_optional_int(meta, "tokenizer.ggml.bos_token_id")) is not None:
        config["bos_token_id"] = bos
    if bits:
        config["quantization"] = _quantization_config(bits)
    return config


def _head_dim(meta: Metadata, weights: Weights, hidden: int, heads: int) -> int:
    rope_dims = get_optional_int(meta, "llama.rope.dimension_count")
    head_dim = get_int(meta, "llama.attention.key_length", rope_dims or hidden // heads)
    if get_int(meta, "llama.attention.value_length", head_dim) != head_dim:
        raise ModelImportError("attention with different key and value head sizes is unsupported")
    if rope_dims is not None and rope_dims != head_dim:
        raise ModelImportError(f"partial RoPE ({rope_dims} of {head_dim} dims) is unsupported")
    q_rows = weights["model.layers.0.self_attn.q_proj.weight"].shape[0]
    if q_rows != heads * head_dim:
        raise ModelImportError(f"attn_q has {q_rows} rows, expected {heads} heads x {head_dim}")
    return head_dim


def _vocab_size(meta: Metadata, weights: Weights) -> int:
    rows = int(weights["model.embed_tokens.weight"].shape[0])
    size = get_int(meta, "llama.vocab_size", len(get_strings(meta, "tokenizer.ggml.tokens")))
    if size != rows:
        raise ModelImportError(f"vocabulary has {size} tokens but token_embd has {rows} rows")
    return size


def _rope_scaling(meta: Metadata) -> dict[str, Any] | None:
    kind = meta.get("llama.rope.scaling.type", "none")
    if kind == "none":
        return None
    if kind == "linear":
        return {"type": "linear", "factor": get_float(meta, "llama.rope.scaling.factor")}
    raise ModelImportError(f"unsupported RoPE scaling {kind!r}")


def _quantization_config(bits: dict[str, int]) -> dict[str, Any]:
    common = Counter(bits.values()).most_common(1)[0][0]
    config: dict[str, Any] = {"group_size": GROUP_SIZE, "bits": common}
    # mlx-lm reads per-module entries, so a Q8_0 embedding next to Q4_0 layers loads right.
    for path, b in sorted(bits.items()):
        if b != common:
            config[path] = {"group_size": GROUP_SIZE, "bits": b}
    return config


def _generation_config(meta: Metadata, eos_ids: list[int]) -> dict[str, Any]:
    config: dict[str, Any] = {"eos_token_id": eos_ids}
    if (bos := get_optional_int(meta, "tokenizer.ggml.bos_token_id")) is not None:
        config["bos_token_id"] = bos
    return config


def _eos_token_ids(meta: Metadata) -> list[int]:
    """The end-of-sequence id plus end-of-turn ids, which also end a chat reply."""
    ids: list[int] = []
    for key in ("eos_token_id", "eot_token_id", "eom_token_id"):
        value = get_optional_int(meta, f"tokenizer.ggml.{key}")
        if value is not None and value not in ids:
            ids.append(value)
    if not ids:
        raise ModelImportError("the GGUF names no eos token (tokenizer.ggml.eos_token_id)")
    return ids


def _write_model_dir(
    out_dir: Path,
    weights: Weights,
    tokenizer: Tokenizer,
    files: dict[str, dict[str, Any]],
    overwrite: bool,
) -> None:
    """Write everything into a hidden sibling, then rename it into place in one step."""
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = out_dir.with_name(f".{out_dir.name}.{uuid.uuid4().hex}.partial")
    staging.mkdir()
    try:
        mx.save_safetensors(str(staging / "model.safetensors"), weights, metadata={"format": "mlx"})
        tokenizer.save(str(staging / "tokenizer.json"))
        for name, content in files.items():
            (staging / name).write_text(json.dumps(content, indent=2, ensure_ascii=False) + "\n")
        _move_into_place(staging, out_dir, overwrite)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _move_into_place(staging: Path, out_dir: Path, overwrite: bool) -> None:
    old = None
    if overwrite and out_dir.is_dir() and any(out_dir.iterdir()):
        old = out_dir.with_name(f".{out_dir.name}.{uuid.uuid4().hex}.old")
        out_dir.rename(old)
    try:
        # rename(2) replaces a missing or empty directory atomically and refuses a full one.
        os.rename(staging, out_dir)
    except OSError as exc:
        if old is not None:
            old.rename(out_dir)
        raise ModelImportError(f"{out_dir} appeared while importing; not replacing it") from exc
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
