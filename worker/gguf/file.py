"""Read a GGUF file: its header by hand, its tensors and metadata through mlx.

This module owns everything about the file itself: parsing the header (scalar metadata and each
tensor's stored ggml type, which `mx.load` hides), the names of ggml tensor and file types,
which of them can be converted faithfully (llama architecture; F32, F16, Q4_0, Q4_1 and Q8_0
tensors), loading tensors and metadata with mlx, and typed access to that metadata. A file it
cannot read, or one that cannot be converted faithfully, is refused with `ModelImportError`.
"""

from __future__ import annotations

import mmap
import struct
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np

from shared.wire.errors import ModelImportError

Metadata = dict[str, Any]
Weights = dict[str, Any]

_GGML_TYPE_NAMES = {
    0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 6: "Q5_0", 7: "Q5_1", 8: "Q8_0", 9: "Q8_1",
    10: "Q2_K", 11: "Q3_K", 12: "Q4_K", 13: "Q5_K", 14: "Q6_K", 15: "Q8_K", 16: "IQ2_XXS",
    17: "IQ2_XS", 18: "IQ3_XXS", 19: "IQ1_S", 20: "IQ4_NL", 21: "IQ3_S", 22: "IQ2_S",
    23: "IQ4_XS", 24: "I8", 25: "I16", 26: "I32", 27: "I64", 28: "F64", 29: "IQ1_M",
    30: "BF16", 34: "TQ1_0", 35: "TQ2_0",
}  # fmt: skip
_SUPPORTED_TENSOR_TYPES = frozenset({0, 1, 2, 3, 8})

_FILE_TYPE_NAMES = {
    0: "ALL_F32", 1: "MOSTLY_F16", 2: "MOSTLY_Q4_0", 3: "MOSTLY_Q4_1", 7: "MOSTLY_Q8_0",
    8: "MOSTLY_Q5_0", 9: "MOSTLY_Q5_1", 10: "MOSTLY_Q2_K", 11: "MOSTLY_Q3_K_S",
    12: "MOSTLY_Q3_K_M", 13: "MOSTLY_Q3_K_L", 14: "MOSTLY_Q4_K_S", 15: "MOSTLY_Q4_K_M",
    16: "MOSTLY_Q5_K_S", 17: "MOSTLY_Q5_K_M", 18: "MOSTLY_Q6_K", 32: "MOSTLY_BF16",
}  # fmt: skip
_SUPPORTED_FILE_TYPES = frozenset({0, 1, 2, 3, 7})

# GGUF metadata value types of fixed width, as struct formats (8 = string, 9 = array).
_VALUE_FORMATS = {
    0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
    10: "<Q", 11: "<q", 12: "<d",
}  # fmt: skip


def check_header(path: Path) -> None:
    """Refuse a file we cannot convert before mlx reads its tensors.

    The header is read by hand because `mx.load` hides each tensor's stored type: it unpacks
    Q4_K into the same layout as Q4_0 and silently dequantizes other types to float16.
    """
    scalars, tensor_types = read_gguf_header(path)
    arch = scalars.get("general.architecture")
    if arch != "llama":
        raise ModelImportError(f"unsupported architecture {arch!r}: only 'llama' can be imported")
    file_type = scalars.get("general.file_type")
    if file_type is not None and file_type not in _SUPPORTED_FILE_TYPES:
        name = _FILE_TYPE_NAMES.get(file_type, f"file_type {file_type}")
        raise ModelImportError(
            f"unsupported GGUF file type {name}: only F32, F16, Q4_0, Q4_1, Q8_0"
        )
    for tensor, ggml_type in tensor_types.items():
        if ggml_type not in _SUPPORTED_TENSOR_TYPES:
            name = _GGML_TYPE_NAMES.get(ggml_type, f"ggml type {ggml_type}")
            raise ModelImportError(f"tensor {tensor!r} has unsupported type {name}")


