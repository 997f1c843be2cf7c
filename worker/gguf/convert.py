"""Import a GGUF file into a model directory that `mlx_lm.load` accepts.

This module owns the import as a whole, from llama.cpp's single-file format to mlx-lm's layout:
each tensor renamed and converted (the family's facts in `worker.gguf.architectures`, the
numerics in `worker.gguf.weights`), `config.json` and `generation_config.json` written from the
metadata, the tokenizer rebuilt (`worker.gguf.tokenizer`), the result loaded once by mlx-lm as a
check, and the directory written atomically. Anything it cannot convert faithfully is refused
with `ModelImportError` rather than approximated.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import mlx.core as mx
from tokenizers import Tokenizer

from shared.wire.errors import ModelImportError
from worker.engine.sequence.stop import FAMILY_STOP_TOKENS
from worker.gguf import DTYPES
from worker.gguf.architectures import ROPE_FREQS, Architecture, architecture, head_dim
from worker.gguf.file import GGUFFile, Metadata, get_float, get_int, get_optional_int, open_gguf
from worker.gguf.tokenizer import build_tokenizer, special_tokens_map
from worker.gguf.weights import GROUP_SIZE, Weights, convert_tensor


def import_gguf(
    gguf_path: Path, out_dir: Path, *, dtype: str | None = None, overwrite: bool = False
) -> Path:
    """Convert `gguf_path` into an mlx-lm model directory at `out_dir` and return `out_dir`.

    `dtype` None or "keep" keeps the file's precision (float stays float, quantized tensors
    become MLX 4- or 8-bit); "float32", "float16" or "bfloat16" dequantizes everything to it;
    "q4" or "q8" quantizes every linear and embedding weight to MLX's 4 or 8 bits. The
    directory appears whole or not at all. Raises `ModelImportError` for anything that cannot
    be converted faithfully.
    """
    gguf_path, out_dir, dtype = Path(gguf_path), Path(out_dir), dtype or "keep"
    if dtype not in DTYPES:
        raise ModelImportError(f"dtype must be one of {', '.join(DTYPES)}, not {dtype!r}")
    _check_target(out_dir, overwrite)
    gguf = open_gguf(gguf_path)
    arch_name, arch = architecture(gguf.metadata)
    meta = gguf.metadata
    weights = _weights(gguf, arch, dtype)
    context = get_int(meta, f"{arch_name}.context_length", 2048)
    tokenizer, tokenizer_config = build_tokenizer(meta, context, arch.chat_template)
    eos_ids = _eos_token_ids(meta, tokenizer)
    config = _model_config(gguf, arch_name, arch, weights, eos_ids)
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


def _weights(gguf: GGUFFile, arch: Architecture, dtype: str) -> Weights:
    weights: Weights = {}
    for tensor in gguf.tensors:
        if tensor.name == ROPE_FREQS and arch.rope_factors is not None:
            continue  # not a weight: config.json's rope_scaling (_model_config)
        name = arch.mlx_name(tensor.name)
        weights.update(convert_tensor(tensor, name, dtype, arch.fix(name)))
    if "model.embed_tokens.weight" not in weights:
        raise ModelImportError("the GGUF has no token_embd tensor")
    return weights


def _quantized_bits(weights: Weights) -> dict[str, int]:
    """{module path: bits} for every module stored as MLX weight/scales/biases."""
    bits: dict[str, int] = {}
    for name, scales in weights.items():
        if name.endswith(".scales"):
            prefix = name.removesuffix(".scales")
            # A uint32 packs 32 // bits codes and each scale covers GROUP_SIZE of them.
            packed = weights[f"{prefix}.weight"].shape[-1] * 32
            bits[prefix] = packed // (scales.shape[-1] * GROUP_SIZE)
    return bits


def _model_config(
    gguf: GGUFFile, arch_name: str, arch: Architecture, weights: Weights, eos_ids: list[int]
) -> dict[str, Any]:
    meta = gguf.metadata

    def key(name: str) -> str:
        return f"{arch_name}.{name}"

    heads = get_int(meta, key("attention.head_count"))
    size = head_dim(meta, arch_name)
    config: dict[str, Any] = {
        "model_type": arch.model_type,
        "architectures": [arch.hf_class],
        "hidden_size": get_int(meta, key("embedding_length")),
        "num_hidden_layers": get_int(meta, key("block_count")),
        "intermediate_size": get_int(meta, key("feed_forward_length")),
        "num_attention_heads": heads,
        "num_key_value_heads": get_int(meta, key("attention.head_count_kv"), heads),
        "head_dim": size,
        "rms_norm_eps": get_float(meta, key("attention.layer_norm_rms_epsilon"), 1e-5),
        "rope_theta": get_float(meta, key("rope.freq_base"), 10000.0),
        "max_position_embeddings": get_int(meta, key("context_length"), 2048),
        "vocab_size": _vocab_size(meta, weights),
        "tie_word_embeddings": "lm_head.weight" not in weights,
        # A llama GGUF with attention biases (mlx-lm's llama reads the flag).
        "attention_bias": "model.layers.0.self_attn.q_proj.bias" in weights,
        "eos_token_id": eos_ids,
        **arch.extras(meta, arch_name, size),
    }
    rope_freqs = next((t for t in gguf.tensors if t.name == ROPE_FREQS), None)
    if rope_freqs is not None and arch.rope_factors is not None:
        config.update(arch.rope_factors(meta, arch_name, size, rope_freqs.dequantized()))
    if (bos := get_optional_int(meta, "tokenizer.ggml.bos_token_id")) is not None:
        config["bos_token_id"] = bos
    if bits := _quantized_bits(weights):
        config["quantization"] = _quantization_config(bits)
    return config


def _vocab_size(meta: Metadata, weights: Weights) -> int:
    embedding = weights["model.embed_tokens.weight"]
    rows = int(embedding.shape[0])
    tokens = meta.get("tokenizer.ggml.tokens")
    if not isinstance(tokens, list) or len(tokens) != rows:
        count = len(tokens) if isinstance(tokens, list) else 0
        raise ModelImportError(f"vocabulary has {count} tokens but token_embd has {rows} rows")
    return rows


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


def _eos_token_ids(meta: Metadata, tokenizer: Tokenizer) -> list[int]:
    """The end-of-sequence id, then end-of-turn ids, which also end a chat reply: the file's
    own (eot, eom) and, as llama.cpp finds them by their text, the families' end-of-turn tokens
    (Gemma's `<end_of_turn>`, which its GGUF names nowhere)."""
    ids: list[int] = []
    for key in ("eos_token_id", "eot_token_id", "eom_token_id"):
        value = get_optional_int(meta, f"tokenizer.ggml.{key}")
        if value is not None and value not in ids:
            ids.append(value)
    if not ids:
        raise ModelImportError("the GGUF names no eos token (tokenizer.ggml.eos_token_id)")
    # Only control tokens: Gemma's vocabulary also spells "</s>" as plain text.
    control = {t.content: i for i, t in tokenizer.get_added_tokens_decoder().items() if t.special}
    for token in FAMILY_STOP_TOKENS:
        token_id = control.get(token)
        if token_id is not None and token_id not in ids:
            ids.append(token_id)
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
        _check_loads(staging)
        _move_into_place(staging, out_dir, overwrite)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _check_loads(model_dir: Path) -> None:
    """Load the directory as the worker will (lazily: no weight is read): every tensor must
    have its place and shape in mlx-lm's model, and every parameter a tensor."""
    from mlx_lm.utils import load_model

    try:
        load_model(model_dir, lazy=True, strict=True)
    except (ValueError, KeyError, TypeError) as exc:
        raise ModelImportError(f"mlx-lm does not accept the converted model: {exc}") from exc


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
