"""A scripted model served by a real worker (worker/ops/cluster.py, as the end-to-end tests start
one): the way to put a family's format through the whole stack. gpt-oss's reply runs on past
the `<|end|>` that closes its analysis, to the answer and the `<|return|>` that ends it, which
is never shown."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from tests.families.examples import REPLIES
from tests.families.scripted import read_script, scripted_model, worker_env
from tests.families.vocab import family_dir
from worker.ops.cluster import Cluster, Worker

ANSWER = "Hello! How can I help?"
HI = [{"role": "user", "content": "Hello! What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def gpt_oss(stack: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    root = tmp_path_factory.getbasetemp() / "served"
    model = scripted_model(family_dir("gpt-oss"), REPLIES[("gpt-oss", "analysis-then-final")], root)
    worker: Worker = stack.start_worker(**worker_env(model), MLXQ_BATCH_SIZE="2")
    yield model
    if worker in stack.workers:
        stack.kill_worker(worker)


@pytest.fixture(scope="module")
def sdk(api_url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{api_url}/v1", api_key="unused", max_retries=0, timeout=120)


def test_gpt_oss_answers_past_the_end_of_its_analysis(sdk: openai.OpenAI, gpt_oss: Path) -> None:
    reply = sdk.chat.completions.create(model=gpt_oss.name, messages=HI)
    choice = reply.choices[0]
    assert choice.finish_reason == "stop"
    assert choice.message.content is not None
    assert choice.message.content.endswith(ANSWER)
    assert "<|return|>" not in choice.message.content
    assert reply.usage is not None
    assert reply.usage.completion_tokens == len(read_script(gpt_oss)["reply"])


def test_gpt_oss_streams_past_the_end_of_its_analysis(sdk: openai.OpenAI, gpt_oss: Path) -> None:
    stream = sdk.chat.completions.create(
        model=gpt_oss.name,
        messages=HI,
        stream=True,
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text.endswith(ANSWER)
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
