"""Reasoning kept apart from the answer (worker/engine/sequence/reasoning.py, harmony.py), on
token ids: what each token's text becomes, what is held back, and what the gate lets through.

The vocabularies here are small stand-ins with the markers' ids; the families' real tokenizers
run the same code in tests/families/.
"""

from __future__ import annotations

import mlx.core as mx

from shared.wire.generation.tools import CALL_END, CALL_START
from worker.engine.sequence.harmony import HarmonySplit, HarmonyTokens
from worker.engine.sequence.reasoning import ReasoningGate, ThinkMarkers, ThinkSplit

THINK, END_THINK, CALL = 900, 901, 902
MARKERS = ThinkMarkers(start=(THINK,), end=(END_THINK,), call_start=(CALL,))
# A two-token marker pair, as Gemma 4 writes its reasoning channel.
WIDE = ThinkMarkers(start=(800, 801), end=(810, 811))


def run(split: ThinkSplit | HarmonySplit, tokens: list[tuple[int, str]]) -> tuple[str, str]:
    content, reasoning = [], []
    for token, piece in tokens:
        c, r = split.feed(token, piece)
        content.append(c)
        reasoning.append(r)
    c, r = split.finish("")
    return "".join(content) + c, "".join(reasoning) + r


def test_text_between_the_markers_is_reasoning_and_the_rest_is_content() -> None:
    split = ThinkSplit(MARKERS, inside=False)
    tokens = [(THINK, "<think>"), (1, "\n"), (2, "Sum it"), (3, "."), (END_THINK, "</think>")]
    tokens += [(4, "\n\n"), (5, "It is 4.")]
    assert run(split, tokens) == ("It is 4.", "Sum it.")
    assert split.reasoning_tokens == 3


def test_output_starts_inside_reasoning_when_the_prompt_opened_it() -> None:
    assert MARKERS.opens_inside([1, 2, THINK, 1])
    assert not MARKERS.opens_inside([THINK, 5, END_THINK, 1])
    assert not MARKERS.opens_inside([1, 2, 3])
    split = ThinkSplit(MARKERS, inside=True)
    tokens = [(2, "Hmm"), (END_THINK, "</think>"), (5, "Yes")]
    assert run(split, tokens) == ("Yes", "Hmm")


def test_a_marker_split_over_tokens_reaches_neither_field() -> None:
    split = ThinkSplit(WIDE, inside=False)
    seen = [split.feed(800, "<|chan"), split.feed(801, "nel>thought")]
    assert seen == [("", ""), ("", "")]
    tokens = [(3, "deep"), (810, "<chan"), (811, "nel|>"), (4, "Done")]
    assert run(split, tokens) == ("Done", "deep")


def test_a_marker_start_that_is_no_marker_is_shown_as_text() -> None:
    split = ThinkSplit(WIDE, inside=False)
    assert split.feed(800, "<|chan") == ("", "")
    assert split.feed(5, "!") == ("<|chan!", "")


def test_stopping_while_still_reasoning_gives_empty_content_and_the_reasoning_so_far() -> None:
    split = ThinkSplit(MARKERS, inside=True)
    assert run(split, [(1, "one"), (2, " two")]) == ("", "one two")


def test_a_tool_call_marker_inside_reasoning_ends_it_and_reaches_the_call_scanner() -> None:
    split = ThinkSplit(MARKERS, inside=True)
    tokens = [(1, "plan"), (CALL, "<tool_call>"), (2, '{"name": "f"}')]
    assert run(split, tokens) == ('<tool_call>{"name": "f"}', "plan")


def logits_after(gate: ReasoningGate, context: list[int], width: int = 1000) -> mx.array:
    return gate(mx.array(context), mx.zeros((1, width)))


def test_a_budget_forces_the_end_marker_once_spent_and_then_lets_the_answer_go() -> None:
    gate = ReasoningGate(MARKERS, inside=True, budget=2, grammar=None)
    prompt = [7, THINK]
    assert mx.isfinite(logits_after(gate, prompt)).all().item()
    assert mx.isfinite(logits_after(gate, [*prompt, 1])).all().item()
    forced = logits_after(gate, [*prompt, 1, 2])
    assert mx.argmax(forced).item() == END_THINK
    assert mx.isfinite(forced).sum().item() == 1
    after = logits_after(gate, [*prompt, 1, 2, END_THINK])
    assert mx.isfinite(after).all().item()


