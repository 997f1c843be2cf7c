"""The models users serve, through the pool as `mlxq run` serves them: a pool agent on the
session's stack (its Redis and API) whose catalog is a models folder of this module's own, the
default model quantized to 4 and to 8 bits by mlx-lm (tests/quantized.py) and the default
embedding model, all-MiniLM (a BERT), with a budget that holds all three at once and no more.

Through the OpenAI SDK: each quantized model loads on its first request and answers greedily
token for token as plain mlx-lm does on the same folder; a chat model and an embedding model of
another family are held side by side, neither unloaded for the other.
"""

from __future__ import annotations

import json
import math
import subprocess
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx_lm
import openai
import pytest
from mlx_lm.generate import stream_generate

from shared.queue import pool as pools
from shared.queue.config import Settings
from shared.wire.fleet.pool import MIB, PoolReport
from tests.quantized import quantized_model
from worker.engine.embedding.download import ensure_default_embedder
from worker.ops.cluster import Cluster, wait_until
from worker.pool.catalog import read_catalog

BITS = (4, 8)
CHAT = {bits: f"smol-{bits}bit" for bits in BITS}  # their names in the catalog
EMBEDDER = "minilm"
TOKENS = 12
LOAD_S = 180  # a load on a loaded 2-core machine
# What each model is given; the budget is what they cost together (`pool`).
POOL = {"pool_rows": 2, "pool_kv_tokens": 1024, "prefix_cache_mb": 16, "pool_headroom_mb": 512}
# A chat prompt (rendered by the model's template), whose answer ends at an end token before
# TOKENS at both bits, and a plain completion prompt, whose runs to TOKENS. A system message of
# its own keeps the template's longer default one out: a quantized model's prefill on the CPU
# runs at about the pace of its decode.
PROMPTS: list[dict[str, Any]] = [
    {
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Name the capital of France."},
        ]
    },
    {"prompt": "The three primary colours are"},
]


@dataclass(frozen=True)
class Answer:
    tokens: int
    text: str
    finish_reason: str


