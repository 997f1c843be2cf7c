"""What names a model's prefix caches: the weights they were computed with and their KV layout.

A cache file (worker/engine/prefix_disk.py) is only ever read by a worker whose identity is the
file's: same config, same weights, same KV form. The identity must mean the same on every
machine, since a worker may fetch a cache another machine's worker wrote
(worker/runtime/prefix/prefix_fetch.py). So the weights are named by their whole content, never by
where or when they were written: a file of the hub's cache is a link to a blob named by its
content hash, used as it is; any other weight file is hashed whole, once: its hash is kept in
`{root}/weights.json` under its path, inode, size and modification time, so a worker's start
hashes only files it has not seen (about 1.4 GB/s here: 0.4 s for the default model's 540 MB).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import mlx.core as mx
from mlx.utils import tree_flatten
from mlx_lm.models.cache import make_prompt_cache
from mlx_lm.utils import hf_repo_to_path

WEIGHT_SUFFIXES = (".safetensors", ".npz", ".gguf")
CHUNK_BYTES = 8 << 20


def model_identity(model_dir: Path, layout: str, marks: Path | None = None) -> str:
    """A folder name for the model in `model_dir` and its KV layout: another config, other
    weights or another layout gives another name; the same ones on another machine, the same.
    `marks`: the file remembering weight files' hashes (None: hash them every time)."""
    known = _read_marks(marks)
    digest = hashlib.blake2b(layout.encode(), digest_size=12)
    for path in sorted(model_dir.iterdir()):
        if path.name == "config.json":
            digest.update(path.read_bytes())
        elif path.suffix in WEIGHT_SUFFIXES:
            digest.update(f"{path.name}:{weights_mark(path, known)}".encode())
    if marks is not None:
        _write_marks(marks, known)
    return f"{model_dir.name}-{digest.hexdigest()}"


def weights_mark(path: Path, known: dict[str, str]) -> str:
    """What names a weight file's content: the hub blob it links to, or its hash (`known`
    holds the hashes of files seen before, and gets this one's)."""
    target = path.resolve()
    if path.is_symlink() and target.parent.name == "blobs":  # the hub names blobs by content
        return target.name
    st = target.stat()
    seen = f"{target}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}"
    if seen not in known:
        digest = hashlib.sha256()  # the fastest here (OpenSSL's, 1.7 GB/s; blake2b 0.9)
        with target.open("rb") as file:
            while chunk := file.read(CHUNK_BYTES):
                digest.update(chunk)
        known[seen] = digest.hexdigest()
    return known[seen]


def _read_marks(marks: Path | None) -> dict[str, str]:
    try:
        found = json.loads(marks.read_text()) if marks is not None else {}
    except (OSError, ValueError):
        return {}
    return {str(k): str(v) for k, v in found.items()} if isinstance(found, dict) else {}


def _write_marks(marks: Path, known: dict[str, str]) -> None:
    """Keep `known` (written aside and renamed: workers starting together may both write)."""
    temporary = marks.with_name(f".{marks.name}.{os.getpid()}")
    try:
        marks.parent.mkdir(parents=True, exist_ok=True)
        temporary.write_text(json.dumps(known))
        os.replace(temporary, marks)
    except OSError:  # only a start's time is lost: the next one hashes again
        temporary.unlink(missing_ok=True)


def kv_layout(cache: list[Any]) -> str:
    """Each layer's cache class and its arrays' dtypes and shapes, the token axis (-2) left out:
    what a cache of any length of one model in one KV form shares."""

    def array(x: mx.array) -> str:
        shape = [*x.shape[:-2], x.shape[-1]]
        return f"{x.dtype}{shape}"

    layers = []
    for layer in cache:
        arrays = [x for _, x in tree_flatten(layer.state) if isinstance(x, mx.array)]
        layers.append(f"{type(layer).__name__}({','.join(array(x) for x in arrays)})")
    return ";".join(layers)


def token_bytes(cache: list[Any]) -> int:
    """The bytes one token takes in `cache` (one token long): what a cache file grows by."""
    arrays = [x for layer in cache for _, x in tree_flatten(layer.state) if isinstance(x, mx.array)]
    return sum(x.nbytes // max(x.shape[-2], 1) for x in arrays if x.ndim >= 2)


def probe(model: Any, fresh: list[Any] | None = None) -> list[Any]:
    """The cache a one-token forward of `model` fills in `fresh`: an empty cache of the form
    the engine stores (None: mlx-lm's own, `make_prompt_cache`)."""
    cache = fresh if fresh is not None else make_prompt_cache(model)
    model(mx.array([[0]]), cache=cache)
    mx.eval([c.state for c in cache])
    return cache


def probe_layout(model: Any, fresh: list[Any] | None = None) -> str:
    """The KV layout of the caches `model` fills (`probe`)."""
    return kv_layout(probe(model, fresh))


def model_folder(source: str) -> Path:
    """The folder of the weights `mlx_lm.load(source)` read: `source` itself, or the hub
    cache's copy of a hub id."""
    given = Path(source)
    return given if given.is_dir() else Path(hf_repo_to_path(source))
