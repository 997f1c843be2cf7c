"""/v1/embeddings on the real stack: an embedding worker on all-MiniLM-L6-v2 beside the chat
worker, through the OpenAI SDK, plain HTTP and LangChain's OpenAIEmbeddings.

Correctness is measured against tests/data/minilm_reference.json, the vectors sentence-transformers
(torch, CPU) computes for the same sentences (tests/data/make_minilm_reference.py made it once).
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import openai
import pytest
from tokenizers import Tokenizer

from shared.queue.config import Settings
from tests.support import MODEL
from worker.engine.embedding.download import DEFAULT_EMBEDDER_NAME, ensure_default_embedder
from worker.ops.cluster import Cluster, Worker, wait_until

EMBEDDER = DEFAULT_EMBEDDER_NAME
REFERENCE = json.loads((Path(__file__).parents[1] / "data" / "minilm_reference.json").read_text())
# Stated tolerance against the reference: float32 on another backend, batched with padding.
MIN_COSINE = 0.9999
MAX_ABS_DIFF = 1e-4


@pytest.fixture(scope="module")
def embedder(stack: Cluster, client: openai.OpenAI) -> Iterator[Worker]:
    """An embedding worker beside the session's chat worker (the module's last test kills it)."""
    worker = stack.start_worker(MLXQ_MODEL=EMBEDDER, MLXQ_BATCH_SIZE="8")
    yield worker
    if worker in stack.workers:
        stack.kill_worker(worker)


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    """The model's own tokenizer, as shipped but for its padding and truncation to 128."""
    path = ensure_default_embedder(Settings().models_dir) / "tokenizer.json"
    loaded = Tokenizer.from_file(str(path))
    loaded.no_padding()
    loaded.no_truncation()
    return loaded


def vectors(response: Any) -> np.ndarray:
    return np.array([d.embedding for d in response.data], dtype=np.float64)


def assert_close_to_reference(got: np.ndarray) -> None:
    ref = np.array(REFERENCE["vectors"])
    cosine = (got * ref).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(ref, axis=1)
    assert cosine.min() >= MIN_COSINE
    assert np.abs(got - ref).max() <= MAX_ABS_DIFF


def post(api_url: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{api_url}/v1/embeddings", json=body, timeout=120)


def test_vectors_match_the_reference_implementation(
    client: openai.OpenAI, embedder: Worker, tokenizer: Tokenizer
) -> None:
    response = client.embeddings.create(model=EMBEDDER, input=REFERENCE["sentences"])
    got = vectors(response)
    assert got.shape == (8, 384)
    assert_close_to_reference(got)
    tokens = sum(len(e.ids) for e in tokenizer.encode_batch(REFERENCE["sentences"]))
    assert response.usage.prompt_tokens == response.usage.total_tokens == tokens
    assert response.model == EMBEDDER


def test_each_sentence_alone_gets_the_vector_it_gets_in_a_batch(
    client: openai.OpenAI, embedder: Worker
) -> None:
    def one(sentence: str) -> list[float]:
        return client.embeddings.create(model=EMBEDDER, input=sentence).data[0].embedding

    with ThreadPoolExecutor(8) as pool:  # sent together: the worker batches them
        alone = np.array(list(pool.map(one, REFERENCE["sentences"])))
    assert_close_to_reference(alone)


def test_paraphrases_are_closer_than_unrelated_sentences(
    client: openai.OpenAI, embedder: Worker
) -> None:
    texts = [
        "How do I reset my password?",
        "What are the steps to change my password?",
        "The weather in Lisbon is sunny today.",
    ]
    v = vectors(client.embeddings.create(model=EMBEDDER, input=texts))
    assert v[0] @ v[1] > 0.6
    assert v[0] @ v[1] > v[0] @ v[2] + 0.4


def test_float_and_base64_encodings_carry_the_same_float32_values(
    api_url: str, embedder: Worker
) -> None:
    body = {"model": EMBEDDER, "input": ["one sentence", "and another"]}
    floats = post(api_url, {**body, "encoding_format": "float"}).json()
    encoded = post(api_url, {**body, "encoding_format": "base64"}).json()
    assert floats["object"] == "list" and floats["data"][1]["object"] == "embedding"
    for f, b in zip(floats["data"], encoded["data"], strict=True):
        decoded = np.frombuffer(base64.b64decode(b["embedding"]), dtype="<f4")
        assert np.array_equal(decoded, np.array(f["embedding"], dtype=np.float32))
    assert floats["usage"] == encoded["usage"]


def test_token_ids_embed_as_the_text_they_encode(
    client: openai.OpenAI, embedder: Worker, tokenizer: Tokenizer
) -> None:
    texts = REFERENCE["sentences"][:3]
    ids = [tokenizer.encode(t, add_special_tokens=False).ids for t in texts]
    from_ids = vectors(client.embeddings.create(model=EMBEDDER, input=ids))
    from_text = vectors(client.embeddings.create(model=EMBEDDER, input=texts))
    assert np.abs(from_ids - from_text).max() <= MAX_ABS_DIFF
    single = vectors(client.embeddings.create(model=EMBEDDER, input=ids[0]))
    assert np.abs(single[0] - from_text[0]).max() <= MAX_ABS_DIFF


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"input": "hi", "dimensions": 128}, "dimensions"),
        ({"input": "hi", "temperature": 0.5}, "temperature"),
        ({"input": "word " * 600}, "input"),
        ({"input": [[1, 2, 50000]]}, "input"),
        ({"input": ["x"] * 2049}, "input"),
        ({"input": "hi", "encoding_format": "int8"}, "encoding_format"),
    ],
    ids=["dimensions", "unknown", "too-long", "out-of-vocabulary", "too-many", "encoding"],
)
def test_bad_input_is_a_400_naming_the_parameter(
    api_url: str, embedder: Worker, body: dict[str, Any], param: str
) -> None:
    response = post(api_url, {"model": EMBEDDER, **body})
    assert response.status_code == 400
    assert param in (response.json()["error"]["param"] or "")