@dataclass
class Pool:
    cluster: Cluster
    folder: Path  # its catalog
    budget_bytes: int
    client: openai.OpenAI

    def report(self) -> PoolReport:
        found = pools.read_reports(
            self.cluster.redis(), self.cluster.keys, self.cluster.heartbeat_s
        )
        assert len(found) == 1, found
        return found[0]

    def loaded(self) -> dict[str, list[str]]:
        """The loaded models, each with its workers' ids."""
        held: dict[str, list[str]] = {}
        for h in self.report().held:
            if h.state == "loaded":
                held.setdefault(h.model, []).append(h.worker_id)
        return held

    def loaded_with(self, model: str, timeout_s: float = 10) -> dict[str, list[str]]:
        """`loaded` once it shows `model` (the report is rewritten each beat), or as it is
        after `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        while model not in (held := self.loaded()) and time.monotonic() < deadline:
            time.sleep(0.1)
        return held


@pytest.fixture(scope="module")
def pool(stack: Cluster, api_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pool]:
    models = Settings().models_dir
    folder = tmp_path_factory.mktemp("served-models")
    native = models / ".native"  # the CPU matvec, built once beside the models
    if native.is_dir():
        (folder / ".native").symlink_to(native)
    for bits in BITS:
        (folder / CHAT[bits]).symlink_to(quantized_model(bits))
    (folder / EMBEDDER).symlink_to(ensure_default_embedder(models))
    catalog = read_catalog(Settings(models_dir=folder, **POOL))
    assert sorted(catalog) == sorted([*CHAT.values(), EMBEDDER])
    # All three and the spare worker, which counts a process's headroom.
    held = sum(found.entry.cost.total_bytes for found in catalog.values())
    budget_mb = math.ceil((held + POOL["pool_headroom_mb"] * MIB) / MIB)
    env = {f"MLXQ_{name.upper()}": str(value) for name, value in POOL.items()}
    agent: subprocess.Popen[bytes] = stack.start_pool(
        MLXQ_MODELS_DIR=str(folder),
        MLXQ_POOL_BUDGET_MB=str(budget_mb),
        MLXQ_POOL_COOLDOWN_S="0",  # a model the budget did not hold would be evicted at once
        MLXQ_POOL_STABLE_S="1",
        MLXQ_DRAIN_TIMEOUT_S="5",
        MLXQ_QUEUE_TIMEOUT_S=str(LOAD_S),
        **env,
    )
    client = openai.OpenAI(
        base_url=f"{api_url}/v1", api_key="unused", max_retries=0, timeout=LOAD_S
    )
    served = Pool(stack, folder, budget_mb * MIB, client)
    redis, keys = stack.redis(), stack.keys
    wait_until(lambda: pools.read_reports(redis, keys, stack.heartbeat_s), 60, "the pool's report")
    yield served
    agent.terminate()  # its workers drain; the session's next modules see no pool
    agent.wait(timeout=60)
    stack.pools.remove(agent)
    wait_until(
        lambda: not pools.read_reports(redis, keys, stack.heartbeat_s), 30, "its report to lapse"
    )


def mlx_lm_greedy(folder: Path, cases: list[dict[str, Any]]) -> list[Answer]:
    """Plain mlx-lm on `folder`: each prompt's tokens as the worker makes them (the chat
    template with its generation prompt, or the text encoded), then stream_generate's greedy
    tokens (no sampler: argmax) to an eos token or TOKENS. Counted as the API counts them, an
    eos token that ends the answer included (docs/api.md, "Usage"); the text decoded whole
    (stream_generate's own drops the space a completion's first token starts with)."""
    model, tokenizer = mlx_lm.load(str(folder))
    answers = []
    for case in cases:
        if "messages" in case:
            prompt = tokenizer.apply_chat_template(case["messages"], add_generation_prompt=True)
        else:
            prompt = tokenizer.encode(case["prompt"])
        steps = list(stream_generate(model, tokenizer, mx.array(prompt), max_tokens=TOKENS))
        finish = steps[-1].finish_reason
        # Its last step repeats the eos token that ended it, which no text shows.
        tokens = [s.token for s in steps[:-1]] if finish == "stop" else [s.token for s in steps]
        answers.append(Answer(len(steps), tokenizer.decode(tokens), str(finish)))
    return answers


def served_greedy(client: openai.OpenAI, model: str, case: dict[str, Any]) -> Answer:
    """The same through the API, at temperature 0."""
    if "messages" in case:
        chat = client.chat.completions.create(
            model=model, messages=case["messages"], max_tokens=TOKENS, temperature=0
        )
        text, finish, usage = (
            chat.choices[0].message.content or "",
            chat.choices[0].finish_reason,
            chat.usage,
        )
    else:
        done = client.completions.create(
            model=model, prompt=case["prompt"], max_tokens=TOKENS, temperature=0
        )
        text, finish, usage = done.choices[0].text, done.choices[0].finish_reason, done.usage
    assert usage is not None
    return Answer(usage.completion_tokens, text, finish)


def test_a_4_bit_and_an_8_bit_model_answer_through_the_pool_as_mlx_lm_does(pool: Pool) -> None:
    listed = {m.id: m.model_extra or {} for m in pool.client.models.list().data}
    for bits in BITS:
        assert listed[CHAT[bits]]["kind"] == "chat"
        assert listed[CHAT[bits]]["status"]["value"] == "not_loaded"
        config = json.loads((pool.folder / CHAT[bits] / "config.json").read_text())
        assert config["quantization"]["bits"] == bits  # mlx-lm's quantized layers, not float32
    # The API's answers (the loads, in the pool's worker processes) while mlx-lm runs here.
    with ThreadPoolExecutor(1) as api:
        served = api.submit(
            lambda: {
                bits: [served_greedy(pool.client, CHAT[bits], c) for c in PROMPTS] for bits in BITS
            }
        )
        expected = {bits: mlx_lm_greedy(pool.folder / CHAT[bits], PROMPTS) for bits in BITS}
        answers = served.result(timeout=2 * LOAD_S)
    for bits in BITS:
        assert answers[bits] == expected[bits], f"{bits} bits"
    assert answers[4] != answers[8]  # two models, not one served twice
    listed = {m.id: m.model_extra or {} for m in pool.client.models.list().data}
    assert {bits: listed[CHAT[bits]]["status"]["value"] for bits in BITS} == {
        4: "loaded",
        8: "loaded",
    }
    # The pool counts the quantized weights it loaded: fewer bytes at fewer bits.
    report = pool.report()
    entries = {bits: report.entry(CHAT[bits]) for bits in BITS}
    weights = {bits: e.cost.weight_bytes for bits, e in entries.items() if e is not None}
    assert weights[4] < weights[8]


def test_a_chat_model_and_an_embedding_model_of_another_family_are_held_side_by_side(
    pool: Pool,
) -> None:
    families = {
        name: json.loads((pool.folder / name / "config.json").read_text())["model_type"]
        for name in (CHAT[4], EMBEDDER)
    }
    assert families == {CHAT[4]: "llama", EMBEDDER: "bert"}
    chat = pool.client.chat.completions.create(
        model=CHAT[4], messages=[{"role": "user", "content": "Say hi"}], max_tokens=4
    )
    assert chat.choices[0].message.content
    holders = pool.loaded_with(CHAT[4])
    vectors = pool.client.embeddings.create(model=EMBEDDER, input=["a cat", "a dog"])
    assert [len(v.embedding) for v in vectors.data] == [384, 384]
    chat = pool.client.chat.completions.create(
        model=CHAT[4], messages=[{"role": "user", "content": "Say hi"}], max_tokens=4
    )
    assert chat.choices[0].message.content
    now = pool.loaded_with(EMBEDDER)
    # Both held at once, each by one worker, and what was held before by the same workers.
    assert [len(now.get(m, [])) for m in (CHAT[4], EMBEDDER)] == [1, 1], now
    assert holders.items() <= now.items(), (holders, now)
    report = pool.report()
    assert (report.evictions, report.unloads) == (0, 0)
    assert not [e for e in report.events if e.what in ("evict", "unload")]
    assert report.used_bytes <= report.budget_bytes == pool.budget_bytes
    listed = {m.id: m.model_extra or {} for m in pool.client.models.list().data}
    assert {name: listed[name]["status"]["value"] for name in (CHAT[4], EMBEDDER)} == {
        CHAT[4]: "loaded",
        EMBEDDER: "loaded",
    }
    assert listed[EMBEDDER]["kind"] == "embedding"
