"""A machine's catalog: the models its pool may load, and what each costs, known before it loads.

The catalog is every model folder under MLXQ_MODELS_DIR (`catalog_scan`) plus MLXQ_CATALOG's
and MLXQ_POOL_PRELOAD's entries (names under the folder, folders anywhere, or hub ids that the
hub cache holds: worker/engine/hub.py), each maybe with options:
`name:rows=32:kv=65536:keep_alive=10m:pin`. A folder is a chat model when it holds a
config.json and safetensors weights, an embedding model when it holds a sentence-transformers
layout (worker/engine/embedding/download.py). It is read again every few seconds, so a model
dropped into the folder is served on its first request, with no restart.

A model's cost (shared/wire/fleet/pool.py ModelCost) is read from its files only:
- weights: the sizes of its safetensors files;
- KV per token: layers x KV heads x 2 (keys and values) x one head's vector, in its activations'
  dtype or quantized as MLXQ_KV_BITS stores it, from config.json and the safetensors header
  (worker/engine/model_config.py `kv_bytes_per_token`);
  times its KV budget: the positions its sequences share (MLXQ_POOL_KV_TOKENS, else
  `default_kv_tokens`: KV_SHARE of the machine's pool budget, at least MIN_KV_TOKENS or its
  window if shorter, at most a window for each of MLXQ_POOL_ROWS), fixed per entry so that no
  request option forces a reload. The budget is shared, not split: one sequence may use up to
  the model's whole window while it fits;
- its prefix cache (MLXQ_PREFIX_CACHE_MB, raised to hold one conversation of the model's whole
  window; chat models only) and a process's headroom.
"""

from __future__ import annotations

import functools
import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shared.queue.config import Settings
from shared.wire.fleet.catalog import ModelKind
from shared.wire.fleet.keep_alive import keep_alive_seconds
from shared.wire.fleet.pool import MIB, CatalogEntry, ModelCost
from worker.engine.embedding.download import is_embedder_dir
from worker.engine.hub import cached_folder
from worker.engine.model_config import (
    VectorBytes,
    activation_bytes,
    context_window,
    kv_bytes_per_token,
    read_config,
)
from worker.pool.budget import budget_bytes

log = logging.getLogger(__name__)

_OPTION = re.compile(r":(rows|kv|keep_alive)=([^:]+)$|:(pin)$")
# The default KV budget: this share of the machine's pool budget, so that a few models fit beside
# each other on any machine (a fifth: three chat models and an embedder in the default 0.75 of
# 24 GiB here; 3.6 GB, 78,000 positions of the default model's float32 KV), but no less than
# MIN_KV_TOKENS (or the window, if shorter).
KV_SHARE = 0.2
MIN_KV_TOKENS = 4096


@dataclass(frozen=True)
class EntrySpec:
    """One MLXQ_CATALOG entry: what it names and the options after it."""

    model: str
    rows: int | None = None
    kv: int | None = None  # KV positions its sequences share
    keep_alive_s: float | None = None
    pinned: bool = False

    @classmethod
    def parse(cls, text: str) -> EntrySpec:
        options: dict[str, Any] = {}
        rest = text.strip()
        while (found := _OPTION.search(rest)) is not None:
            name, value, pin = found.groups()
            if pin:
                options["pinned"] = True
            elif name == "keep_alive":
                options["keep_alive_s"] = keep_alive_seconds(value)
            else:
                options[name] = int(value)
            rest = rest[: found.start()]
        return cls(model=rest, **options)


@dataclass(frozen=True)
class Found:
    """A catalog entry and the folder its worker loads."""

    entry: CatalogEntry
    folder: Path
    source: str  # what the worker's MLXQ_MODEL is: a name under models_dir, or the folder


