"""Wire formats of /v1/embeddings: OpenAI's request and its answer.

The request forbids unknown fields (400 naming them, as the other endpoints). `input` takes
OpenAI's four shapes: a string, a list of strings, a list of token ids, a list of token-id lists,
up to OpenAI's 2,048 inputs; token ids are ids of the model's own tokenizer. `dimensions` is
refused: the served models cannot shorten their vectors. The vectors of a finished job arrive
as little-endian float32 bytes (`EmbeddingEvent`, shared/wire/events.py); `embedding_list`
builds the answer from them in the encoding asked for (`float` lists, or `base64` of those same
bytes, as OpenAI sends them).
"""

from __future__ import annotations

import base64
import sys
from array import array
from typing import Annotated, Literal, cast

from pydantic import BaseModel, ConfigDict, Field, model_validator

from shared.wire.chat.completions import PRIORITY_LIMIT, PromptText, TokenIds
from shared.wire.errors import UnsupportedParameterError
from shared.wire.fleet.keep_alive import KeepAlive
from shared.wire.ids import MODEL_NAME_PATTERN

MAX_INPUTS = 2048  # inputs in one request (OpenAI's limit)
EncodingFormat = Literal["float", "base64"]


class EmbeddingRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: Annotated[str, Field(pattern=MODEL_NAME_PATTERN)]
    input: (
        PromptText
        | TokenIds
        | Annotated[list[PromptText], Field(min_length=1, max_length=MAX_INPUTS)]
        | Annotated[list[TokenIds], Field(min_length=1, max_length=MAX_INPUTS)]
    )
    encoding_format: EncodingFormat = "float"
    dimensions: Annotated[int, Field(ge=1)] | None = None
    user: str | None = None
    # vLLM's: lower runs earlier among the caller's own queued jobs, as for generation.
    priority: Annotated[int, Field(ge=-PRIORITY_LIMIT, le=PRIORITY_LIMIT)] = 0
    # Ollama's, as for generation (shared/wire/fleet/keep_alive.py).
    keep_alive: KeepAlive | None = None

    @model_validator(mode="after")
    def _refuse_dimensions(self) -> EmbeddingRequest:
        if self.dimensions is not None:
            raise UnsupportedParameterError(
                f"'dimensions' is not supported: the model '{self.model}' returns vectors of "
                "its own fixed size and cannot shorten them; leave 'dimensions' out.",
                param="dimensions",
            )
        return self

    def inputs(self) -> list[str | list[int]]:
        """The inputs as a list, one vector each, in order."""
        given = self.input
        if isinstance(given, str) or all(isinstance(item, int) for item in given):
            return [cast(str | list[int], given)]
        return cast(list[str | list[int]], given)


class Embedding(BaseModel):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | str  # a base64 string for encoding_format "base64"


class EmbeddingUsage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class EmbeddingList(BaseModel):
    object: Literal["list"] = "list"
    data: list[Embedding]
    model: str
    usage: EmbeddingUsage


def embedding_list(
    model: str, vectors: list[bytes], prompt_tokens: int, encoding: EncodingFormat
) -> EmbeddingList:
    """The answer to an embeddings request: `vectors` (little-endian float32) in input order."""
    data = [
        Embedding(index=i, embedding=_encoded(vector, encoding)) for i, vector in enumerate(vectors)
    ]
    usage = EmbeddingUsage(prompt_tokens=prompt_tokens, total_tokens=prompt_tokens)
    return EmbeddingList(data=data, model=model, usage=usage)


def _encoded(vector: bytes, encoding: EncodingFormat) -> list[float] | str:
    if encoding == "base64":
        return base64.b64encode(vector).decode()
    floats = array("f", vector)
    if sys.byteorder == "big":
        floats.byteswap()
    return floats.tolist()
