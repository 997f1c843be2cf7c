"""Property tests of the stop-string hold-back matcher: any text, any stop strings, any split of
the text into tokens. What is shown is always a prefix of the text, is never taken back, never
contains a stop string, and stops exactly where the first completed stop string begins; text is
held back only while it could still become a stop string."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from worker.engine.sequence.stop import StopStringMatcher

# A small alphabet makes matches and near-matches common; a few wider characters keep it honest.
alphabet = st.sampled_from(["a", "b", "c", " ", "\n", "é", "😀"])
texts = st.text(alphabet, max_size=40)
stops = st.lists(st.text(alphabet, min_size=1, max_size=5), min_size=0, max_size=4)


@st.composite
def split_text(draw: st.DrawFn) -> tuple[str, list[str]]:
    text = draw(texts)
    cuts = sorted(set(draw(st.lists(st.integers(0, len(text)), max_size=len(text) + 1))))
    bounds = [0, *cuts, len(text)]
    return text, [text[a:b] for a, b in itertools.pairwise(bounds)]


@settings(max_examples=500, deadline=None)
@given(split=split_text(), stop_strings=stops)
def test_stop_strings_are_never_shown_and_cut_exactly(
    split: tuple[str, list[str]], stop_strings: list[str]
) -> None:
    text, pieces = split
    matcher = StopStringMatcher(tuple(stop_strings))
    shown, fed = "", ""
    for piece in pieces:
        out = matcher.feed(piece)
        fed += piece
        shown += out
        assert fed.startswith(shown)  # only ever a prefix of the text, never taken back
        if matcher.matched:
            break
        held = fed[len(shown) :]
        assert held == "" or any(s.startswith(held) and s != held for s in stop_strings)
        assert not any(s in shown for s in stop_strings)
    if matcher.matched:
        assert any(text[len(shown) :].startswith(s) for s in stop_strings)
        assert not any(s in shown for s in stop_strings)
    else:
        shown += matcher.flush()
        assert shown == text
        assert not any(s in text for s in stop_strings)


@settings(max_examples=300, deadline=None)
@given(split=split_text(), stop_strings=stops)
def test_the_split_into_tokens_does_not_change_whether_a_stop_is_found(
    split: tuple[str, list[str]], stop_strings: list[str]
) -> None:
    text, pieces = split
    matcher = StopStringMatcher(tuple(stop_strings))
    for piece in pieces:
        matcher.feed(piece)
        if matcher.matched:
            break
    assert matcher.matched == any(s in text for s in stop_strings)
