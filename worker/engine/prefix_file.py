"""A disk-tier file's format (worker/engine/prefix_disk.py): mlx-lm's prompt-cache safetensors
(`save_prompt_cache`, no pickle), its arrays cut to the tokens they hold, with mlxq's metadata:
the format, the model's identity, the cache scope (shared/queue/prefix/cache_scope.py) and the
tokens. Written readable by its owner only (0600): it holds a prompt. A file is named by a hash of
its scope and tokens (`file_name`), and the tier knows each as a `Stored`."""

from __future__ import annotations

import contextlib
import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np
from mlx.utils import tree_map
from mlx_lm.models.cache import save_prompt_cache

from shared.queue.prefix.prefix_blocks import HeldPrompt

# A history shorter than this is cheaper to prefill with the rest than on its own; a longer one
# than this is left to the batch's chunked prefill, which lets the other sequences go on.
MIN_SHARED_TOKENS = 16
MAX_SHARED_TOKENS = 512
FORMAT = "mlxq-prefix-cache-2"  # 2: with its scope
SUFFIX = ".safetensors"


def save(path: Path, identity: str, held: HeldPrompt, cache: list[Any]) -> None:
    """Write `held`'s cache to `path`, each layer cut to its tokens (`compact`)."""
    tokens = ",".join(map(str, held.tokens))
    meta = {"format": FORMAT, "identity": identity, "scope": held.scope, "tokens": tokens}
    # Created private: MLX writes the file with the process's umask.
    path.touch(mode=0o600)
    os.chmod(path, 0o600)
    save_prompt_cache(str(path), [compact(c) for c in cache], meta)


def is_ours(meta: dict[str, str], identity: str) -> bool:
    """Whether a file's metadata says it is `identity`'s cache, in this format."""
    return meta.get("format") == FORMAT and meta.get("identity") == identity


def tokens_of(meta: dict[str, str]) -> list[int]:
    return [int(t) for t in meta["tokens"].split(",")]


def held_of(meta: dict[str, str]) -> HeldPrompt:
    """The scope and tokens a file's metadata names."""
    return HeldPrompt(meta["scope"], tokens_of(meta))


def header(path: Path) -> dict[str, str]:
    """The metadata `save` wrote, the file's arrays left unread (mx.load is lazy)."""
    _, flat = mx.load(str(path), return_metadata=True)
    if not isinstance(flat, dict):
        raise ValueError("no metadata")
    # save_prompt_cache's own metadata, flattened with mlx's tree keys: ours is under '0.'.
    return {str(k)[2:]: str(v) for k, v in flat.items() if str(k).startswith("0.")}


def compact(layer: Any) -> Any:
    """A layer's cache with its arrays cut to the tokens it holds: mlx-lm's caches grow by
    steps of 256 positions, and a trimmed one keeps what it trimmed."""
    offset = getattr(layer, "offset", None)
    if not isinstance(offset, int) or not layer.is_trimmable():
        return layer

    def cut(x: Any) -> Any:
        return x[..., :offset, :] if isinstance(x, mx.array) and x.ndim == 4 else x

    return type(layer).from_state(tree_map(cut, layer.state))


def held_lengths(root: Path) -> dict[Path, int]:
    """How many tokens each finished file under a disk tier's root (one folder per model)
    holds: for tests and benchmarks that wait for a write."""
    lengths = {}
    for path in root.glob("*/[!.]*.safetensors"):
        with contextlib.suppress(OSError, RuntimeError, ValueError):  # replaced as it was read
            lengths[path] = len(tokens_of(header(path)))
    return lengths


def file_name(held: HeldPrompt) -> str:
    digest = hashlib.blake2b(held.scope.encode() + b"\0", digest_size=16)
    digest.update(_packed(held.tokens))
    return digest.hexdigest() + SUFFIX


def _packed(tokens: list[int]) -> bytes:
    return np.asarray(tokens, dtype=np.uint32).tobytes()


@dataclass(frozen=True)
class Stored:
    """A file of this tier: the tokens its cache holds, for `scope`."""

    path: Path
    scope: str
    tokens: np.ndarray[Any, np.dtype[np.uint32]]

    @classmethod
    def of(cls, path: Path, held: HeldPrompt) -> Stored:
        return cls(path, held.scope, np.asarray(held.tokens, dtype=np.uint32))

    def held(self) -> HeldPrompt:
        return HeldPrompt(self.scope, self.tokens.tolist())

    def common(self, prompt: np.ndarray[Any, np.dtype[np.uint32]]) -> int:
        """How many first tokens of `prompt` this file holds."""
        return common_start(self.tokens, prompt)


def common_start(a: np.ndarray[Any, Any], b: np.ndarray[Any, Any]) -> int:
    """How many first tokens two token arrays share."""
    n = min(len(a), len(b))
    same = a[:n] == b[:n]
    return n if bool(same.all()) else int(np.argmin(same))


def extends(longer: Stored, shorter: Stored) -> bool:
    """Whether `longer` holds more tokens than `shorter`, its first ones `shorter`'s, for the
    same scope."""
    n = len(shorter.tokens)
    if longer.scope != shorter.scope or len(longer.tokens) <= n:
        return False
    return common_start(longer.tokens[:n], shorter.tokens) == n
