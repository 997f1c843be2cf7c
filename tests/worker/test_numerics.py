"""The worker's numbers against plain mlx-lm's on the same weights, and its draws against the
distribution they come from, on the real default model.

The worker's side is the model as a worker loads it (`load_model`: on the CPU, its exponentials
and its one-row products, worker/engine/cpu/) run by the slot batch the engine runs, with the
log-probability recorder a request with `logprobs` gets. The reference is the same directory
loaded by plain `mlx_lm.load`, which runs MLX's own kernels (checked: the worker's fast paths
are hooked onto the worker's model only).

Measured on a 2-core x86_64 machine (AVX-512, OpenBLAS), float64 log-softmax of each side's
logits over the whole vocabulary (49,152): a 39-position prompt chunk (NumPy's exponentials)
differs by at most 5.2e-5, the decode steps (the polynomial exponentials, one-row products) by
at most 5.3e-5; the log-probabilities the recorder reports (float32, chosen token and the top
20) by at most 1.1e-4. The bound, `BOUND`, is 1e-3.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from mlx_lm import load
from mlx_lm.models import activations, base, llama
from mlx_lm.models.cache import make_prompt_cache

from shared.queue.config import Settings
from shared.wire.generation.logprobs import TokenLogprob
from shared.wire.generation.sampling import SamplingParams
from tests.support import MODEL
from worker.engine.batch.slot_batch import SlotBatch
from worker.engine.batch.token_batch import PREFILL_CHUNK
from worker.engine.batch.types import Entry
from worker.engine.cpu import exponentials as cpu_exp
from worker.engine.cpu import matvec
from worker.engine.model import LoadedModel, load_model, native_folder
from worker.engine.sequence.logprobs import LogprobRecorder
from worker.engine.sequence.sampling import greedy, make_sampler

BOUND = 1e-3  # max |log p(worker) - log p(mlx-lm)| over the vocabulary, at every position
STEPS = 8  # decode steps compared after the prompt
TOP = 20  # alternatives the recorder reports (the most OpenAI allows)
PATH = Settings().models_dir / MODEL


@pytest.fixture(scope="module")
def worker() -> LoadedModel:
    return load_model(str(PATH), native=native_folder(Settings().models_dir))


@pytest.fixture(scope="module")
def reference() -> Any:
    model, _ = load(str(PATH))
    return model


@pytest.fixture(scope="module")
def prompt(worker: LoadedModel) -> list[int]:
    message = {"role": "user", "content": "Write two sentences about the sea and the wind."}
    tokens: list[int] = worker.tokenizer.apply_chat_template([message], add_generation_prompt=True)
    return tokens


def _log_softmax(logits: mx.array) -> np.ndarray:
    """Log-probabilities over the last axis, in float64 (the comparison adds no error)."""
    x = np.array(logits.astype(mx.float32), dtype=np.float64)
    x -= x.max(axis=-1, keepdims=True)
    out: np.ndarray = x - np.log(np.exp(x).sum(axis=-1, keepdims=True))
    return out


class Recorded:
    """The worker's model, keeping each forward's logits: the slot batch never reads a prompt
    chunk's."""

    def __init__(self, model: Any):
        self.layers = model.layers
        self._model = model
        self.logits: list[mx.array] = []

    def __call__(self, inputs: mx.array, cache: Any) -> mx.array:
        out: mx.array = self._model(inputs, cache=cache)
        self.logits.append(out)
        return out


@dataclass(frozen=True)
class WorkerRun:
    chunk: np.ndarray  # log-probabilities after each prompt position but the last
    steps: list[np.ndarray]  # after the prompt, then after each generated token
    tokens: list[int]  # greedy
    reported: list[TokenLogprob]  # what the recorder reports for each token


@pytest.fixture(scope="module")
def ran(worker: LoadedModel, prompt: list[int]) -> WorkerRun:
    model = Recorded(worker.model)
    batch = SlotBatch(model, 1, frozenset(), PREFILL_CHUNK, keep_caches=False, positions=8192)
    recorder = LogprobRecorder(greedy, TOP, worker.token_piece)
    batch.insert([Entry(prompt, [], None, STEPS, recorder, [])])
    tokens: list[int] = []
    reported: list[TokenLogprob] = []
    while len(tokens) < STEPS:
        for token in batch.next(None):
            tokens.append(token.token)
            reported.append(recorder.take())  # as the engine does, reading each token
    chunk, *steps = model.logits  # one prefill forward (under PREFILL_CHUNK), then decode
    assert chunk.shape[1] == len(prompt) - 1 >= cpu_exp.MIN_POSITIONS  # NumPy's route
    assert len(steps) == STEPS and all(s.shape[1] == 1 for s in steps)
    return WorkerRun(
        _log_softmax(chunk[0]), [_log_softmax(s[0, -1]) for s in steps], tokens, reported
    )


