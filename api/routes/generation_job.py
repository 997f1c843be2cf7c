"""The job a generation route's request asks for: what chat and text completions, responses and
messages (chat.py, completions.py, responses.py, anthropic/messages.py) do alike between parsing
a body and running its job, so that the order of their checks is written once."""

from __future__ import annotations

from api.http.auth import cache_scope, owner_id
from api.http.validation import checked_images
from api.stores.idempotency import STREAMED, refuse_key
from shared.queue.jobs import GenerationJob, job_for
from shared.wire.anthropic.messages import MessagesRequest
from shared.wire.chat.completions import ChatCompletionRequest, CompletionRequest
from shared.wire.images import ImageInput
from shared.wire.responses.responses import ResponsesRequest


def requested_job(
    job_id: str,
    req: ChatCompletionRequest | CompletionRequest | ResponsesRequest | MessagesRequest,
    images: list[ImageInput] | None = None,
    replay_ttl_s: int | None = None,
) -> GenerationJob:
    """The job that answers `req`, this HTTP request's validated body, for its sender (owner
    and cache scope). Its `images` are checked first, before anything of it is queued; then a
    streamed request refuses an Idempotency-Key, since its answer cannot be replayed.
    `replay_ttl_s`: keep the job's event log that long (a stored response)."""
    checked = checked_images(images or [])
    if req.stream:
        refuse_key(STREAMED)
    return job_for(job_id, req, owner_id(), replay_ttl_s, scope=cache_scope(), images=checked)
