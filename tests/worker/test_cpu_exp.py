"""The CPU's exponentials (worker/engine/cpu/exponentials.py) compute what MLX computes: its
attention for every kind of mask mlx-lm passes and its SiLU, for a prompt chunk (NumPy) and a
decode forward (the compiled polynomial); a decode forward never waits on NumPy. They are
hooked onto the model they were attached to and nothing else: its layers call them, by the
routes that model was given, compiled or not; MLX, mlx-lm and any other model (plain
`mlx_lm.load`'s included) keep MLX's own functions; the hook goes with the model. The real
default model generates the same greedy tokens with them as without them."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Callable
from typing import Any

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm import load
from mlx_lm.generate import generate_step
from mlx_lm.models import activations, base, llama

from shared.queue.config import Settings
from tests.support import MODEL
from tests.worker.tiny_models import TINY_LLAMA, tiny_model
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
    theirs = mx.fast.scaled_dot_product_attention(q, k, v, scale=0.25, mask=mask)
    ours = cpu_exp.attention(q, k, v, scale=0.25, mask=mask)
    assert ours.shape == theirs.shape
    assert np.allclose(np.array(ours), np.array(theirs), atol=1e-5), kind


@pytest.mark.parametrize("length", LENGTHS)
def test_swiglu_equals_mlx_s(length: int) -> None:
    mx.random.seed(5)
    gate, x = mx.random.normal((2, length, 24)) * 30, mx.random.normal((2, length, 24))
    ours, theirs = cpu_exp.swiglu(gate, x), activations.swiglu(gate, x)
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


class Calls:
    """The worker's exponentials, counting the positions of each call that reaches them."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch):
        self.positions: list[int] = []
        for name in ("attention", "swiglu"):
            monkeypatch.setattr(cpu_exp, name, self._counted(getattr(cpu_exp, name)))

    def _counted(self, function: Callable[..., mx.array]) -> Callable[..., mx.array]:
        def counted(first: mx.array, *args: Any, **kwargs: Any) -> mx.array:
            # (rows, heads, positions, dim) queries or (rows, positions, width) gates
            self.positions.append(first.shape[-2])
            return function(first, *args, **kwargs)

        return counted


def _tiny(routes: cpu_exp.Routes | None) -> Any:
    """A tiny llama (tests/worker/tiny_models.py, seed 7), hooked with `routes` unless None."""
    model = tiny_model(TINY_LLAMA)
    if routes is not None:
        assert cpu_exp.attach(model, routes) == 4  # each block's attention and MLP
    return model


CHUNK = mx.arange(LENGTH)[None] % 64  # a prompt chunk: NumPy's route
STEP = mx.array([[5]])  # one position: the polynomial's route


def test_a_hooked_model_s_layers_call_the_worker_s_exponentials(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    model = _tiny(cpu_exp.BOTH)
    calls = Calls(monkeypatch)
    mx.eval(model(CHUNK), model(STEP))
    assert calls.positions == [LENGTH] * 4 + [1] * 4
    assert {cpu_exp.routes_of(block.self_attn) for block in model.layers} == {cpu_exp.BOTH}


def test_each_model_follows_its_own_routes(monkeypatch: pytest.MonkeyPatch) -> None:
    prompts_only = _tiny(cpu_exp.Routes(prefill=True, decode=False))
    decode_only = _tiny(cpu_exp.Routes(prefill=False, decode=True))
    calls = Calls(monkeypatch)
    mx.eval(prompts_only(CHUNK), prompts_only(STEP))
    assert calls.positions == [LENGTH] * 4
    calls.positions.clear()
    mx.eval(decode_only(CHUNK), decode_only(STEP))
    assert calls.positions == [1] * 4


def test_mlx_mlx_lm_and_other_models_keep_mlx_s_own_functions(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    hooked = _tiny(cpu_exp.BOTH)
    plain = _tiny(None)
    calls = Calls(monkeypatch)
    mx.eval(plain(CHUNK), plain(STEP))
    assert calls.positions == []
    assert type(mx.fast.scaled_dot_product_attention).__name__ == "nb_func"  # MLX's C++ binding
    assert llama.scaled_dot_product_attention is base.scaled_dot_product_attention
    assert llama.swiglu is activations.swiglu
    assert type(plain.layers[0].self_attn) is llama.Attention
    assert isinstance(hooked.layers[0].self_attn, llama.Attention)
    assert type(hooked.layers[0].self_attn) is not llama.Attention


def test_the_hook_goes_with_its_model() -> None:
    model = _tiny(cpu_exp.BOTH)
    routed = weakref.ref(type(model.layers[0].self_attn))
    exponentials = weakref.ref(type(model.layers[0].mlp).cpu_exponentials)
    del model
    gc.collect()
    assert routed() is None
    assert exponentials() is None


def test_a_compiled_forward_of_a_hooked_model_runs_the_worker_s_exponentials(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    model = _tiny(cpu_exp.BOTH)
    calls = Calls(monkeypatch)
    compiled = mx.compile(model)
    ours = compiled(STEP)
    assert calls.positions == [1] * 4  # traced through the hooked layers
    assert np.allclose(np.array(ours), np.array(_tiny(None)(STEP)), atol=1e-5)


@pytest.fixture(scope="module")
def loaded() -> LoadedModel:
    return load_model(str(Settings().models_dir / MODEL))


def _greedy(model: Any, prompt: list[int], tokens: int) -> list[int]:
    steps = generate_step(mx.array(prompt), model, max_tokens=tokens, sampler=greedy)
    return [int(t) for t, _ in steps]


def test_the_default_model_loads_hooked_and_generates_mlx_lm_s_greedy_tokens(
    loaded: LoadedModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocks = loaded.model.layers
    layers = [layer for block in blocks for layer in (block.self_attn, block.mlp)]
    assert [cpu_exp.routes_of(layer) for layer in layers] == [cpu_exp.BOTH] * len(layers)
    text = "The history of the printing press in Europe, told in plain words. "
    prompt = loaded.tokenizer.apply_chat_template(
        [{"role": "user", "content": text + "Summarise it."}], add_generation_prompt=True
    )
    assert len(prompt) >= cpu_exp.MIN_POSITIONS  # its prompt chunk takes NumPy's route
    calls = Calls(monkeypatch)
    ours = _greedy(loaded.model, prompt, 6)
    # generate_step prefills all but the prompt's last token, then decodes one at a time
    chunk, decode = calls.positions[: len(layers)], calls.positions[len(layers) :]
    assert chunk == [len(prompt) - 1] * len(layers)
    assert decode and set(decode) == {1} and len(decode) % len(layers) == 0
    plain, _ = load(str(Settings().models_dir / MODEL))
    assert _greedy(plain, prompt, 6) == ours
