"""What a model folder says of itself before it is loaded: its context window and what one
token of its KV cache takes, from config.json and its safetensors header. The loader
(worker/engine/model.py) and the pool's catalog (worker/pool/catalog.py) both read them here.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any, Protocol

# Bytes per element of a safetensors dtype (the floating ones a model's activations run in).
_DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2}
_HEADER_MAX = 100 << 20
DEFAULT_WINDOW = 4096


def context_window(config: dict[str, Any]) -> int:
    """The positions the model was trained for (its config's name for them varies)."""
    # A multimodal model may say it in its language half only.
    for part in (config, config.get("text_config") or {}):
        for key in ("max_position_embeddings", "max_seq_len", "n_positions", "context_length"):
            if isinstance(part.get(key), int):
                return int(part[key])
    return DEFAULT_WINDOW


class VectorBytes(Protocol):
    """How one head's values are stored (worker/engine/batch/quantized_kv.py KVQuantization)."""

    def vector_bytes(self, dim: int, dtype_bytes: int) -> int: ...


def kv_bytes_per_token(
    config: dict[str, Any], dtype_bytes: int, quantization: VectorBytes | None = None
) -> int:
    """What one position of one sequence takes in every layer's keys and values: layers x KV
    heads x 2 x one head's vector, `head_dim` values of `dtype_bytes` each, or as `quantization`
    stores them (MLXQ_KV_BITS). Plain attention: a sliding window or a state-space layer takes
    less, so this is an upper bound."""
    text = config.get("text_config", config)
    layers = int(_first(text, "num_hidden_layers", "n_layer", "num_layers"))
    heads = int(_first(text, "num_attention_heads", "n_head"))
    kv_heads = int(text.get("num_key_value_heads") or heads)
    head_dim = int(text.get("head_dim") or _first(text, "hidden_size", "n_embd") // heads)
    if quantization is None:
        vector = head_dim * dtype_bytes
    else:
        vector = quantization.vector_bytes(head_dim, dtype_bytes)
    return layers * kv_heads * 2 * vector


def activation_bytes(folder: Path) -> int:
    """The bytes of one element of the model's activations, and so of its KV cache: the dtype of
    its norm weights, which quantization leaves as they are; 2 (float16) if none is found."""
    for file in sorted(folder.glob("*.safetensors")):
        for tensor, about in safetensors_header(file).items():
            if tensor.endswith("norm.weight") and about.get("dtype") in _DTYPE_BYTES:
                return _DTYPE_BYTES[about["dtype"]]
    return 2


def safetensors_header(file: Path) -> dict[str, Any]:
    """A safetensors file's tensors (name -> dtype, shape, offsets), read from its header only."""
    with file.open("rb") as f:
        (size,) = struct.unpack("<Q", f.read(8))
        if size > _HEADER_MAX:
            raise ValueError(f"{file.name}: a safetensors header of {size} bytes")
        header: dict[str, Any] = json.loads(f.read(size))
    header.pop("__metadata__", None)
    return header


def read_config(folder: Path) -> dict[str, Any]:
    config: dict[str, Any] = json.loads((folder / "config.json").read_text())
    return config


def _first(config: dict[str, Any], *names: str) -> Any:
    for name in names:
        if config.get(name) is not None:
            return config[name]
    raise KeyError(f"config.json has none of {', '.join(names)}")
