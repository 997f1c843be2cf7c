"""The CPU prefill (worker/engine/cpu_prefill.py) computes what MLX computes: its attention for
every kind of mask mlx-lm passes, and its SiLU; short forwards stay on MLX's own functions; and
the real default model generates the same greedy tokens with it as without it."""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.generate import generate_step

from shared.queue.config import Settings
from tests.support import MODEL
from worker.engine import cpu_prefill
from worker.engine.model import LoadedModel, load_model
from worker.engine.sampling import greedy

LENGTH = 40  # query positions: past MIN_POSITIONS, so the NumPy path runs


def _qkv(length: int, positions: int, heads: int = 6, groups: int = 2) -> list[mx.array]:
    mx.random.seed(3)
    shapes = [(2, heads, length, 16), (2, groups, positions, 16), (2, groups, positions, 16)]
    return [mx.random.normal(s) for s in shapes]


def _masks(length: int, positions: int) -> dict[str, Any]:
    offsets = mx.array([positions - length, positions - length - 5])
    queries = offsets[:, None] + mx.arange(length)[None]
    rows = (mx.arange(positions)[None, None] <= queries[:, :, None])[:, None]
    return {
        "none": None,
        "causal": "causal",
        "boolean per row": rows,
        "additive": mx.where(rows, 0.0, -1e9),
    }


@pytest.mark.parametrize("kind", list(_masks(LENGTH, 64)))
@pytest.mark.parametrize("positions", [LENGTH, 64])
def test_attention_equals_mlx_s_for_every_mask_kind(kind: str, positions: int) -> None:
    q, k, v = _qkv(LENGTH, positions)
    mask = (
        _masks(LENGTH, positions)[kind] if positions > LENGTH or kind != "boolean per row" else None
    )
    theirs = cpu_prefill._mlx_attention(q, k, v, scale=0.25, mask=mask)
    ours = cpu_prefill.attention(q, k, v, scale=0.25, mask=mask)
    assert ours.shape == theirs.shape
    assert np.allclose(np.array(ours), np.array(theirs), atol=1e-5), kind


def test_swiglu_equals_mlx_s() -> None:
    mx.random.seed(5)
    gate, x = mx.random.normal((2, LENGTH, 24)) * 30, mx.random.normal((2, LENGTH, 24))
    ours, theirs = cpu_prefill.swiglu(gate, x), cpu_prefill._mlx_swiglu(gate, x)
    assert np.allclose(np.array(ours), np.array(theirs), rtol=1e-5, atol=1e-6)


def test_a_decode_forward_stays_on_mlx_s_own_functions(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a short forward reached NumPy")

    monkeypatch.setattr(np, "exp", refuse)
    q, k, v = _qkv(1, 64)
    cpu_prefill.attention(q, k, v, scale=0.25, mask=None)
    cpu_prefill.swiglu(mx.ones((4, 1, 24)), mx.ones((4, 1, 24)))
    with pytest.raises(AssertionError):
        cpu_prefill.swiglu(mx.ones((1, LENGTH, 24)), mx.ones((1, LENGTH, 24)))


@pytest.fixture(scope="module")
def loaded() -> LoadedModel:
    return load_model(str(Settings().models_dir / MODEL))


def _greedy(loaded: LoadedModel, prompt: list[int], tokens: int) -> list[int]:
    steps = generate_step(mx.array(prompt), loaded.model, max_tokens=tokens, sampler=greedy)
    return [int(t) for t, _ in steps]


def test_loading_a_model_on_the_cpu_installs_it_and_greedy_output_is_unchanged(
    loaded: LoadedModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    swaps = cpu_prefill.swaps(loaded.model)
    assert [getattr(owner, name) for owner, name, _, _ in swaps] == [s[3] for s in swaps]
    assert len(swaps) == 2  # the attention and the llama family's swiglu
    text = "The history of the printing press in Europe, told in plain words. "
    prompt = loaded.tokenizer.apply_chat_template(
        [{"role": "user", "content": text + "Summarise it."}], add_generation_prompt=True
    )
    ours = _greedy(loaded, prompt, 6)
    for owner, name, theirs, _ in swaps:
        monkeypatch.setattr(owner, name, theirs)
    assert _greedy(loaded, prompt, 6) == ours
