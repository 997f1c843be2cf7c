"""The placement rule and the block hashes it matches on (api/queue/placement.py,
shared/queue/prefix_blocks.py), on made-up fleets: which worker a request is placed on."""

from __future__ import annotations

from api.queue.placement import MAX_IMBALANCE, Candidate, Choice, choose
from shared.queue.prefix_blocks import BLOCK_TOKENS, block_hashes, matched_blocks


def test_prompts_share_exactly_the_hashes_of_the_blocks_they_share() -> None:
    history = list(range(3 * BLOCK_TOKENS))
    later_turn = [*history, 7, 8, 9] * 2  # the same three blocks, then others
    other = [1, *history[1:]]  # differs in its first token
    assert block_hashes(later_turn)[:3] == block_hashes(history)
    assert len(block_hashes(history[:-1])) == 2  # a partial block is not named
    assert not set(block_hashes(other)) & set(block_hashes(history))


def test_the_leading_run_of_held_blocks_is_what_counts() -> None:
    assert matched_blocks([True, True, False, True]) == 2
    assert matched_blocks([False, True]) == 0


def test_a_request_goes_to_the_worker_holding_most_of_its_prefix_while_it_has_room() -> None:
    fleet = [Candidate("a", 128, 3, 1), Candidate("b", 512, 1, 3), Candidate("c", 0, 4, 0)]
    assert choose(fleet) == Choice("b", 512, "placed")


def test_a_full_holder_leaves_the_request_to_any_free_worker() -> None:
    fleet = [Candidate("a", 512, 0, 4), Candidate("b", 0, 4, 0)]
    assert choose(fleet) == Choice(None, 512, "busy")


def test_a_holder_far_busier_than_the_least_loaded_worker_is_not_followed() -> None:
    busy = MAX_IMBALANCE + 1
    assert choose([Candidate("a", 512, 10, busy), Candidate("b", 0, 15, 0)]).worker_id is None
    fair = MAX_IMBALANCE
    assert choose([Candidate("a", 512, 10, fair), Candidate("b", 0, 15, 0)]).worker_id == "a"


def test_when_every_worker_is_full_the_request_waits_for_the_holder() -> None:
    fleet = [Candidate("a", 512, 0, 4), Candidate("b", 0, 0, 4)]
    assert choose(fleet) == Choice("a", 512, "placed")


def test_a_prompt_no_worker_holds_is_not_placed() -> None:
    assert choose([Candidate("a", 0, 4, 0), Candidate("b", 0, 1, 3)]) == Choice(None, 0, "cold")