@pytest.fixture(scope="module")
def expected(reference: Any, prompt: list[int], ran: WorkerRun) -> list[np.ndarray]:
    """Plain mlx-lm's log-probabilities after each prompt position, then after each of the
    worker's tokens, computed while the worker's exponentials refuse to run."""

    def refuse(*args: Any, **kwargs: Any) -> mx.array:
        raise AssertionError("the reference reached the worker's exponentials")

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(cpu_exp, "attention", refuse)
        patch.setattr(cpu_exp, "swiglu", refuse)
        cache = make_prompt_cache(reference)
        out = list(_log_softmax(reference(mx.array([prompt]), cache=cache)[0]))
        for token in ran.tokens[:-1]:
            out.append(_log_softmax(reference(mx.array([[token]]), cache=cache)[0, -1]))
    return out


def test_the_reference_runs_mlx_s_kernels_and_the_worker_its_fast_paths(
    worker: LoadedModel, reference: Any
) -> None:
    assert type(mx.fast.scaled_dot_product_attention).__name__ == "nb_func"  # MLX's C++ binding
    assert llama.scaled_dot_product_attention is base.scaled_dot_product_attention
    assert llama.swiglu is activations.swiglu
    for block in reference.layers:
        assert type(block.self_attn) is llama.Attention and type(block.mlp) is llama.MLP
        assert all(type(m) is nn.Linear for m in block.mlp.children().values())
    for block in worker.model.layers:
        assert cpu_exp.routes_of(block.self_attn) == cpu_exp.routes_of(block.mlp) == cpu_exp.BOTH
        assert all(type(m) is matvec.FewRowsLinear for m in block.mlp.children().values())


def test_a_prompt_chunk_s_log_probabilities_are_mlx_lm_s_over_the_whole_vocabulary(
    ran: WorkerRun, expected: list[np.ndarray]
) -> None:
    theirs = np.stack(expected[: len(ran.chunk)])
    assert np.abs(ran.chunk - theirs).max() < BOUND


def test_decode_steps_log_probabilities_are_mlx_lm_s_over_the_whole_vocabulary(
    ran: WorkerRun, expected: list[np.ndarray]
) -> None:
    theirs = expected[len(ran.chunk) :]
    assert len(theirs) == len(ran.steps) == STEPS
    for ours, their in zip(ran.steps, theirs, strict=True):
        assert np.abs(ours - their).max() < BOUND
    assert ran.tokens == [int(np.argmax(their)) for their in theirs]


def test_the_log_probabilities_a_request_gets_reported_are_mlx_lm_s(
    ran: WorkerRun, expected: list[np.ndarray]
) -> None:
    theirs = expected[len(ran.chunk) :]
    for token, entry, their in zip(ran.tokens, ran.reported, theirs, strict=True):
        assert abs(entry.logprob - their[token]) < BOUND
        ours = np.sort(np.array([top.logprob for top in entry.top_logprobs], np.float64))
        assert len(ours) == TOP
        assert np.abs(ours[::-1] - np.sort(their)[::-1][:TOP]).max() < BOUND


# The sampling test: N draws of one seeded temperature-1 sampler, one call per draw as a
# sequence makes them (each splits the sampler's key), binned into the BINS most likely tokens
# and the rest. Pearson's chi-square against softmax(logits) has BINS degrees of freedom
# (BINS + 1 bins, probabilities known): CRITICAL is its 0.99 quantile for 8. Measured: this
# seed's draws give 2.4; at temperature 0.9 they give 33.0, at 1.1 26.6 (1,000 draws take 2-4 s
# here: each draws 49,152 uniforms).
DRAWS = 1000
BINS = 8
CRITICAL = 20.090
SEED = 2


def _chi_square(observed: np.ndarray, expected: np.ndarray) -> float:
    return float(((observed - expected) ** 2 / expected).sum())


def test_temperature_1_draws_follow_the_softmax_of_the_logits(worker: LoadedModel) -> None:
    prompt = worker.tokenizer.encode("My favourite colour is")
    logits = worker.model(mx.array([prompt]))[:, -1, :]
    probabilities = np.exp(_log_softmax(logits[0]))
    likely = np.argsort(-probabilities)[:BINS]
    expected = np.append(probabilities[likely], 1 - probabilities[likely].sum()) * DRAWS
    assert expected.min() >= 5  # where the chi-square approximation holds
    sample = make_sampler(SamplingParams(temperature=1.0, seed=SEED))
    draws = [sample(logits) for _ in range(DRAWS)]
    mx.eval(draws)
    drawn = np.array(mx.concatenate(draws))
    observed = np.array([np.sum(drawn == token) for token in likely], dtype=np.float64)
    observed = np.append(observed, DRAWS - observed.sum())
    assert _chi_square(observed, expected) < CRITICAL
