"""GET /v1/models and /v1/models/{id}: the models at least one live worker serves."""

from __future__ import annotations

from typing import cast, get_args

from flask import Blueprint, Response

from api.queue.broker import broker
from shared.wire.catalog import ModelCard, ModelKind, ModelList
from shared.wire.errors import ModelNotFoundError

bp = Blueprint("models", __name__)


def _cards() -> list[ModelCard]:
    """The live models, each with the kind its workers announced (chat or embedding)."""
    served = broker()
    live = served.live_models()
    if not live:
        return []
    kinds = served.redis.hmget(served.keys.model_kinds(), [name for name, _ in live])
    return [
        ModelCard(id=name, created=int(seen), kind=_kind(kind))
        for (name, seen), kind in zip(live, kinds, strict=True)
    ]


def _kind(raw: bytes | str | None) -> ModelKind | None:
    text = raw.decode() if isinstance(raw, bytes) else raw
    for kind in get_args(ModelKind):
        if text == kind:
            return cast(ModelKind, kind)
    return None


@bp.get("/v1/models")
def list_models() -> Response:
    return Response(ModelList(data=_cards()).model_dump_json(), mimetype="application/json")


@bp.get("/v1/models/<path:model_id>")
def get_model(model_id: str) -> Response:
    card = next((c for c in _cards() if c.id == model_id), None)
    if card is None:
        raise ModelNotFoundError(f"The model '{model_id}' does not exist.", param="model")
    return Response(card.model_dump_json(), mimetype="application/json")