class OnlyToken:
    """A stand-in grammar: allows one token; records from where it reads the context."""

    def __init__(self, token: int):
        self.token = token
        self.start: int | None = None

    def restart(self, at: int) -> None:
        self.start = at

    def __call__(self, context: mx.array, logits: mx.array) -> mx.array:
        return mx.where(mx.arange(logits.shape[-1]) == self.token, logits, -mx.inf)


def test_a_grammar_waits_for_the_end_of_reasoning_and_a_model_may_open_it() -> None:
    grammar = OnlyToken(42)
    gate = ReasoningGate(MARKERS, inside=False, budget=None, grammar=grammar)  # type: ignore[arg-type]
    first = logits_after(gate, [7])
    assert mx.isfinite(first[0, THINK]).item() and mx.isfinite(first[0, 42]).item()
    assert mx.isfinite(first).sum().item() == 2
    thinking = logits_after(gate, [7, THINK])
    assert mx.isfinite(thinking).all().item()
    answer = logits_after(gate, [7, THINK, 1, END_THINK])
    assert mx.isfinite(answer).sum().item() == 1
    assert grammar.start == 4  # the grammar reads the answer, not the reasoning


def test_a_grammar_holds_from_the_start_when_the_model_answers_without_reasoning() -> None:
    gate = ReasoningGate(MARKERS, inside=False, budget=None, grammar=OnlyToken(42))  # type: ignore[arg-type]
    logits_after(gate, [7])
    assert mx.isfinite(logits_after(gate, [7, 42])).sum().item() == 1


HARMONY = HarmonyTokens(start=10, end=11, message=12, channel=13, constrain=14)


def harmony_tokens(*parts: str | int) -> list[tuple[int, str]]:
    return [(p, f"<{p}>") if isinstance(p, int) else (100, p) for p in parts]


def test_harmony_analysis_is_reasoning_and_final_is_content() -> None:
    split = HarmonySplit(HARMONY)
    tokens = harmony_tokens(13, "analysis", 12, "Think", " more", 11, 10, "assistant", 13)
    tokens += harmony_tokens("final", 12, "Paris.")
    assert run(split, tokens) == ("Paris.", "Think more")
    assert split.reasoning_tokens == 2


def test_a_harmony_message_to_a_function_is_a_json_tools_call() -> None:
    split = HarmonySplit(HARMONY)
    tokens = harmony_tokens(13, "analysis", 12, "Need weather", 11, 10, "assistant", 13)
    tokens += harmony_tokens("commentary to=functions.get_weather ", 14, "json", 12)
    tokens += harmony_tokens('{"city":', ' "Paris"}')
    content, reasoning = run(split, tokens)
    assert reasoning == "Need weather"
    assert content == (
        CALL_START + '{"name": "get_weather", "arguments": {"city": "Paris"}}' + CALL_END
    )


def test_a_harmony_preamble_to_nobody_is_content() -> None:
    split = HarmonySplit(HARMONY)
    tokens = harmony_tokens(13, "commentary", 12, "Checking now.", 11)
    assert run(split, tokens) == ("Checking now.", "")


def test_newlines_around_the_markers_belong_to_neither_field() -> None:
    split = ThinkSplit(MARKERS, inside=False)
    tokens = [(THINK, "<think>"), (1, "\n"), (2, "Line one"), (3, "\n"), (4, "Line two")]
    tokens += [(5, "\n"), (END_THINK, "</think>"), (6, "\n\n"), (7, "Done")]
    assert run(split, tokens) == ("Done", "Line one\nLine two")


def test_an_end_marker_outside_reasoning_is_dropped() -> None:
    split = ThinkSplit(MARKERS, inside=False)
    assert run(split, [(1, "Yes"), (END_THINK, "</think>"), (2, ".")]) == ("Yes.", "")
