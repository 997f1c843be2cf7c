"""Wire formats of /v1/models and /health: the models that live workers serve."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel

# What a model serves: chat (and text) completions, or embeddings.
ModelKind = Literal["chat", "embedding"]


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "mlxq"
    # An extension, as llama.cpp's `status`: None until a worker of the model has said.
    kind: ModelKind | None = None


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class Health(BaseModel):
    status: Literal["ok"] = "ok"
    models: list[str]
