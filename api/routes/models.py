"""GET /v1/models and /v1/models/{id}: the fleet's catalog, each model with its state.

A model is listed while a live worker serves it or a live pool may load it
(shared/queue/pool.py), the rule admission follows. Its `status` (an extension, as llama.cpp's
router's) says whether it is loaded (on which workers), loading, or not loaded, and on which
machines' pools it may load.
"""

from __future__ import annotations

from flask import Blueprint, Response

from api.http.json_response import json_response
from api.queue.roster import roster
from shared.wire.errors import ModelNotFoundError
from shared.wire.fleet.catalog import ModelCard, ModelList, ModelStatus

bp = Blueprint("models", __name__)


def _cards() -> list[ModelCard]:
    """The live models and the pools' catalog, each with its kind and state."""
    served = roster()
    live = dict(served.live_models())
    catalog = served.catalog()
    names = sorted(set(live) | set(catalog.models()))
    if not names:
        return []
    kinds = served.kinds(names)
    workers = served.live_workers(list(live))
    cards = []
    for name in names:
        holders = sorted(workers.get(name, set()))
        state = "loaded" if holders else catalog.state(name)
        status = ModelStatus(value=state, workers=holders, machines=catalog.machines(name))
        created = int(live[name]) if name in live else catalog.created(name) or 0
        cards.append(ModelCard(id=name, created=created, kind=kinds[name], status=status))
    return cards


@bp.get("/v1/models")
def list_models() -> Response:
    return json_response(ModelList(data=_cards()))


@bp.get("/v1/models/<path:model_id>")
def get_model(model_id: str) -> Response:
    card = next((c for c in _cards() if c.id == model_id), None)
    if card is None:
        raise ModelNotFoundError(f"The model '{model_id}' does not exist.", param="model")
    return json_response(card)
