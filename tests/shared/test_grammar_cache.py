"""The API's cache of compiled grammars (shared/wire/generation/grammar.py) is bounded by the bytes
of the grammars it holds, not by their count: a key sending megabyte schemas cannot grow it."""

from __future__ import annotations

import pytest
from cachetools import LRUCache

from shared.wire.generation import grammar
from shared.wire.generation.grammar import grammar_for_schema


def _schema(i: int, width: int) -> dict[str, object]:
    return {"type": "object", "properties": {f"f{i}_{'x' * width}": {"type": "integer"}}}


def test_compiled_grammars_are_kept_within_the_caches_bytes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    shipped = grammar._COMPILED
    assert (shipped.maxsize, shipped.getsizeof("abc")) == (grammar.GRAMMAR_CACHE_BYTES, 3)
    bound = 4 * len(grammar_for_schema(_schema(0, 2000), "response_format"))
    cache: LRUCache[bytes, str] = LRUCache(bound, getsizeof=len)
    monkeypatch.setattr(grammar, "_COMPILED", cache)
    grammars = [grammar_for_schema(_schema(i, 2000), "response_format") for i in range(20)]
    assert cache.currsize <= bound
    assert 1 <= len(cache) <= 4
    assert grammar_for_schema(_schema(19, 2000), "response_format") is grammars[-1]  # a hit


def test_a_grammar_larger_than_the_cache_is_compiled_and_not_kept(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cache: LRUCache[bytes, str] = LRUCache(10, getsizeof=len)
    monkeypatch.setattr(grammar, "_COMPILED", cache)
    assert grammar_for_schema(_schema(0, 100), "response_format")
    assert len(cache) == 0


def test_a_schema_under_two_parameter_names_is_compiled_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Anthropic's `output_config.format.schema` becomes chat's `response_format` as its job
    is made: the second name must find the first one's grammar."""
    monkeypatch.setattr(grammar, "_COMPILED", LRUCache(1 << 20, getsizeof=len))
    compiled: list[str] = []
    compile_once = grammar._compile

    def counted(schema: str, param: str) -> str:
        compiled.append(param)
        return compile_once(schema, param)

    monkeypatch.setattr(grammar, "_compile", counted)
    first = grammar_for_schema(_schema(0, 10), "output_config.format.schema")
    assert grammar_for_schema(_schema(0, 10), "response_format") is first
    assert compiled == ["output_config.format.schema"]
