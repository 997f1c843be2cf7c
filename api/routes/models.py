"""GET /v1/models and /v1/models/{id}: the models at least one live worker serves."""

from __future__ import annotations

from flask import Blueprint, Response

from api.queue.broker import broker
from shared.wire.catalog import ModelCard, ModelList
from shared.wire.errors import ModelNotFoundError

bp = Blueprint("models", __name__)


def _cards() -> list[ModelCard]:
    """The live models, each with the kind its workers announced (chat or embedding)."""
    served = broker()
    live = served.live_models()
    if not live:
        return []
    kinds = served.kinds([name for name, _ in live])
    return [ModelCard(id=name, created=int(seen), kind=kinds[name]) for name, seen in live]


@bp.get("/v1/models")
def list_models() -> Response:
    return Response(ModelList(data=_cards()).model_dump_json(), mimetype="application/json")


@bp.get("/v1/models/<path:model_id>")
def get_model(model_id: str) -> Response:
    card = next((c for c in _cards() if c.id == model_id), None)
    if card is None:
        raise ModelNotFoundError(f"The model '{model_id}' does not exist.", param="model")
    return Response(card.model_dump_json(), mimetype="application/json")
