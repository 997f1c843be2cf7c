"""Samplers: one per sequence, so each job keeps its own temperature, top_p, top_k, min_p and seed.

A sampler takes a step's raw logits (worker/engine/batch/mlx_lm_decode.py): argmax and categorical
sampling need
no normalisation, top-p normalises for itself. Greedy sequences share one sampler object, which
lets the batch sample them in one call.
A seeded sampler draws from its own PRNG key, so a seed gives the same output whatever else
runs in the batch; an unseeded one draws from MLX's global generator.
"""

from __future__ import annotations

from collections.abc import Callable

import mlx.core as mx
from mlx_lm.sample_utils import apply_min_p, apply_top_k, apply_top_p

from shared.wire.generation.sampling import SamplingParams

Sampler = Callable[[mx.array], mx.array]


def greedy(logits: mx.array) -> mx.array:
    return mx.argmax(logits, axis=-1)


def make_sampler(params: SamplingParams) -> Sampler:
    if params.temperature == 0:
        return greedy
    inverse_temperature = 1.0 / params.temperature
    top_p, top_k, min_p = params.top_p, params.top_k, params.min_p
    # OpenAI takes any 64-bit seed; MLX keys take unsigned ones: the same 64 bits, unsigned.
    key = mx.random.key(params.seed % 2**64) if params.seed is not None else None

    def sample(logits: mx.array) -> mx.array:
        nonlocal key
        # top-k and min-p compare logits with each other: a shift (normalisation) changes nothing.
        if 0 < top_k < logits.shape[-1]:
            logits = apply_top_k(logits, top_k)
        if min_p > 0:
            logits = apply_min_p(logits, min_p)
        if top_p < 1.0:
            logits = apply_top_p(logits - mx.logsumexp(logits, axis=-1, keepdims=True), top_p)
        if key is None:
            return mx.random.categorical(logits * inverse_temperature)
        key, draw = mx.random.split(key)
        return mx.random.categorical(logits * inverse_temperature, key=draw)

    return sample
