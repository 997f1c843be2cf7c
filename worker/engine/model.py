"""A model loaded once per worker process, with what every sequence needs to know about it:
its context window, its stop tokens, its detokenizer and each token's bytes."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlx_lm import load
from mlx_lm.tokenizer_utils import TokenizerWrapper
from mlx_lm.utils import load_config, load_tokenizer

from worker.engine.cpu import exponentials as cpu_exp
from worker.engine.cpu import matvec
from worker.engine.cpu.exponentials import Routes as Routes  # the loader's callers name routes
from worker.engine.model_config import context_window
from worker.engine.sequence.detokenize import (
    TextDecoder,
    byte_table_of,
    decoder_factory,
    token_pieces,
)
from worker.engine.sequence.stop import stop_token_ids


@dataclass(frozen=True)
class LoadedModel:
    model: Any  # an mlx.nn.Module
    tokenizer: TokenizerWrapper
    context_length: int
    stop_ids: frozenset[int]
    new_decoder: Callable[[], TextDecoder]
    vocab_size: int  # the width of the model's logits
    token_piece: Callable[[int], bytes]


def native_folder(models_dir: Path) -> Path:
    """Where the CPU worker's native module (few-row products, 8-bit KV's decode attention) is
    built, beside the models."""
    return matvec.folder(models_dir)


def build_native(models_dir: Path) -> Path:
    """Build the native module ahead of the first load (`mlxq prepare-model`)."""
    return matvec.build(matvec.folder(models_dir))


def load_model(path: str, exps: Routes = cpu_exp.BOTH, native: Path | None = None) -> LoadedModel:
    """`exps`: on the CPU device, which forwards take worker/engine/cpu/exponentials.py's
    exponentials;
    `native`: where worker/engine/cpu/matvec.py's module is built, to route few-row products
    and 8-bit KV's decode attention through it (None: MLX's matmul for every product, the
    pure-MLX quantized attention).
    Both fast paths are hooked onto this model's layers and go with it: the process's MLX and
    mlx-lm, and any other model, are left as they are."""
    model, tokenizer, config = load(path, return_config=True)
    kernel = matvec.attention(native) if native is not None else None
    cpu_exp.attach(model, exps, kernel)  # 8-bit KV's decode attention takes the native kernel
    if native is not None:
        matvec.attach(model, native)
    table = byte_table_of(tokenizer)
    return LoadedModel(
        model=model,
        tokenizer=tokenizer,
        context_length=context_window(config),
        stop_ids=stop_token_ids(
            tokenizer.eos_token_ids, _generation_config_eos(Path(path)), _token_lookup(tokenizer)
        ),
        new_decoder=decoder_factory(tokenizer, table),
        vocab_size=int(config.get("vocab_size") or len(tokenizer.get_vocab())),
        token_piece=token_pieces(tokenizer, table),
    )


def load_tokenizer_only(path: str) -> tuple[TokenizerWrapper, int]:
    """A model's tokenizer and context window, without its weights (the synthetic engine's
    prefill model counts real tokens, worker/engine/doubles/synthetic_prefill.py)."""
    return load_tokenizer(Path(path)), context_window(load_config(Path(path)))


def _generation_config_eos(path: Path) -> list[int]:
    file = path / "generation_config.json"
    if not file.is_file():
        return []
    eos = json.loads(file.read_text()).get("eos_token_id")
    if eos is None:
        return []
    return [eos] if isinstance(eos, int) else [int(i) for i in eos]


def _token_lookup(tokenizer: TokenizerWrapper) -> Any:
    vocab: dict[str, int] = tokenizer.get_vocab()
    return vocab.get
