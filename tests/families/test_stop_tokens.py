"""The tokens that end a sequence (worker/engine/sequence/stop.py), on each family's real
vocabulary: from the vocabulary alone, with the family's generation_config.json too, and as
`load_model` infers them for a model of the family."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.families.examples import REPLIES
from tests.families.scripted import scripted_model
from tests.families.vocab import FAMILIES, family_dir, family_tokenizer
from worker.engine.cpu.exponentials import Routes
from worker.engine.model import load_model
from worker.engine.sequence.stop import stop_token_ids

# family -> (ids that must stop a sequence, ids that must not)
STOPS: dict[str, tuple[set[int], set[int]]] = {
    # <|im_end|> ends the turn; <|im_start|>, </think> and </tool_call> do not.
    "qwen3": ({151645, 151643}, {151644, 151668, 151658}),
    # <|return|> and <|call|> end a reply; <|end|> only ends its analysis message.
    "gpt-oss": ({200002, 200012}, {200007, 200005, 200006, 200008}),
    "deepseek-r1": ({1}, {0, 128822, 128804}),
    # <|eot_id|> ends a turn, <|eom_id|> a message that calls a built-in tool.
    "llama3": ({128009, 128008, 128001}, {128000, 128006, 128007, 128010}),
    # Phi's <|end|> stops: outside harmony it ends the turn.
    "phi4-mini": ({200020, 199999}, {200019, 200021}),
    "gemma": ({107, 1}, {106, 2}),
    "mistral": ({2}, {1, 3, 4, 9}),
}


def vocabulary_stops(family: str, generation_eos: list[int]) -> frozenset[int]:
    tokenizer = family_tokenizer(family)
    vocab = tokenizer.get_vocab()
    return stop_token_ids(tokenizer.eos_token_ids, generation_eos, vocab.get)


def generation_eos(family: str) -> list[int]:
    file = family_dir(family) / "generation_config.json"
    if not file.is_file():
        return []
    eos = json.loads(file.read_text())["eos_token_id"]
    return [eos] if isinstance(eos, int) else list(eos)


def test_every_family_has_its_stops_stated() -> None:
    assert set(STOPS) == set(FAMILIES)


@pytest.mark.parametrize("family", FAMILIES)
def test_the_vocabulary_alone_gives_the_familys_stop_tokens(family: str) -> None:
    stops, goes_on = STOPS[family]
    ids = vocabulary_stops(family, [])
    assert stops <= ids
    assert not goes_on & ids


@pytest.mark.parametrize("family", FAMILIES)
def test_the_generation_config_adds_no_wrong_stop(family: str) -> None:
    stops, goes_on = STOPS[family]
    ids = vocabulary_stops(family, generation_eos(family))
    assert stops <= ids
    assert not goes_on & ids


def test_harmony_end_does_not_stop_even_where_a_config_names_it() -> None:
    assert 200007 not in vocabulary_stops("gpt-oss", [200002, 200007])


def test_load_model_stops_gpt_oss_on_return_and_call_but_not_on_end(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    root: Path = tmp_path_factory.getbasetemp() / "scripted"
    reply = REPLIES[("gpt-oss", "analysis-then-final")]
    loaded = load_model(
        str(scripted_model(family_dir("gpt-oss"), reply, root)), Routes(False, False)
    )
    stops, goes_on = STOPS["gpt-oss"]
    assert stops <= loaded.stop_ids
    assert not goes_on & loaded.stop_ids
