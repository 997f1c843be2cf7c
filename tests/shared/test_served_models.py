"""What `mlxq run` serves: the chat model and, beside it, the embedding model, unless told."""

from __future__ import annotations

from shared.queue.config import Settings


def test_mlxq_run_serves_the_embedding_model_beside_the_chat_model_by_default() -> None:
    assert Settings(model="chat").served_models() == ["chat", "all-MiniLM-L6-v2"]


def test_an_empty_embedding_model_serves_the_chat_model_alone() -> None:
    assert Settings(model="chat", embedding_model="").served_models() == ["chat"]


def test_mlxq_models_names_every_model_served() -> None:
    assert Settings(models=("a", "b")).served_models() == ["a", "b"]
