"""Read a GGUF file with `gguf`, llama.cpp's own reader, and give typed access to what it holds.

This module owns the file itself: opening it (a missing or unreadable file is refused with
`ModelImportError`), its metadata as plain Python values, and its tensors with their stored
ggml type, dequantized by `gguf.quants` on request (every block type llama.cpp writes: F32,
F16, BF16, Q4_0 to Q8_0, the K-quants, the IQ types). What to do with a tensor belongs to
`worker.gguf.weights`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader
from gguf.quants import dequantize

from shared.wire.errors import ModelImportError

Metadata = dict[str, Any]

FLOAT_TYPES = frozenset(
    {GGMLQuantizationType.F32, GGMLQuantizationType.F16, GGMLQuantizationType.BF16}
)


@dataclass(frozen=True)
class Tensor:
    """One tensor as stored: its ggml type and raw data (memory-mapped), numpy-ordered shape."""

    name: str
    ggml_type: GGMLQuantizationType
    shape: tuple[int, ...]
    raw: np.ndarray[Any, Any]

    @property
    def type_name(self) -> str:
        return self.ggml_type.name

    def dequantized(self) -> np.ndarray[Any, np.dtype[np.float32]]:
        """The values as float32, in `shape` (gguf decodes every block type in NumPy)."""
        if self.ggml_type not in FLOAT_TYPES and not _is_block_type(self.ggml_type):
            raise ModelImportError(f"tensor {self.name!r} has non-float type {self.type_name}")
        try:
            values = dequantize(self.raw, self.ggml_type)
        except NotImplementedError as exc:
            raise ModelImportError(f"tensor {self.name!r}: {exc}") from exc
        return np.asarray(values, dtype=np.float32).reshape(self.shape)


def _is_block_type(ggml_type: GGMLQuantizationType) -> bool:
    integer = {"I8", "I16", "I32", "I64", "F64"}
    return ggml_type.name not in integer


@dataclass(frozen=True)
class GGUFFile:
    """A GGUF file's metadata and tensors."""

    path: Path
    metadata: Metadata
    tensors: list[Tensor]

    @property
    def architecture(self) -> str:
        return str(self.metadata.get("general.architecture"))


def open_gguf(path: Path) -> GGUFFile:
    """Read `path`'s header and map its tensors (their data is read when used)."""
    if not path.is_file():
        raise ModelImportError(f"GGUF file not found: {path}")
    with path.open("rb") as f:
        if f.read(4) != b"GGUF":
            raise ModelImportError(f"{path} is not a GGUF file (it does not start with 'GGUF')")
    try:
        reader = GGUFReader(path)
        metadata = {key: field.contents() for key, field in reader.fields.items()}
        tensors = [_tensor(t.name, t.tensor_type, t.shape, t.data) for t in reader.tensors]
    except Exception as exc:  # gguf raises bare ValueError, IndexError, numpy errors on bad bytes
        raise ModelImportError(f"{path} is not a readable GGUF file: {exc}") from exc
    return GGUFFile(path=path, metadata=metadata, tensors=tensors)


def _tensor(name: str, ggml_type: Any, ggml_shape: Any, raw: Any) -> Tensor:
    # ggml lists the fastest-moving dimension first; numpy lists it last.
    shape = tuple(int(d) for d in reversed(ggml_shape.tolist()))
    return Tensor(name=name, ggml_type=GGMLQuantizationType(ggml_type), shape=shape, raw=raw)


def get_optional_int(meta: Metadata, key: str) -> int | None:
    value = meta.get(key)
    return None if value is None else int(value)


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
    return float(str(np.float32(value)))


def get_bool(meta: Metadata, key: str, default: bool) -> bool:
    value = meta.get(key)
    return default if value is None else bool(value)


def get_strings(meta: Metadata, key: str) -> list[str]:
    value = meta.get(key)
    if not isinstance(value, list):
        raise ModelImportError(f"GGUF metadata lacks the string list {key}")
    return [str(item) for item in value]


def get_numbers(meta: Metadata, key: str) -> list[float] | None:
    value = meta.get(key)
    return None if not isinstance(value, list) else [float(v) for v in value]


def get_ints(meta: Metadata, key: str) -> list[int] | None:
    value = meta.get(key)
    return None if not isinstance(value, list) else [int(v) for v in value]
