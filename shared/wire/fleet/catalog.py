"""Wire formats of /v1/models and /health: the fleet's catalog (the models live workers serve
and those the pools may load, shared/wire/fleet/pool.py), each with its state across the fleet."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel

# What a model serves: chat (and text) completions, or embeddings.
ModelKind = Literal["chat", "embedding"]
# Where a model stands in the fleet: a live worker serves it, a pool is loading it, or neither.
ModelState = Literal["loaded", "loading", "not_loaded"]


class ModelStatus(BaseModel):
    """An extension in the spirit of llama.cpp's router `status`: the model's state across the
    fleet, the live workers serving it and the machines whose pool may load it."""

    value: ModelState
    workers: list[str] = []
    machines: list[str] = []


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "mlxq"
    # An extension, as llama.cpp's `status`: None until a worker of the model has said.
    kind: ModelKind | None = None
    status: ModelStatus | None = None


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class Health(BaseModel):
    status: Literal["ok"] = "ok"
    models: list[str]
