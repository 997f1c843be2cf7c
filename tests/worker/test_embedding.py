"""The embedding engine on the real all-MiniLM-L6-v2: jobs batched together, padding that
changes nothing, inputs it refuses, and the pooling a model's config asks for."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from shared.queue.config import Settings
from shared.queue.jobs import EmbeddingJob
from shared.wire.errors import InvalidRequestError, ModelImportError
from worker.engine.embedding.download import ensure_default_embedder
from worker.engine.embedding.encoder import Encoder, _pooling, load_encoder
from worker.engine.embedding.engine import EmbeddingEngine, EmbeddingOutput

REFERENCE = json.loads((Path(__file__).parents[1] / "data" / "minilm_reference.json").read_text())


@pytest.fixture(scope="module")
def encoder() -> Encoder:
    return load_encoder(ensure_default_embedder(Settings().models_dir))


def job(job_id: str, inputs: list[str | list[int]]) -> EmbeddingJob:
    return EmbeddingJob(job_id=job_id, model="all-MiniLM-L6-v2", inputs=inputs)


def as_array(out: EmbeddingOutput) -> np.ndarray:
    return np.frombuffer(out.vector, dtype="<f4")


def test_the_inputs_of_several_jobs_share_one_forward(encoder: Encoder) -> None:
    engine = EmbeddingEngine(encoder, max_inputs=16)
    engine.insert(engine.prepare(job("a", ["first job", "its second input"])))
    engine.insert(engine.prepare(job("b", ["another job", "with", "three inputs"])))
    outputs = engine.step()
    assert sorted((o.job_id, o.index) for o in outputs) == [
        ("a", 0), ("a", 1), ("b", 0), ("b", 1), ("b", 2),
    ]  # fmt: skip
    assert {o.job_id for o in outputs if o.ends_job} == {"a", "b"}
    assert engine.queued == 0 and engine.step() == []


def test_a_vector_does_not_depend_on_what_it_was_batched_with(encoder: Encoder) -> None:
    """Padding to a much longer neighbour is masked out of attention and pooling."""
    engine = EmbeddingEngine(encoder, max_inputs=16)
    engine.insert(engine.prepare(job("short", ["A man is eating food."])))
    alone = as_array(engine.step()[0])
    long = " ".join(["a much longer sentence that pads its short neighbour"] * 8)
    engine.insert(engine.prepare(job("mixed", [long, "A man is eating food."])))
    batched = next(as_array(o) for o in engine.step() if o.index == 1)
    assert np.abs(alone - batched).max() < 1e-5
    assert np.abs(alone - np.array(REFERENCE["vectors"][0])).max() < 1e-5


def test_a_forward_holds_at_most_max_inputs_and_max_tokens(encoder: Encoder) -> None:
    engine = EmbeddingEngine(encoder, max_inputs=3, max_tokens=512)
    engine.insert(engine.prepare(job("j", [f"input number {i}" for i in range(7)])))
    sizes = [len(engine.step()) for _ in range(3)]
    assert sizes == [3, 3, 1]
    wide = " ".join(["word"] * 200)  # 202 tokens: two of them fill the 512-token budget
    engine.insert(engine.prepare(job("w", [wide, wide, wide])))
    assert [len(engine.step()) for _ in range(2)] == [2, 1]


def test_removing_a_job_drops_its_queued_inputs(encoder: Encoder) -> None:
    engine = EmbeddingEngine(encoder, max_inputs=2)
    engine.insert(engine.prepare(job("gone", ["one", "two", "three", "four"])))
    engine.insert(engine.prepare(job("kept", ["five"])))
    engine.step()
    engine.remove(["gone"])
    assert [(o.job_id, o.ends_job) for o in engine.step()] == [("kept", True)]


def test_an_input_longer_than_the_model_positions_is_refused_naming_input(
    encoder: Encoder,
) -> None:
    engine = EmbeddingEngine(encoder, max_inputs=4)
    with pytest.raises(InvalidRequestError, match="Input 1 is 602 tokens") as caught:
        engine.prepare(job("long", ["fine", "word " * 600]))
    assert caught.value.param == "input"
    assert caught.value.code == "context_length_exceeded"


def test_a_token_id_outside_the_vocabulary_is_refused(encoder: Encoder) -> None:
    engine = EmbeddingEngine(encoder, max_inputs=4)
    with pytest.raises(InvalidRequestError, match="token id 30522") as caught:
        engine.prepare(job("ids", [[101, 30522]]))
    assert caught.value.param == "input"


def test_token_ids_are_framed_with_cls_and_sep_once(encoder: Encoder) -> None:
    text_ids = encoder.tokenize(["hello there"])[0]
    assert encoder.framed(text_ids[1:-1]) == text_ids
    assert encoder.framed(text_ids) == text_ids


def test_pooling_follows_the_model_config() -> None:
    assert _pooling({"pooling_mode_mean_tokens": True, "pooling_mode_cls_token": False}) == "mean"
    assert _pooling({"pooling_mode_cls_token": True}) == "cls"
    with pytest.raises(ModelImportError, match="max_tokens"):
        _pooling({"pooling_mode_max_tokens": True})
