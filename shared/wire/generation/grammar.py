"""Structured outputs: OpenAI's `response_format` (and the Responses API's `text.format`) turned
into a grammar the worker constrains decoding with.

The grammar engine is llguidance (MIT, the one vLLM, llama.cpp and SGLang use): a JSON schema
becomes a grammar here, on the API side, where a schema llguidance cannot honour is refused with
a 400 naming the parameter before anything is queued. The job carries the grammar as text; the
worker compiles it against its tokenizer (worker/engine/sequence/grammar.py). The API keeps the
grammars it compiled, least recently used out first, up to GRAMMAR_CACHE_BYTES of grammar text
per process: a schema may be megabytes, so a count of entries would bound nothing.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import threading
from typing import TYPE_CHECKING, Annotated, Any, Literal

from cachetools import LRUCache
from llguidance import LLMatcher
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr

from shared.wire.errors import InvalidRequestError

if TYPE_CHECKING:  # a TypedDict of llguidance's type stubs only
    from llguidance._lib import JsonCompileOptions

SCHEMA_NAME_PATTERN = r"^[a-zA-Z0-9_-]{1,64}$"
# Compact JSON, no free whitespace: a small model cannot wander off into blank lines.
_JSON_OPTIONS: JsonCompileOptions = {"whitespace_flexible": False}
ANY_OBJECT: dict[str, Any] = {"type": "object"}
GRAMMAR_CACHE_BYTES = 32 << 20
# By the schema's digest, the grammar's text (which names no parameter: only a refusal does, and
# refusals are not kept), so a schema a request carries under two names is compiled once.
_COMPILED: LRUCache[bytes, str] = LRUCache(GRAMMAR_CACHE_BYTES, getsizeof=len)
_COMPILED_LOCK = threading.Lock()


class SchemaGrammar(BaseModel):
    """A format carrying a JSON schema, which keeps the grammar it compiled: a request asks for
    it as it validates and again as its job is made, and even a hit in the API's cache costs a
    serialization of the whole schema (its key), which for a schema of megabytes is most of
    what the request costs."""

    _grammar: str | None = PrivateAttr(default=None)

    def _grammar_of(self, schema: dict[str, Any], param: str) -> str:
        if self._grammar is None:
            self._grammar = grammar_for_schema(schema, param)
        return self._grammar


class JsonSchemaSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, serialize_by_alias=True)
    name: Annotated[str, Field(pattern=SCHEMA_NAME_PATTERN)]
    description: str | None = None
    schema_: Annotated[dict[str, Any] | None, Field(alias="schema")] = None
    # Output is always constrained to the schema; `strict` is accepted either way.
    strict: bool | None = None


class TextFormat(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["text"]

    def grammar(self, param: str) -> str | None:
        return None


class JsonObjectFormat(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["json_object"]

    def grammar(self, param: str) -> str | None:
        return grammar_for_schema(ANY_OBJECT, param)


class JsonSchemaFormat(SchemaGrammar):
    model_config = ConfigDict(extra="forbid")
    type: Literal["json_schema"]
    json_schema: JsonSchemaSpec

    def grammar(self, param: str) -> str | None:
        return self._grammar_of(self.json_schema.schema_ or {}, param)


ResponseFormat = Annotated[
    TextFormat | JsonObjectFormat | JsonSchemaFormat, Field(discriminator="type")
]


def grammar_for_schema(schema: dict[str, Any], param: str) -> str:
    """The llguidance grammar for a JSON schema; a 400 naming `param` if it cannot be used."""
    text = json.dumps(schema, sort_keys=True)
    key = hashlib.blake2b(text.encode(), digest_size=16).digest()
    with _COMPILED_LOCK:
        found = _COMPILED.get(key)
    if found is None:
        found = _compile(text, param)
        with _COMPILED_LOCK, contextlib.suppress(ValueError):  # one grammar over the bound
            _COMPILED[key] = found
    return found


def _compile(schema: str, param: str) -> str:
    try:
        grammar = LLMatcher.grammar_from_json_schema(schema, defaults=_JSON_OPTIONS)
        problem = LLMatcher.validate_grammar(grammar)
    except (ValueError, TypeError) as err:
        problem = str(err)
    if problem:
        raise InvalidRequestError(
            f"The JSON schema in '{param}' cannot be used for constrained decoding: {problem}",
            param=param,
            code="invalid_json_schema",
        )
    return grammar
