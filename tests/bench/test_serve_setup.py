"""What `bench serve` prepares before it measures: the 32k-window copy of the model, the private
stack's environment (only what keeps it private differs from a user's), and long prompts that
are texts of their own, of the length their cell names."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.prompts import WORKLOADS, TextMaker
from bench.readme_stack import PRIVATE, private_models, stack_environment, window_copy
from shared.queue.config import Settings
from tests.support import MODEL


@pytest.fixture(scope="module")
def model_dir() -> Path:
    return Settings().models_dir / MODEL


def test_the_window_copy_says_32k_positions_and_links_the_same_weights(
    model_dir: Path, tmp_path: Path
) -> None:
    copy = window_copy(model_dir, tmp_path)
    config = json.loads((copy / "config.json").read_text())
    original = json.loads((model_dir / "config.json").read_text())
    assert config["max_position_embeddings"] == 32768
    assert {k: v for k, v in config.items() if k != "max_position_embeddings"} == {
        k: v for k, v in original.items() if k != "max_position_embeddings"
    }
    weights = copy / "model.safetensors"
    assert weights.resolve() == (model_dir / "model.safetensors").resolve()
    assert json.loads((model_dir / "config.json").read_text()) == original  # left as it was


def test_the_private_stack_differs_from_a_users_only_in_what_keeps_it_private(
    model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MLXQ_POOL_ROWS", "32")  # a setting of the caller's shell
    models = private_models(tmp_path, model_dir, Settings().models_dir)
    env = stack_environment(tmp_path, models, {})
    mlxq = {k for k in env if k.startswith("MLXQ_") or k == "REDIS_URL"}
    assert mlxq == set(PRIVATE)  # MLXQ_POOL_ROWS is not among them: the shipped default runs
    assert env["REDIS_URL"] != Settings.model_validate({}).redis_url
    assert env["MLXQ_API_BIND"] != Settings.model_validate({}).api_bind
    assert Path(env["MLXQ_PREFIX_CACHE_DIR"]).parent == tmp_path
    assert (models / MODEL).resolve() == model_dir.resolve()


def test_a_labelled_rows_settings_come_on_top_of_the_private_ones(
    model_dir: Path, tmp_path: Path
) -> None:
    models = private_models(tmp_path, model_dir, Settings().models_dir)
    env = stack_environment(tmp_path, models, {"MLXQ_KV_BITS": "8"})
    assert env["MLXQ_KV_BITS"] == "8"


@pytest.mark.parametrize("name", ["long16k", "long30k"])
def test_long_prompts_are_texts_of_their_own_of_the_cells_length(
    model_dir: Path, name: str
) -> None:
    workload = WORKLOADS[name]
    texts = TextMaker(model_dir)
    prompts = [workload.messages(texts, f"{name}/c4/r0/{c}", 0, [])[0]["content"] for c in range(2)]
    assert all(abs(texts.count(p) - workload.first_tokens) <= 16 for p in prompts)
    assert prompts[0][:200] != prompts[1][:200]
