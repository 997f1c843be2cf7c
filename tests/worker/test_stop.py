"""Stop handling: stop token ids per family, and stop strings held back across tokens."""

from __future__ import annotations

from worker.engine.sequence.stop import StopStringMatcher, stop_token_ids

LLAMA3_VOCAB = {"<|begin_of_text|>": 128000, "<|end_of_text|>": 128001, "<|eot_id|>": 128009}


def test_llama3_chat_stops_on_both_eot_and_end_of_text() -> None:
    ids = stop_token_ids([128001], [], LLAMA3_VOCAB.get)
    assert {128001, 128009} <= ids
    assert 128000 not in ids


def test_generation_config_eos_ids_are_stop_tokens() -> None:
    ids = stop_token_ids([2], [7, 9], {}.get)
    assert ids == {2, 7, 9}


def test_chatml_im_end_is_a_stop_token() -> None:
    assert 2 in stop_token_ids([], [], {"<|im_end|>": 2}.get)


def feed_all(matcher: StopStringMatcher, pieces: list[str]) -> str:
    shown = ""
    for piece in pieces:
        shown += matcher.feed(piece)
        if matcher.matched:
            break
    return shown


def test_stop_string_split_across_tokens_never_leaks() -> None:
    matcher = StopStringMatcher(("END",))
    shown = []
    for piece in ["Hello E", "N", "D and more"]:
        shown.append(matcher.feed(piece))
    assert shown == ["Hello ", "", ""]
    assert matcher.matched


def test_text_before_a_stop_string_is_cut_exactly_there() -> None:
    matcher = StopStringMatcher(("\n\n", "###"))
    assert feed_all(matcher, ["one two", " three##", "# four"]) == "one two three"
    assert matcher.matched


def test_the_matcher_names_the_stop_string_that_matched_first_in_the_text() -> None:
    matcher = StopStringMatcher(("four", "##", "three"))
    assert feed_all(matcher, ["one two", " three##", "# four"]) == "one two "
    assert matcher.matched_stop == "three"
    assert StopStringMatcher(("x",)).matched_stop is None


def test_held_back_prefix_is_released_when_it_stops_matching() -> None:
    matcher = StopStringMatcher(("STOP",))
    assert matcher.feed("go ST") == "go "
    assert matcher.feed("ART") == "START"
    assert not matcher.matched


def test_flush_releases_held_text_when_generation_ends_otherwise() -> None:
    matcher = StopStringMatcher(("STOP",))
    assert matcher.feed("almost STO") == "almost "
    assert matcher.flush() == "STO"


def test_earliest_of_several_stop_strings_wins() -> None:
    matcher = StopStringMatcher(("world", "lo"))
    assert matcher.feed("hello world") == "hel"


def test_without_stop_strings_text_passes_through() -> None:
    matcher = StopStringMatcher(())
    assert matcher.feed("anything") == "anything"
    assert matcher.flush() == ""
