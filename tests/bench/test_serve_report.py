"""`bench serve`'s tables say what the long cells are for: a conversation's next turn against
its first, the short requests' TTFT beside long ones against alone, and answers that came back
without a token (a run limit that ended a prefill), which are no error and no throughput."""

from __future__ import annotations

from typing import Any

from bench.report import serve_markdown


def _row(system: str, workload: str, **figures: Any) -> dict[str, Any]:
    base = {"tokens_per_s": 10.0, "ttft_p50_ms": 1000.0, "errors": 0, "empty": 0}
    return {
        "system": system,
        "workload": workload,
        "concurrency": 1,
        "repeat": 0,
        **base,
        **figures,
    }


def _result(rows: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "started": "s",
        "finished": "f",
        "command": "c",
        "machine": {"summary": "m"},
        "settings": {"max_tokens": "8"},
        "rows": rows,
        "warnings": [],
    }


def test_a_long_cell_gives_its_next_turn_against_its_first() -> None:
    rows = [_row("mlxq", "long30k", ttft_first_ms=40_000.0, ttft_next_ms=2_000.0)]
    text = serve_markdown(_result(rows))
    assert "TTFT first turn ms" in text and "TTFT next turn ms" in text
    assert "next turn / first turn TTFT = 0.05" in text


def test_the_mixed_cell_gives_short_requests_beside_long_ones_against_alone() -> None:
    figures = {"short_ttft_p95_alone_ms": 500.0, "short_ttft_p95_mixed_ms": 1500.0}
    text = serve_markdown(_result([_row("mlxq", "mixed", **figures)]))
    assert "short TTFT p95 mixed / alone = 3.00" in text


def test_answers_without_a_token_are_a_column_only_where_there_are_some() -> None:
    assert "answers without a token" not in serve_markdown(_result([_row("mlxq", "short")]))
    text = serve_markdown(_result([_row("mlxq", "long16k", empty=1)]))
    assert "answers without a token" in text
