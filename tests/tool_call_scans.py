"""A tool-call scanner fed a model's output piece by piece, then finished, as the engine feeds
it: what the tool-call tests read back (tests/worker/test_tool_calls.py, test_answer_calls.py,
tests/families/test_tool_call_corpus.py)."""

from __future__ import annotations

from worker.engine.sequence.calls.tool_calls import Scanned, ToolCallScanner


def scanned(scanner: ToolCallScanner, pieces: list[str]) -> Scanned:
    """Every piece through `scanner`, then its finish: all it gave, joined."""
    got = Scanned()
    for part in [*(scanner.feed(p) for p in pieces), scanner.finish()]:
        got.text += part.text
        got.deltas += part.deltas
        got.calls += part.calls
    return got