def read_catalog(settings: Settings) -> dict[str, Found]:
    """The machine's catalog (module docstring), by served name; unreadable folders are logged
    and left out."""
    specs = [EntrySpec.parse(text) for text in (*settings.pool_preload, *settings.catalog)]
    named = {spec.model: spec for spec in specs}  # a catalog entry's options win
    found: dict[str, Found] = {}
    if settings.catalog_scan and settings.models_dir.is_dir():
        for folder in sorted(settings.models_dir.iterdir()):
            if folder.name.startswith(".") or not folder.is_dir():
                continue
            spec = named.pop(folder.name, EntrySpec(folder.name))
            _add(found, settings, spec, folder, folder.name)
    for spec in named.values():
        given = Path(spec.model).expanduser()
        if given.is_dir():
            _add(found, settings, spec, given, str(given))
        elif (settings.models_dir / spec.model).is_dir():
            _add(found, settings, spec, settings.models_dir / spec.model, spec.model)
        elif (cached := cached_folder(spec.model)) is not None:
            _add(found, settings, spec, cached, spec.model)
        else:
            _warn_once(f"catalog: {spec.model} is neither a model folder nor in the hub cache")
    return found


def _add(
    found: dict[str, Found], settings: Settings, spec: EntrySpec, folder: Path, src: str
) -> None:
    name = folder.resolve().name if src == str(folder) else src
    try:
        entry = catalog_entry(settings, spec, name, folder)
    except (OSError, ValueError, KeyError) as err:
        _warn_once(f"catalog: {folder} left out: {err}")
        return
    if entry is not None:
        found[name] = Found(entry, folder, src)


def catalog_entry(
    settings: Settings, spec: EntrySpec, name: str, folder: Path
) -> CatalogEntry | None:
    """The entry of a model folder; None when it holds no model mlxq serves."""
    kind = model_kind(folder)
    if kind is None:
        return None
    keep_alive = settings.keep_alive if spec.keep_alive_s is None else spec.keep_alive_s
    created = int(folder.stat().st_mtime)
    return CatalogEntry(
        name=name,
        kind=kind,
        created=created,
        cost=model_cost(settings, spec, folder, kind),
        keep_alive_s=keep_alive,
        pinned=spec.pinned,
    )


def model_kind(folder: Path) -> ModelKind | None:
    if is_embedder_dir(folder):
        return "embedding"
    if (folder / "config.json").is_file() and any(folder.glob("*.safetensors")):
        return "chat"
    return None


def model_cost(settings: Settings, spec: EntrySpec, folder: Path, kind: ModelKind) -> ModelCost:
    weights = sum(f.stat().st_size for f in folder.glob("*.safetensors"))
    headroom = settings.pool_headroom_mb * MIB
    if kind == "embedding":
        rows = spec.rows or settings.embed_batch
        return ModelCost(
            weight_bytes=weights,
            kv_bytes_per_token=0,
            rows=rows,
            kv_tokens=0,
            prefix_cache_bytes=0,
            headroom_bytes=headroom,
        )
    config = read_config(folder)
    rows = spec.rows or settings.pool_rows
    window = context_window(config)
    per_token = kv_bytes_per_token(config, activation_bytes(folder), _quantization(settings))
    kv = spec.kv or settings.pool_kv_tokens or default_kv_tokens(settings, per_token, window, rows)
    # The prefix cache holds at least one conversation of the model's whole window, so that a
    # long conversation's next turn is a hit.
    prefix = max(settings.prefix_cache_mb * MIB, per_token * window)
    return ModelCost(
        weight_bytes=weights,
        kv_bytes_per_token=per_token,
        rows=rows,
        kv_tokens=kv,
        prefix_cache_bytes=prefix if settings.prefix_cache_entries else 0,
        headroom_bytes=headroom,
    )


def default_kv_tokens(settings: Settings, per_token: int, window: int, rows: int) -> int:
    """A chat model's KV budget when nothing sets it (KV_SHARE, MIN_KV_TOKENS)."""
    share = int(KV_SHARE * budget_bytes(settings)) // max(per_token, 1)
    return max(min(window, MIN_KV_TOKENS), min(share, rows * window))


def _quantization(settings: Settings) -> VectorBytes | None:
    """How the workers will store KV (MLXQ_KV_BITS); imported only where it is set (MLX)."""
    if not settings.kv_bits:
        return None
    from worker.engine.batch.quantized_kv import kv_quantization

    return kv_quantization(settings.kv_bits, settings.kv_group_size)


@functools.cache
def _warn_once(message: str) -> None:
    """The catalog is read every few seconds: say what is wrong with it once per process."""
    log.warning("%s", message)
