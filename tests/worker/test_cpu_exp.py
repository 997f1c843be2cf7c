"""The CPU's exponentials (worker/engine/cpu/exponentials.py) compute what MLX computes: its
attention
for every kind of mask mlx-lm passes and its SiLU, for a prompt chunk (NumPy) and a decode
forward (the compiled polynomial); a decode forward never waits on NumPy; and the real default
model generates the same greedy tokens with them as without them."""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.generate import generate_step

from shared.queue.config import Settings
from tests.support import MODEL
from worker.engine.cpu import exponentials as cpu_exp
from worker.engine.model import LoadedModel, load_model
from worker.engine.sequence.sampling import greedy

LENGTH = 40  # query positions: past MIN_POSITIONS, so the NumPy path runs
LENGTHS = [1, 4, LENGTH]  # decode forwards (the polynomial) and a prompt chunk (NumPy)


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
@pytest.mark.parametrize("length", LENGTHS)
def test_attention_equals_mlx_s_for_every_mask_kind(kind: str, positions: int, length: int) -> None:
    q, k, v = _qkv(length, positions)
    mask = (
        _masks(length, positions)[kind] if positions > length or kind != "boolean per row" else None
    )
    theirs = cpu_exp._mlx_attention(q, k, v, scale=0.25, mask=mask)
    ours = cpu_exp.attention(q, k, v, scale=0.25, mask=mask)
    assert ours.shape == theirs.shape
    assert np.allclose(np.array(ours), np.array(theirs), atol=1e-5), kind


@pytest.mark.parametrize("length", LENGTHS)
def test_swiglu_equals_mlx_s(length: int) -> None:
    mx.random.seed(5)
    gate, x = mx.random.normal((2, length, 24)) * 30, mx.random.normal((2, length, 24))
    ours, theirs = cpu_exp.swiglu(gate, x), cpu_exp._mlx_swiglu(gate, x)
    assert np.allclose(np.array(ours), np.array(theirs), rtol=1e-5, atol=1e-6)


def test_the_polynomial_exp_is_mlx_s_within_4e_6_and_0_below_float32_s_range() -> None:
    x = mx.concatenate([mx.linspace(-87, 88, 200_001), mx.array([-mx.inf, -200.0, -87.5])])
    ours, theirs = np.array(cpu_exp.poly_exp(x)), np.array(mx.exp(x))
    assert np.allclose(ours[:-3], theirs[:-3], rtol=4e-6, atol=0)
    assert ours[-3:].tolist() == [0.0, 0.0, 0.0]


def test_a_decode_forward_never_waits_on_numpy(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a short forward reached NumPy")

    monkeypatch.setattr(np, "array", refuse)
    q, k, v = _qkv(1, 64)
    mx.eval(cpu_exp.attention(q, k, v, scale=0.25, mask=None))
    mx.eval(cpu_exp.swiglu(mx.ones((4, 1, 24)), mx.ones((4, 1, 24))))
    with pytest.raises(AssertionError):
        cpu_exp.swiglu(mx.ones((1, LENGTH, 24)), mx.ones((1, LENGTH, 24)))


@pytest.fixture(scope="module")
def loaded() -> LoadedModel:
    return load_model(str(Settings().models_dir / MODEL))


def _greedy(loaded: LoadedModel, prompt: list[int], tokens: int) -> list[int]:
    steps = generate_step(mx.array(prompt), loaded.model, max_tokens=tokens, sampler=greedy)
    return [int(t) for t, _ in steps]


def test_loading_a_model_on_the_cpu_installs_it_and_greedy_output_is_unchanged(
    loaded: LoadedModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    swaps = cpu_exp.swaps(loaded.model)
    assert [getattr(owner, name) for owner, name, _, _ in swaps] == [s[3] for s in swaps]
    assert len(swaps) == 2  # the attention and the llama family's swiglu
    assert cpu_exp._routes == cpu_exp.Routes(prefill=True, decode=True)
    text = "The history of the printing press in Europe, told in plain words. "
    prompt = loaded.tokenizer.apply_chat_template(
        [{"role": "user", "content": text + "Summarise it."}], add_generation_prompt=True
    )
    ours = _greedy(loaded, prompt, 6)
    for owner, name, theirs, _ in swaps:
        monkeypatch.setattr(owner, name, theirs)
    assert _greedy(loaded, prompt, 6) == ours
