"""Quantized KV (MLXQ_KV_BITS) against the model's dtype: accuracy, decode speed, KV memory.

`python -m bench kv` runs this module in a subprocess (OpenBLAS preloaded, as a worker runs);
`python -m bench.kv_quantization MODEL_DIR --measure ...` runs it directly. Models are loaded
as the worker loads them (worker/engine/model.py: on the CPU, its exponentials, its
quantized attention and its native module: `matvec` for a few rows, 8-bit KV's decode
attention).

- `accuracy`: for each model (MODEL_DIR, and tiny random-weight models of several families
  with 64-wide heads) and prompt length: 256 greedy tokens with the unquantized cache, then
  the same tokens fed to a quantized cache (teacher forcing). Per step, over the whole
  vocabulary, the largest and the mean absolute difference of the log-probabilities; greedy
  agreement is the share of steps whose quantized argmax is the unquantized token.
- `speed`: the slot batch (worker/engine/batch/slot_batch.py) of each KV form holding `batch`
  sequences of `context` tokens, all resident at once; decode steps timed in rounds that
  alternate the forms, so a noisy machine affects them alike; the median step per form.
- `memory`: per form, on its own: MLX's peak memory over weights while `batch` sequences of
  `context` tokens are prefilled and decode a few steps, and the KV buffers' bytes.
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, cast

import mlx.core as mx
from mlx_lm.utils import _get_classes

from bench.machine import describe
from bench.prompts import TextMaker
from bench.report import markdown_table, write
from shared.queue.config import Settings
from worker.engine.batch.quantized_kv import KVQuantization, prompt_cache
from worker.engine.batch.slot_batch import SlotBatch
from worker.engine.batch.types import Entry
from worker.engine.cpu import exponentials as cpu_exp
from worker.engine.cpu import matvec
from worker.engine.model import load_model
from worker.engine.sequence.sampling import greedy
from worker.gguf.default_model import ensure_default_model
from worker.ops.cluster import environment
from worker.runtime.blas import openblas_env

# The native module, as a worker has it (worker/engine/cpu/matvec.py): its products of a few
# rows, and 8-bit KV's decode attention.
NATIVE = matvec.folder(Settings().models_dir)
CHUNK = 512  # prompt tokens a prefill forward takes (the slot batch's chunk)
TINY_VOCAB = 4096
# Tiny random-weight models: 2 layers, 64-wide heads (the default model's), 4 query heads.
TINY: dict[str, dict[str, Any]] = {
    name: {
        "model_type": name,
        "hidden_size": 256,
        "num_hidden_layers": 2,
        "intermediate_size": 512,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "rms_norm_eps": 1e-5,
        "vocab_size": TINY_VOCAB,
        "max_position_embeddings": 16384,
        "rope_theta": 10000.0,
        "tie_word_embeddings": True,
        **extra,
    }
    for name, extra in {"llama": {}, "qwen2": {}, "qwen3": {"head_dim": 64}}.items()
}


def _forms(bits: list[int], group_size: int) -> dict[str, KVQuantization | None]:
    return {"float": None, **{f"{b}-bit": KVQuantization(b, group_size) for b in bits}}


def _prefilled(model: Any, prompt: list[int], kv: KVQuantization | None) -> list[Any]:
    cache = prompt_cache(model, kv)
    for start in range(0, len(prompt), CHUNK):
        model(mx.array([prompt[start : start + CHUNK]]), cache=cache)
        mx.eval([c.state for c in cache])
    return cache


def _logprobs(model: Any, token: int, cache: list[Any]) -> mx.array:
    logits: mx.array = model(mx.array([[token]]), cache=cache)[0, -1].astype(mx.float32)
    return logits - mx.logsumexp(logits)


def _argmax(logprobs: mx.array) -> int:
    return cast(int, mx.argmax(logprobs).item())


def reference(model: Any, prompt: list[int], tokens: int) -> tuple[list[int], list[mx.array]]:
    """`tokens` greedy steps after `prompt` with the unquantized cache: each step's input token
    and its log-probabilities over the vocabulary."""
    cache = _prefilled(model, prompt[:-1], None)
    inputs, logprobs = [prompt[-1]], []
    for _ in range(tokens):
        logprobs.append(_logprobs(model, inputs[-1], cache))
        mx.eval(logprobs[-1])
        inputs.append(_argmax(logprobs[-1]))
    return inputs[:-1], logprobs


def agreement(
    model: Any, prompt: list[int], kv: KVQuantization, inputs: list[int], logprobs: list[mx.array]
) -> dict[str, Any]:
    """The same inputs fed to a cache quantized as `kv` (teacher forcing), step by step
    against the unquantized `logprobs`."""
    cache = _prefilled(model, prompt[:-1], kv)
    agree, largest, means, first_miss = 0, 0.0, [], None
    for step, (token, theirs) in enumerate(zip(inputs, logprobs, strict=True)):
        ours = _logprobs(model, token, cache)
        difference = mx.abs(ours - theirs)
        same = _argmax(ours) == _argmax(theirs)
        agree += same
        if not same and first_miss is None:
            first_miss = step
        largest = max(largest, cast(float, difference.max().item()))
        means.append(cast(float, difference.mean().item()))
    return {
        "greedy_agreement": agree / len(inputs),
        "first_disagreement": first_miss,
        "max_logprob_diff": largest,
        "mean_logprob_diff": statistics.fmean(means),
    }


def _tiny(config: dict[str, Any]) -> Any:
    model_class, args_class = _get_classes(config)
    mx.random.seed(0)
    model = model_class(args_class.from_dict(config))
    mx.eval(model.parameters())
    cpu_exp.attach(model, cpu_exp.BOTH, matvec.native(NATIVE))
    return model


def measure_accuracy(args: Any) -> list[dict[str, Any]]:
    loaded = load_model(str(args.model), native=NATIVE)
    texts = TextMaker(args.model)
    models = {args.model.name: (loaded.model, "text")} | {
        f"tiny {name} (random weights)": (_tiny(config), "random") for name, config in TINY.items()
    }
    rows = []
    for name, (model, kind) in models.items():
        for length in args.lengths:
            if kind == "text":
                text = texts.text(f"kv/{length}", length)
                prompt = loaded.tokenizer.encode(text)[:length]
            else:
                prompt = [(i * 7919 + 13) % TINY_VOCAB for i in range(length)]
            inputs, logprobs = reference(model, prompt, args.tokens)
            for form, kv in _forms(args.bits, args.group_size).items():
                if kv is None:
                    continue
                started = time.perf_counter()
                row = {"model": name, "prompt_tokens": len(prompt), "kv": form}
                row |= agreement(model, prompt, kv, inputs, logprobs)
                row["seconds"] = time.perf_counter() - started
                print(json.dumps(row), flush=True)
                rows.append(row)
    return rows


def _filled(model: Any, kv: KVQuantization | None, batch: int, context: int) -> SlotBatch:
    """A slot batch whose `batch` rows hold the same `context`-token prompt (prefilled once,
    copied into each row as a prefix cache's opening), decoding for as long as asked."""
    prompt = [(i * 7919 + 13) % 32000 for i in range(context)]
    opening = _prefilled(model, prompt[:-1], kv)
    slots = SlotBatch(model, batch, frozenset(), CHUNK, False, context + 4096, kv)
    for _ in range(batch):  # one copy of the opening at a time: it is written into its row
        slots.insert([Entry(prompt[-1:], prompt[:-1], copy.deepcopy(opening), 1 << 30, greedy, [])])
        mx.eval(_buffers(slots))
    slots.next(None)
    return slots


def _buffers(slots: SlotBatch) -> list[mx.array]:
    """Every KV buffer of the batch: a layer's keys and values, or their quantized triples."""
    parts = [p for layer in slots._layers for p in (layer.keys, layer.values) if p is not None]
    return [a for p in parts for a in (p if isinstance(p, tuple) else [p])]


def measure_speed(args: Any) -> list[dict[str, Any]]:
    model = load_model(str(args.model), native=NATIVE).model
    forms = _forms(args.bits, args.group_size)
    rows = []
    for batch in args.batches:
        filled = {form: _filled(model, kv, batch, args.context) for form, kv in forms.items()}
        steps: dict[str, list[float]] = {form: [] for form in forms}
        for round_ in range(args.rounds):
            order = list(forms)[round_ % len(forms) :] + list(forms)[: round_ % len(forms)]
            for form in order:
                slots = filled[form]
                slots.next(None)  # the overlap's forward under way before the clock starts
                started = time.perf_counter()
                for _ in range(args.steps):
                    slots.next(None)
                steps[form].append((time.perf_counter() - started) / args.steps)
        float_ms = statistics.median(steps["float"]) * 1e3
        for form in forms:
            ms = statistics.median(steps[form]) * 1e3
            row = {"batch": batch, "context": args.context, "kv": form, "step_ms": ms}
            row |= {"tokens_per_s": batch * 1e3 / ms, "vs_float": float_ms / ms}
            print(json.dumps(row), flush=True)
            rows.append(row)
        del filled
        gc.collect()
        mx.clear_cache()
    return rows


def measure_memory(args: Any) -> list[dict[str, Any]]:
    model = load_model(str(args.model), native=NATIVE).model
    rows = []
    for form, kv in _forms(args.bits, args.group_size).items():
        gc.collect()
        mx.clear_cache()
        base = mx.get_active_memory()
        mx.reset_peak_memory()
        slots = _filled(model, kv, args.batches[-1], args.context)
        for _ in range(4):
            slots.next(None)
        kv_bytes = sum(a.nbytes for a in _buffers(slots))
        row = {"batch": args.batches[-1], "context": args.context, "kv": form}
        row |= {"kv_buffers_mb": kv_bytes / 2**20}
        row |= {"peak_over_weights_mb": (mx.get_peak_memory() - base) / 2**20}
        print(json.dumps(row), flush=True)
        rows.append(row)
        del slots
    return rows


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of a measurement (`python -m bench kv` passes them on)."""
    p.add_argument("--measure", choices=["accuracy", "speed", "memory"], required=True)
    p.add_argument("--bits", default="8,4", help="the quantized forms, against float")
    p.add_argument("--group-size", type=int, default=64)
    p.add_argument("--lengths", default="2000", help="accuracy: prompt tokens")
    p.add_argument("--tokens", type=int, default=256, help="accuracy: steps compared")
    p.add_argument("--batches", default="1,16", help="speed, memory: sequences in the batch")
    p.add_argument("--context", type=int, default=2000, help="speed, memory: tokens per row")
    p.add_argument("--rounds", type=int, default=5, help="speed: rounds over the forms")
    p.add_argument("--steps", type=int, default=4, help="speed: steps timed per round")


OPTIONS = ("bits", "group_size", "lengths", "tokens", "batches", "context", "rounds", "steps")


def bench_main(args: Any) -> None:
    """`python -m bench kv`: this module in a subprocess with OpenBLAS preloaded; the rows in
    `<out>/kv-<measure>.json` and `.md`."""
    model = ensure_default_model(args.models_dir)
    command = [sys.executable, "-m", "bench.kv_quantization", str(model)]
    command += ["--measure", args.measure]
    for name in OPTIONS:
        command += [f"--{name.replace('_', '-')}", str(getattr(args, name))]
    env = environment(**openblas_env())
    out = subprocess.run(command, env=env, capture_output=True, text=True, check=True).stdout
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    result["machine"] = describe()
    name = f"kv-{args.measure}"
    write(Path(args.out), name, result)
    rows = result["rows"]
    head = list(rows[0])
    cells = [[_cell(r[h]) for h in head] for r in rows]
    text = "\n".join(markdown_table(head, cells))
    (Path(args.out) / f"{name}.md").write_text(
        f"Machine: {result['machine']['summary']}\n\n{text}\n"
    )
    print(text)


def _cell(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _ints(text: str) -> list[int]:
    return [int(n) for n in text.split(",")]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("model", type=Path)
    add_arguments(p)
    args = p.parse_args()
    args.bits, args.lengths, args.batches = (
        _ints(args.bits),
        _ints(args.lengths),
        _ints(args.batches),
    )
    measure = {"accuracy": measure_accuracy, "speed": measure_speed, "memory": measure_memory}
    rows = measure[args.measure](args)
    print(json.dumps({"measure": args.measure, "rows": rows}))


if __name__ == "__main__":
    main()
