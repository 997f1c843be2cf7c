"""The default model quantized as Macs serve it: `mlx_lm.convert` at 4 and 8 bits (affine, groups
of 64), made once and kept under the models dir's `.quantized` folder (tests/support.py
`derived_model`), where no pool's catalog scan finds them (a folder whose name starts with a dot
is skipped: worker/pool/catalog.py).

A folder is named by its source's name and its bits, then a digest of what it is made from: the
source's config, tokenizer files and safetensors headers and sizes, the group size, and mlx-lm's
version. A rerun finds it and quantizes nothing; a new source or mlx-lm quantizes again,
replacing the folder the last one made.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import struct
from pathlib import Path

import mlx_lm

from shared.queue.config import Settings
from tests.support import derived_model
from worker.gguf.default_model import ensure_default_model

GROUP_SIZE = 64
FOLDER = ".quantized"


def _source_digest(source: Path) -> str:
    """A digest of the source folder: its small files whole, each safetensors file's header (its
    tensors' names, dtypes, shapes, offsets) and size, not its gigabytes."""
    digest = hashlib.sha256(f"mlx-lm={importlib.metadata.version('mlx-lm')}\0".encode())
    digest.update(f"group_size={GROUP_SIZE}\0".encode())
    for file in sorted(source.iterdir()):
        if not file.is_file():
            continue
        digest.update(file.name.encode() + b"\0")
        if file.suffix == ".safetensors":
            with file.open("rb") as f:
                head = f.read(8)
                (size,) = struct.unpack("<Q", head)
                digest.update(head + f.read(size) + str(file.stat().st_size).encode())
        else:
            digest.update(file.read_bytes())
    return digest.hexdigest()[:12]


def quantized_model(bits: int, source: Path | None = None) -> Path:
    """The folder of `source` (the default model) quantized to `bits`, made if it is not there."""
    source = source or ensure_default_model(Settings().models_dir)

    def make(folder: Path) -> None:
        mlx_lm.convert(
            str(source), str(folder), quantize=True, q_bits=bits, q_group_size=GROUP_SIZE
        )

    parent = Settings().models_dir / FOLDER
    return derived_model(parent, f"{source.name}-{bits}bit-", _source_digest(source), make)
