"""A model imported from a K-quant GGUF, served: the real Gemma 3 270M (tests/gemma3.py) on a real
worker beside the session's API, asked through the OpenAI SDK.

Its greedy answer is llama.cpp's (tests/data/gemma3_llamacpp_reference.json, the "f32" run), and
Gemma's `<end_of_turn>`, which its GGUF names nowhere, ends a reply and is never shown.
"""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest

from tests.gemma3 import END_OF_TURN, REFERENCE, imported_gemma
from worker.ops.cluster import Cluster, Worker


@pytest.fixture(scope="module")
def gemma_worker(stack: Cluster) -> Iterator[str]:
    """A worker on the imported Gemma; yields the model's name."""
    name = imported_gemma().name
    worker: Worker = stack.start_worker(MLXQ_MODEL=name, MLXQ_BATCH_SIZE="2")
    yield name
    if worker in stack.workers:
        stack.kill_worker(worker)


@pytest.fixture(scope="module")
def gemma(api_url: str, gemma_worker: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{api_url}/v1", api_key="unused", max_retries=0, timeout=120)


def test_served_gemma_completes_greedily_as_llama_cpp_does(
    gemma: openai.OpenAI, gemma_worker: str
) -> None:
    case = REFERENCE["runs"]["f32"][0]
    done = gemma.completions.create(
        model=gemma_worker, prompt=case["prompt"], max_tokens=16, temperature=0
    )
    choice = done.choices[0]
    assert choice.finish_reason == "length"
    assert done.usage is not None and done.usage.prompt_tokens == len(case["prompt_tokens"])
    assert done.usage.completion_tokens == 16
    # llama.cpp's 32-token answer, cut at 16 tokens.
    assert (
        choice.text == " the capital of the country of France. It is the largest city in France and"
    )
    assert case["text"].startswith(choice.text)


def test_served_gemma_ends_its_turn_at_end_of_turn_and_never_shows_it(
    gemma: openai.OpenAI, gemma_worker: str
) -> None:
    # The base model would go on; a bias makes `<end_of_turn>` its first choice.
    done = gemma.chat.completions.create(
        model=gemma_worker,
        messages=[{"role": "user", "content": "What is 2 + 2?"}],
        max_tokens=16,
        temperature=0,
        logit_bias={str(END_OF_TURN): 100},
    )
    choice = done.choices[0]
    assert choice.finish_reason == "stop"
    assert choice.message.content == ""
    assert done.usage is not None and done.usage.completion_tokens == 1
