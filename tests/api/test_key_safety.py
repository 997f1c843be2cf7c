"""Ids are unguessable, and nothing from a request reaches a Redis key unchecked."""

from __future__ import annotations

import re

import pytest

from shared.queue.keys import Keys, is_valid_id, is_valid_model_name
from shared.wire.errors import InvalidKeyPartError
from shared.wire.ids import new_id


def test_ids_carry_128_random_bits() -> None:
    ids = {new_id("chatcmpl-") for _ in range(1000)}
    assert len(ids) == 1000
    assert all(re.fullmatch(r"chatcmpl-[0-9a-f]{32}", i) and is_valid_id(i) for i in ids)


@pytest.mark.parametrize(
    "part",
    ["", "a:b", "a b", "a*", "a?", "[a]", "a\nb", "a\n", "a\x00", "-a", "a/b", "é", "a" * 129],
)
def test_ids_that_could_inject_into_keys_are_refused(part: str) -> None:
    keys = Keys("mlxq")
    assert not is_valid_id(part)
    for build in (keys.events, keys.replay, keys.cancelled):
        with pytest.raises(InvalidKeyPartError):
            build(part)
    with pytest.raises(InvalidKeyPartError):  # a share (an owner id) names a bulk lane's queue
        keys.share_queue("m", "batch", part)


@pytest.mark.parametrize("model", ["", "a b", "a*", "a\n", "a\x00", ".hidden", "/root", "a" * 129])
def test_model_names_that_could_inject_into_keys_are_refused(model: str) -> None:
    keys = Keys("mlxq")
    assert not is_valid_model_name(model)
    for build in (
        keys.queue,
        keys.background_queue,
        keys.batch_queue,
        keys.workers,
        keys.tokenizer,
    ):
        with pytest.raises(InvalidKeyPartError):
            build(model)
    for lane in ("background", "batch"):
        with pytest.raises(InvalidKeyPartError):
            keys.turns(model, lane)
        with pytest.raises(InvalidKeyPartError):
            keys.share_queue_prefix(model, lane)


@pytest.mark.parametrize(
    "model", ["SmolLM2-135M-Instruct", "mlx-community/Llama-3.2-1B-Instruct-4bit", "qwen3:8b"]
)
def test_real_model_names_are_accepted(model: str) -> None:
    assert Keys("ns").queue(model) == f"ns.{model}"
