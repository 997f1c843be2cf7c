"""Scripted models (tests/families/scripted.py): plain mlx-lm, loading the directory and
generating greedily after the family's rendered chat prompt, says exactly the script, for each
reply in tests/families/examples.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import mlx.core as mx
import pytest
from mlx_lm import stream_generate
from mlx_lm.sample_utils import make_sampler
from mlx_lm.utils import load_model

from tests.families.examples import REPLIES
from tests.families.scripted import ScriptError, read_script, scripted_model
from tests.families.vocab import family_dir, family_tokenizer

HI = [{"role": "user", "content": "Hello! What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.getbasetemp() / "scripted"


def says(model_dir: Path, messages: list[dict[str, Any]], temp: float = 0.0) -> list[int]:
    """What plain mlx-lm generates from the model after the rendered chat, as many tokens as
    the script has (a family whose end token is not mlx-lm's eos would go on)."""
    family = read_script(model_dir)["family"]
    tokenizer = family_tokenizer(family)
    model, _ = load_model(model_dir)
    prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    mx.random.seed(0)
    steps = stream_generate(
        model,
        tokenizer,
        prompt,
        max_tokens=len(read_script(model_dir)["reply"]),
        sampler=make_sampler(temp=temp),
    )
    return [step.token for step in steps]


@pytest.mark.parametrize(("family", "kind"), sorted(REPLIES))
def test_plain_mlx_lm_generates_the_script_greedily(family: str, kind: str, root: Path) -> None:
    model = scripted_model(family_dir(family), REPLIES[(family, kind)], root)
    script = read_script(model)
    assert script["reply_text"] == REPLIES[(family, kind)]
    assert says(model, HI) == script["reply"]


def test_sampling_at_temperature_one_says_the_script_too(root: Path) -> None:
    model = scripted_model(family_dir("qwen3"), REPLIES[("qwen3", "think-then-tool-call")], root)
    assert says(model, HI, temp=1.0) == read_script(model)["reply"]


def test_a_long_conversation_before_the_reply_does_not_change_it(root: Path) -> None:
    model = scripted_model(
        family_dir("gpt-oss"), REPLIES[("gpt-oss", "analysis-then-tool-call")], root
    )
    long = [
        {"role": "system", "content": "Answer about the weather."},
        {"role": "user", "content": "Tell me a story. " * 400},
        {"role": "assistant", "content": "Once upon a time. " * 300},
        *HI,
    ]
    assert says(model, long) == read_script(model)["reply"]


def test_the_model_is_one_layer_of_a_few_tens_of_mb(root: Path) -> None:
    model = scripted_model(
        family_dir("gpt-oss"), REPLIES[("gpt-oss", "analysis-then-tool-call")], root
    )
    assert (model / "model.safetensors").stat().st_size <= 4 * 201088 * 64 + 1_000_000
    assert {p.name for p in model.iterdir()} >= {
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "generation_config.json",
        "script.json",
    }


def test_harmony_names_the_user_message_endings_that_would_mislead_it(root: Path) -> None:
    """After the user's message and again after the analysis, harmony writes
    `<|end|><|start|>assistant<|channel|>`: the model tells them apart by the token before, so
    a user message ending like the analysis ("briefly") would take the later branch."""
    model = scripted_model(family_dir("gpt-oss"), REPLIES[("gpt-oss", "analysis-then-final")], root)
    script = read_script(model)
    assert script["forbidden_endings_text"] == [" briefly"]
    misled = says(model, [{"role": "user", "content": "Answer briefly"}])
    assert misled != script["reply"]
    assert says(model, [{"role": "user", "content": "Answer in brief"}]) == script["reply"]


def test_a_reply_that_goes_on_differently_after_a_long_repeat_is_refused(root: Path) -> None:
    repeat = " one two three four five six seven eight nine ten"
    with pytest.raises(ScriptError, match="repeats 9 tokens"):
        scripted_model(family_dir("qwen3"), repeat + " A" + repeat + " B<|im_end|>", root)


def test_a_reply_can_follow_a_prompt_end_the_test_gives(root: Path) -> None:
    after = "<|im_start|>user\nsay it<|im_end|>\n<|im_start|>assistant\n"
    model = scripted_model(family_dir("qwen3"), "It.<|im_end|>", root, after=after)
    script = read_script(model)
    assert script["after_text"] == after
    assert says(model, [{"role": "user", "content": "say it"}]) == script["reply"]


def test_the_same_script_is_built_once(root: Path) -> None:
    reply = REPLIES[("mistral", "answer")]
    first = scripted_model(family_dir("mistral"), reply, root)
    stamp = (first / "model.safetensors").stat().st_mtime_ns
    again = scripted_model(family_dir("mistral"), reply, root)
    assert again == first
    assert (again / "model.safetensors").stat().st_mtime_ns == stamp
