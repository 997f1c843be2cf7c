"""A machine's catalog and each model's cost, read from its files before it loads
(worker/pool/catalog.py): the default model under other names (links), the embedding model,
MLXQ_CATALOG's options, folders that hold no model, and hub ids the hub cache holds."""

from __future__ import annotations

from pathlib import Path

import pytest

from shared.queue.config import Settings
from shared.wire.fleet.keep_alive import FOREVER
from shared.wire.fleet.pool import MIB
from worker.engine.embedding.download import DEFAULT_EMBEDDER_NAME, ensure_default_embedder
from worker.gguf.default_model import default_model_dtype, ensure_default_model
from worker.pool.catalog import read_catalog
from worker.runtime.serve import resolve_model

# SmolLM2-135M: 30 layers x 3 KV heads x 64 wide x keys and values, in float32 where MLX runs
# on the CPU (its weights' dtype there: worker/gguf/default_model.py).
SMOLLM2_KV_ELEMENTS = 30 * 3 * 64 * 2


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A models folder: the default model as `alpha` and `beta` (links), the embedding model,
    an empty folder and a hidden one."""
    real = Settings().models_dir
    folder = tmp_path_factory.mktemp("models")
    chat = ensure_default_model(real)
    (folder / "alpha").symlink_to(chat)
    (folder / "beta").symlink_to(chat)
    (folder / DEFAULT_EMBEDDER_NAME).symlink_to(ensure_default_embedder(real))
    (folder / "empty").mkdir()
    (folder / ".native").mkdir()
    return folder


def test_the_catalog_is_every_model_folder_with_its_kind(models: Path) -> None:
    found = read_catalog(Settings(models_dir=models))
    assert {name: f.entry.kind for name, f in found.items()} == {
        "alpha": "chat",
        "beta": "chat",
        DEFAULT_EMBEDDER_NAME: "embedding",
    }


def test_a_models_cost_is_its_weights_kv_budget_a_prefix_cache_of_a_window_at_least_and_headroom(
    models: Path,
) -> None:
    settings = Settings(
        models_dir=models, pool_kv_tokens=1024, prefix_cache_mb=64, pool_headroom_mb=100
    )
    cost = read_catalog(settings)["alpha"].entry.cost
    weights = (models / "alpha" / "model.safetensors").stat().st_size
    per_token = SMOLLM2_KV_ELEMENTS * (4 if default_model_dtype() == "float32" else 2)
    assert cost.weight_bytes == weights
    assert cost.kv_bytes_per_token == per_token
    assert cost.kv_bytes == per_token * 1024
    assert cost.prefix_cache_bytes == per_token * 8192  # 64 MiB raised to one whole window
    assert cost.total_bytes == weights + per_token * 1024 + per_token * 8192 + 100 * MIB
    roomy = read_catalog(settings.model_copy(update={"prefix_cache_mb": 1024}))["alpha"]
    assert roomy.entry.cost.prefix_cache_bytes == 1024 * MIB


def test_by_default_a_model_gets_32_rows_and_a_fifth_of_the_budget_as_kv_positions(
    models: Path,
) -> None:
    settings = Settings(models_dir=models, pool_budget_mb=10_000)
    cost = read_catalog(settings)["alpha"].entry.cost
    assert cost.rows == 32
    assert cost.kv_tokens == (2_000 * MIB) // cost.kv_bytes_per_token  # a fifth of 10,000 MiB
    one = read_catalog(settings.model_copy(update={"pool_rows": 1}))["alpha"].entry.cost
    assert one.kv_tokens == 8192  # at most its window for each row: SmolLM2's 8,192
    small = read_catalog(settings.model_copy(update={"pool_budget_mb": 100}))["alpha"].entry.cost
    assert small.kv_tokens == 4096  # at least 4,096 positions, however small the machine


def test_catalog_options_fix_rows_kv_keep_alive_and_pins_per_model(models: Path) -> None:
    settings = Settings(models_dir=models, catalog=("alpha:rows=2:kv=20000:keep_alive=-1:pin",))
    found = read_catalog(settings)
    alpha, beta = found["alpha"].entry, found["beta"].entry
    assert (alpha.cost.rows, alpha.cost.kv_tokens) == (2, 20000)
    assert (alpha.keep_alive_s, alpha.pinned) == (FOREVER, True)
    assert (beta.cost.rows, beta.keep_alive_s, beta.pinned) == (32, 300.0, False)


def test_an_embedding_model_costs_no_kv_and_no_prefix_cache(models: Path) -> None:
    cost = read_catalog(Settings(models_dir=models))[DEFAULT_EMBEDDER_NAME].entry.cost
    assert (cost.kv_bytes, cost.prefix_cache_bytes) == (0, 0)
    assert cost.weight_bytes > 80 * MIB


def test_a_listed_folder_outside_the_models_folder_joins_by_the_name_its_worker_serves(
    models: Path, tmp_path: Path
) -> None:
    outside = tmp_path / "gamma"
    outside.symlink_to(models / "alpha")
    settings = Settings(models_dir=models, catalog=(str(outside),), catalog_scan=False)
    # worker/runtime/serve.py resolve_model: a folder serves under its resolved name
    assert list(read_catalog(settings)) == [outside.resolve().name]


def test_a_hub_id_the_hub_cache_holds_joins_by_its_id_and_its_worker_loads_it_from_there(
    models: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import huggingface_hub.constants

    repo = tmp_path / "hub" / "models--mlxq-tests--smol"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("0" * 40)
    (repo / "snapshots").mkdir()
    (repo / "snapshots" / ("0" * 40)).symlink_to(models / "alpha")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    settings = Settings(
        models_dir=models, catalog=("mlxq-tests/smol", "mlxq-tests/absent"), catalog_scan=False
    )
    found = read_catalog(settings)
    assert list(found) == ["mlxq-tests/smol"]  # what the hub cache lacks is left out
    assert found["mlxq-tests/smol"].source == "mlxq-tests/smol"
    weights = (models / "alpha" / "model.safetensors").stat().st_size
    assert found["mlxq-tests/smol"].entry.cost.weight_bytes == weights
    # worker/runtime/serve.py: served under its id, loaded from the cache's folder
    served = resolve_model(Settings(models_dir=models, model="mlxq-tests/smol"))
    assert served == ("mlxq-tests/smol", str(repo / "snapshots" / ("0" * 40)))