def read_gguf_header(path: Path) -> tuple[dict[str, Any], dict[str, int]]:
    """Return (the scalar and string metadata, {tensor name: ggml type}) of a GGUF file.

    Array metadata (the vocabulary, merges) is skipped, not decoded.
    """
    if not path.is_file():
        raise ModelImportError(f"GGUF file not found: {path}")
    try:
        with path.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as blob:
            return _parse_header(_Cursor(blob))
    except (ValueError, struct.error, UnicodeDecodeError) as exc:
        raise ModelImportError(f"{path} is not a readable GGUF file: {exc}") from exc


class _Cursor:
    """A read position in a memory-mapped GGUF file."""

    def __init__(self, blob: mmap.mmap) -> None:
        self.blob = blob
        self.pos = 0

    def unpack(self, fmt: str) -> Any:
        (value,) = struct.unpack_from(fmt, self.blob, self.pos)
        self.pos += struct.calcsize(fmt)
        return value

    def string(self) -> str:
        length = self.unpack("<Q")
        self.pos += length
        return bytes(self.blob[self.pos - length : self.pos]).decode("utf-8")


def _parse_header(cur: _Cursor) -> tuple[dict[str, Any], dict[str, int]]:
    if bytes(cur.blob[:4]) != b"GGUF":
        raise ValueError("missing GGUF magic bytes")
    cur.pos = 4
    version = cur.unpack("<I")
    if version not in (2, 3):
        raise ValueError(f"GGUF version {version} is not supported (2 and 3 are)")
    n_tensors, n_values = cur.unpack("<Q"), cur.unpack("<Q")
    scalars: dict[str, Any] = {}
    for _ in range(n_values):
        key, value_type = cur.string(), cur.unpack("<I")
        if value_type == 9:
            _skip_array(cur)
        else:
            scalars[key] = (
                cur.string() if value_type == 8 else cur.unpack(_value_format(value_type))
            )
    tensor_types: dict[str, int] = {}
    for _ in range(n_tensors):
        name, n_dims = cur.string(), cur.unpack("<I")
        cur.pos += 8 * n_dims  # the dimensions: mlx gives us the shapes
        tensor_types[name] = cur.unpack("<I")
        cur.pos += 8  # the data offset
    return scalars, tensor_types


def _value_format(value_type: int) -> str:
    if value_type not in _VALUE_FORMATS:
        raise ValueError(f"unknown metadata value type {value_type}")
    return _VALUE_FORMATS[value_type]


def _skip_array(cur: _Cursor) -> None:
    item_type, count = cur.unpack("<I"), cur.unpack("<Q")
    if item_type == 8:
        for _ in range(count):
            length = cur.unpack("<Q")
            cur.pos += length
    elif item_type == 9:
        for _ in range(count):
            _skip_array(cur)
    else:
        cur.pos += struct.calcsize(_value_format(item_type)) * count


def load(path: Path) -> tuple[Weights, Metadata]:
    try:
        loaded: Any = mx.load(str(path), return_metadata=True)
    except (RuntimeError, ValueError) as exc:
        raise ModelImportError(f"mlx cannot read {path}: {exc}") from exc
    weights, meta = loaded
    return weights, meta


def get_optional_int(meta: Metadata, key: str) -> int | None:
    value = meta.get(key)
    return None if value is None else int(value.item())


def get_int(meta: Metadata, key: str, default: int | None = None) -> int:
    value = get_optional_int(meta, key)
    if value is not None:
        return value
    if default is None:
        raise ModelImportError(f"GGUF metadata lacks {key}")
    return default


def get_float(meta: Metadata, key: str, default: float | None = None) -> float:
    value = meta.get(key)
    if value is None:
        if default is None:
            raise ModelImportError(f"GGUF metadata lacks {key}")
        return default
    # GGUF stores float32: print its shortest float32 form so 1e-5 does not become 9.99e-06.
    return float(str(np.float32(value.item())))


def get_bool(meta: Metadata, key: str, default: bool) -> bool:
    value = meta.get(key)
    return default if value is None else bool(value.item())


def get_strings(meta: Metadata, key: str) -> list[str]:
    value = meta.get(key)
    if not isinstance(value, list):
        raise ModelImportError(f"GGUF metadata lacks the string list {key}")
    return [str(item) for item in value]


def get_ints(meta: Metadata, key: str) -> list[int] | None:
    value = meta.get(key)
    return None if value is None else [int(v) for v in value.tolist()]