def test_each_model_refuses_the_other_kind_of_request(
    client: openai.OpenAI, embedder: Worker
) -> None:
    with pytest.raises(openai.BadRequestError, match="chat model"):
        client.embeddings.create(model=MODEL, input="hello")
    with pytest.raises(openai.BadRequestError, match="embedding model"):
        client.chat.completions.create(
            model=EMBEDDER, messages=[{"role": "user", "content": "hi"}], max_tokens=4
        )
    # Neither refusal broke either worker.
    assert len(client.embeddings.create(model=EMBEDDER, input="still here").data) == 1


def test_the_model_is_listed_with_its_kind_and_in_the_fleet_view(
    client: openai.OpenAI, api_url: str, embedder: Worker
) -> None:
    # The page's playground offers the models whose kind is not "embedding" (playground.js).
    kinds = {m.id: (m.model_extra or {}).get("kind") for m in client.models.list()}
    assert kinds[EMBEDDER] == "embedding" and kinds[MODEL] == "chat"
    client.embeddings.create(model=EMBEDDER, input="counted")
    fleet = httpx.get(f"{api_url}/v1/fleet", timeout=30).json()
    assert EMBEDDER in json.dumps(fleet["workers"])
    metrics = httpx.get(f"{api_url}/metrics", timeout=30).text
    assert f'model_name="{EMBEDDER}"' in metrics


def test_an_embedding_job_is_never_placed_and_its_worker_publishes_no_prefix_blocks(
    stack: Cluster, client: openai.OpenAI, embedder: Worker
) -> None:
    """Placement (docs/architecture.md) is for generation jobs: a long input sent twice, which a
    chat model's worker would be placed for, leaves no placement and no block set behind."""
    long_input = " ".join(["the same long shared opening of a document"] * 40)
    for _ in range(2):
        assert len(client.embeddings.create(model=EMBEDDER, input=long_input).data) == 1
    redis, keys = stack.redis(), stack.keys
    assert not redis.exists(keys.prefix_blocks(embedder.worker_id))
    assert not redis.exists(keys.placement(EMBEDDER), keys.job_blocks(EMBEDDER))
    counted = {bytes(k).decode() for k in redis.hkeys(keys.model_metrics(EMBEDDER))}
    assert not {name for name in counted if name.startswith("placement_")}


def test_langchain_openai_embeddings_sending_text(api_url: str, embedder: Worker) -> None:
    from langchain_openai import OpenAIEmbeddings

    lc = OpenAIEmbeddings(
        model=EMBEDDER, base_url=f"{api_url}/v1", api_key="unused", check_embedding_ctx_length=False
    )
    assert_close_to_reference(np.array(lc.embed_documents(REFERENCE["sentences"])))
    query = np.array(lc.embed_query(REFERENCE["sentences"][0]))
    assert np.abs(query - np.array(REFERENCE["vectors"][0])).max() <= MAX_ABS_DIFF


class ModelTokenizerAsTiktoken:
    """What LangChain asks of a tiktoken encoding, answered with the served model's tokenizer:
    its default mode then sends token-id lists in that model's vocabulary."""

    def __init__(self, tokenizer: Tokenizer):
        self._tokenizer = tokenizer

    def encode_ordinary(self, text: str) -> list[int]:
        return list(self._tokenizer.encode(text, add_special_tokens=False).ids)

    def encode(self, text: str, **_: object) -> list[int]:
        return self.encode_ordinary(text)


def test_langchain_openai_embeddings_sending_token_ids(
    api_url: str, embedder: Worker, tokenizer: Tokenizer, monkeypatch: pytest.MonkeyPatch
) -> None:
    import langchain_openai.embeddings.base as lc_base

    sent: list[Any] = []
    encoding = ModelTokenizerAsTiktoken(tokenizer)
    monkeypatch.setattr(lc_base.tiktoken, "encoding_for_model", lambda _: encoding)
    with httpx.Client(event_hooks={"request": [lambda r: sent.append(r.read())]}) as http:
        lc = lc_base.OpenAIEmbeddings(
            model=EMBEDDER, base_url=f"{api_url}/v1", api_key="unused", http_client=http
        )
        assert_close_to_reference(np.array(lc.embed_documents(REFERENCE["sentences"])))
    body = json.loads(sent[0])
    assert all(isinstance(item, list) for item in body["input"])  # token ids, not text


def test_a_killed_embedding_worker_ends_its_request_with_an_error_soon(
    stack: Cluster, api_url: str, embedder: Worker
) -> None:
    """Runs last: it kills the module's embedding worker in the middle of a long job. Nothing
    waits for long: the request ends with an OpenAI error within seconds."""
    body = {"model": EMBEDDER, "input": [" ".join(["word"] * 300)] * 2048}
    taking = stack.keys.taking(embedder.worker_id)
    with ThreadPoolExecutor(1) as pool:
        reply = pool.submit(post, api_url, body)
        wait_until(lambda: bool(stack.redis().llen(taking)), 60, "the job to be taken")
        stack.kill_worker(embedder)
        killed = time.monotonic()
        response = reply.result(timeout=60)
    # Whoever sees the death first ends the request: a live worker's reaper (here the chat
    # worker's: `worker_lost`), or the API's job watch, the model having no worker left
    # (`model_not_found`).
    code = response.json()["error"]["code"]
    assert (response.status_code, code) in {(503, "worker_lost"), (404, "model_not_found")}
    assert time.monotonic() - killed < 30  # not the 120 s event timeout, on a busy machine
