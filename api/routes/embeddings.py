"""POST /v1/embeddings: OpenAI embeddings, computed by the workers that serve an embedding model.

The request becomes one embedding job on the model's queue, like any generation job (admission,
fair order, cancel when the client goes away); its vectors come back as the job's events and are
answered as one body in the encoding the request asked for.
"""

from __future__ import annotations

import base64

from flask import Blueprint, Response

from api.http.auth import owner_id
from api.http.json_response import json_response
from api.http.validation import parse_body
from api.queue.broker import broker
from api.queue.generation import RunningJob, start
from shared.queue.jobs import embedding_job_for
from shared.wire.embeddings import EmbeddingList, EmbeddingRequest, embedding_list
from shared.wire.errors import GenerationError
from shared.wire.events import DoneEvent, EmbeddingEvent
from shared.wire.ids import new_id

bp = Blueprint("embeddings", __name__)


@bp.post("/v1/embeddings")
def create_embeddings() -> Response:
    req = parse_body(EmbeddingRequest)
    running = start(broker(), embedding_job_for(new_id("emb-"), req, owner_id()))
    return json_response(collect_embeddings(running, req))


def collect_embeddings(running: RunningJob, req: EmbeddingRequest) -> EmbeddingList:
    """Wait for every vector of the job, then build the answer."""
    vectors: dict[int, bytes] = {}
    try:
        for batch in running.updates():
            for event in batch:
                if isinstance(event, EmbeddingEvent):
                    vectors[event.index] = base64.b64decode(event.data)
                elif isinstance(event, DoneEvent):
                    return _answer(req, vectors, event)
    finally:
        running.close()
    raise GenerationError("the job ended without a final event")


def _answer(req: EmbeddingRequest, vectors: dict[int, bytes], done: DoneEvent) -> EmbeddingList:
    count = len(req.inputs())
    if sorted(vectors) != list(range(count)):
        raise GenerationError(f"the worker sent {len(vectors)} of {count} vectors")
    ordered = [vectors[i] for i in range(count)]
    return embedding_list(req.model, ordered, done.usage.prompt_tokens, req.encoding_format)
