"""Products of a few rows (worker/engine/cpu/matvec.py): the native module builds against the
installed MLX and gives MLX's product for 1 to 8 rows, whatever the weight's shape; a model
routes inputs of up to 6 rows to it and larger ones to MLX's matmul; only the model it was
attached to does (another model keeps MLX's matmul); the real default model generates the same
greedy tokens either way; and a module that cannot be built leaves the model on MLX's matmul."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from mlx_lm.generate import generate_step

from shared.queue.config import Settings
from tests.support import MODEL
from worker.engine.cpu import matvec
from worker.engine.model import LoadedModel, load_model
from worker.engine.sequence.sampling import greedy

NATIVE = matvec.folder(Settings().models_dir)


@pytest.mark.parametrize("out", [1536, 1537])  # the kernel takes the weight's rows in fours
@pytest.mark.parametrize("width", [576, 37])  # in eights (one vector each), or not
@pytest.mark.parametrize("rows", [1, 2, 5, 8])
def test_a_product_of_a_few_rows_equals_mlx_s_matmul(rows: int, width: int, out: int) -> None:
    native = matvec.load(NATIVE)
    assert native is not None
    mx.random.seed(7)
    x, weight = mx.random.normal((rows, 1, width)), mx.random.normal((out, width))
    ours, theirs = native.matvec(x, weight), x @ weight.T
    assert ours.shape == theirs.shape
    assert np.allclose(np.array(ours), np.array(theirs), atol=1e-4)


def test_a_product_of_more_than_eight_rows_is_refused_by_the_module() -> None:
    native = matvec.load(NATIVE)
    assert native is not None
    with pytest.raises(ValueError, match="1 to 8 float32 rows"):
        native.matvec(mx.zeros((9, 8)), mx.zeros((4, 8)))


class Counting:
    """The native module, counting the products it is given."""

    def __init__(self, native: Any):
        self.native = native
        self.calls = 0

    def matvec(self, row: mx.array, weight: mx.array) -> mx.array:
        self.calls += 1
        out: mx.array = self.native.matvec(row, weight)
        return out


def test_a_model_routes_up_to_six_rows_to_the_module_and_more_to_mlx(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    model = nn.Sequential(nn.Linear(16, 32, bias=False), nn.Linear(32, 8))
    model.layers.append(nn.Embedding(24, 8))
    assert matvec.attach(model, NATIVE) == 2
    counting = Counting(matvec._native)
    monkeypatch.setattr(matvec, "_native", counting)
    linear, biased, embedding = model.layers
    plain = nn.Linear(32, 8)
    plain.update(biased.parameters())
    x = mx.random.normal((1, 1, 32))
    assert np.allclose(np.array(biased(x)), np.array(plain(x)), atol=1e-5)
    assert embedding.as_linear(mx.ones((1, 8))).shape == (1, 24)
    linear(mx.ones((6, 16)))
    assert counting.calls == 3
    linear(mx.ones((7, 16)))
    embedding.as_linear(mx.ones((1, 7, 8)))
    assert counting.calls == 3


@pytest.fixture(scope="module")
def loaded() -> LoadedModel:
    return load_model(str(Settings().models_dir / MODEL), native=NATIVE)


def _greedy(loaded: LoadedModel, prompt: list[int], tokens: int) -> list[int]:
    steps = generate_step(mx.array(prompt), loaded.model, max_tokens=tokens, sampler=greedy)
    return [int(t) for t, _ in steps]


def test_the_default_model_generates_the_same_greedy_tokens_with_the_module(
    loaded: LoadedModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    layers = [m for _, m in loaded.model.named_modules() if isinstance(m, nn.Linear)]
    assert layers and all(type(m) is matvec.FewRowsLinear for m in layers)
    prompt = loaded.tokenizer.apply_chat_template(
        [{"role": "user", "content": "Name three rivers of Europe."}], add_generation_prompt=True
    )
    ours = _greedy(loaded, prompt, 12)
    plain = load_model(str(Settings().models_dir / MODEL))
    counting = Counting(matvec._native)
    monkeypatch.setattr(matvec, "_native", counting)
    assert _greedy(plain, prompt, 12) == ours
    assert counting.calls == 0  # the routing is the model's it was attached to, no other's


def test_a_module_that_does_not_build_leaves_the_model_on_mlx_s_matmul(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    broken = tmp_path / "matvec.cpp"
    broken.write_text("this is not C++\n")
    monkeypatch.setattr(matvec, "SOURCE", broken)
    monkeypatch.setattr(matvec, "_native", None)
    model = nn.Sequential(nn.Linear(16, 32))
    assert matvec.attach(model, tmp_path / "native") == 0
    assert type(model.layers[0]) is nn.Linear
    assert "keep MLX's matmul" in caplog.text


def test_a_failed_attention_check_keeps_the_native_products(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The module's two kernels are checked apart: an attention that differs from the pure-MLX
    one is not used, and the few-row products still are."""

    def differs(module: Any) -> None:
        raise RuntimeError("its decode attention differs from the pure-MLX attention")

    monkeypatch.setattr(matvec, "_check_attention", differs)
    monkeypatch.setattr(matvec, "_attention_ok", None)
    assert matvec.attention(NATIVE) is None
    assert matvec.native(NATIVE) is not None
