"""Models named by a Hugging Face hub id (`org/name`), as MLXQ_MODELS, MLXQ_MODEL and
MLXQ_CATALOG may name them: where this machine's hub cache holds one (`cached_folder`, what the
pool's catalog reads its cost from and what its worker loads, with no network), and getting
one into that cache (`download`, what `mlxq run` does for the hub ids of MLXQ_MODELS before it
starts, as a worker once did as it started).
"""

from __future__ import annotations

import re
from pathlib import Path

# What a model needs: its config, weights, tokenizer and chat template (as mlx-lm fetches).
FILES = ["*.json", "*.safetensors", "*.py", "tokenizer.model", "*.tiktoken", "*.txt", "*.jinja"]
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def is_hub_id(model: str) -> bool:
    """`org/name`, and no folder by that name here."""
    return bool(_HUB_ID.match(model)) and not Path(model).expanduser().exists()


def cached_folder(model: str) -> Path | None:
    """The folder of the hub cache's snapshot of `model`; None if it holds none."""
    if not is_hub_id(model):
        return None
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        return Path(snapshot_download(model, local_files_only=True, allow_patterns=FILES))
    except (LocalEntryNotFoundError, OSError, ValueError):
        return None


def download(model: str) -> Path:
    """The folder of `model` in the hub cache, downloaded first if it is not there."""
    from huggingface_hub import snapshot_download

    return cached_folder(model) or Path(snapshot_download(model, allow_patterns=FILES))
