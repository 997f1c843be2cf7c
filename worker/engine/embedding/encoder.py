"""A sentence-transformers BERT model in MLX: token ids in, one unit vector per input out.

It owns reading a sentence-transformers directory (config.json, model.safetensors, tokenizer.json,
modules.json and the pooling module's config) and the forward pass, as that layout specifies it:
BERT (embeddings + LayerNorm, N post-norm encoder layers with exact GELU), then the pooling its
config names (the mean over the attention mask, or the [CLS] token), then L2 normalisation when
modules.json lists a Normalize module. Weights keep their file's float32. Inputs of one forward
are padded to the longest; padding is masked out of attention and pooling, so an input's vector
does not depend on what it was batched with (up to float rounding).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import mlx.core as mx
import mlx.nn as nn
from tokenizers import Tokenizer

from shared.wire.errors import ModelImportError

Pooling = Literal["mean", "cls"]


@dataclass(frozen=True)
class BertConfig:
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    max_position_embeddings: int
    type_vocab_size: int
    layer_norm_eps: float

    @classmethod
    def read(cls, config: dict[str, Any]) -> BertConfig:
        if config.get("model_type") != "bert" or config.get("hidden_act", "gelu") != "gelu":
            raise ModelImportError("an embedding model must be a BERT model with GELU")
        names = cls.__dataclass_fields__
        return cls(**{name: config[name] for name in names})


class Embeddings(nn.Module):
    def __init__(self, c: BertConfig):
        super().__init__()
        self.word_embeddings = nn.Embedding(c.vocab_size, c.hidden_size)
        self.position_embeddings = nn.Embedding(c.max_position_embeddings, c.hidden_size)
        self.token_type_embeddings = nn.Embedding(c.type_vocab_size, c.hidden_size)
        self.norm = nn.LayerNorm(c.hidden_size, eps=c.layer_norm_eps)

    def __call__(self, ids: mx.array) -> mx.array:
        positions = mx.arange(ids.shape[1])
        # One segment: every token has token type 0.
        x = self.word_embeddings(ids) + self.position_embeddings(positions)
        return self.norm(x + self.token_type_embeddings.weight[0])


class Layer(nn.Module):
    """One encoder layer: self-attention and a feed-forward block, each followed by its norm."""

    def __init__(self, c: BertConfig):
        super().__init__()
        h = c.hidden_size
        self.heads = c.num_attention_heads
        self.query, self.key, self.value = nn.Linear(h, h), nn.Linear(h, h), nn.Linear(h, h)
        self.attention_out = nn.Linear(h, h)
        self.attention_norm = nn.LayerNorm(h, eps=c.layer_norm_eps)
        self.intermediate = nn.Linear(h, c.intermediate_size)
        self.output = nn.Linear(c.intermediate_size, h)
        self.output_norm = nn.LayerNorm(h, eps=c.layer_norm_eps)

    def __call__(self, x: mx.array, mask: mx.array) -> mx.array:
        b, n, h = x.shape
        d = h // self.heads

        def heads(t: mx.array) -> mx.array:
            return t.reshape(b, n, self.heads, d).transpose(0, 2, 1, 3)

        q, k, v = heads(self.query(x)), heads(self.key(x)), heads(self.value(x))
        a = mx.fast.scaled_dot_product_attention(q, k, v, scale=d**-0.5, mask=mask)
        x = self.attention_norm(x + self.attention_out(a.transpose(0, 2, 1, 3).reshape(b, n, h)))
        return self.output_norm(x + self.output(nn.gelu(self.intermediate(x))))


class Bert(nn.Module):
    def __init__(self, c: BertConfig):
        super().__init__()
        self.embeddings = Embeddings(c)
        self.layers = [Layer(c) for _ in range(c.num_hidden_layers)]

    def __call__(self, ids: mx.array, attention: mx.array) -> mx.array:
        """The last hidden states of `ids` [batch, length]; `attention` is 1 on real tokens."""
        # Additive: padded keys get a large negative score, so no query attends to them.
        mask = ((1.0 - attention.astype(mx.float32)) * -1e9)[:, None, None, :]
        x = self.embeddings(ids)
        for layer in self.layers:
            x = layer(x, mask)
        return x


# The safetensors names of a BERT checkpoint, mapped onto this module's.
_RENAMES = [
    (r"^embeddings\.LayerNorm\.", "embeddings.norm."),
    (r"^encoder\.layer\.(\d+)\.attention\.self\.", r"layers.\1."),
    (r"^encoder\.layer\.(\d+)\.attention\.output\.dense\.", r"layers.\1.attention_out."),
    (r"^encoder\.layer\.(\d+)\.attention\.output\.LayerNorm\.", r"layers.\1.attention_norm."),
    (r"^encoder\.layer\.(\d+)\.intermediate\.dense\.", r"layers.\1.intermediate."),
    (r"^encoder\.layer\.(\d+)\.output\.dense\.", r"layers.\1.output."),
    (r"^encoder\.layer\.(\d+)\.output\.LayerNorm\.", r"layers.\1.output_norm."),
]
# In the checkpoint, not used to embed: the position id buffer and the [CLS] pooler head.
_UNUSED = re.compile(r"^(embeddings\.position_ids|pooler\.)")


def _renamed(name: str) -> str:
    for pattern, replacement in _RENAMES:
        name = re.sub(pattern, replacement, name)
    return name.removeprefix("bert.")


@dataclass(frozen=True)
class Encoder:
    """A loaded sentence-transformers model: its BERT, tokenizer and pooling."""

    bert: Bert
    tokenizer: Tokenizer
    pooling: Pooling
    normalize: bool
    max_tokens: int  # the most tokens one input may have, [CLS] and [SEP] included
    dimensions: int
    cls_id: int
    sep_id: int

    def tokenize(self, texts: list[str]) -> list[list[int]]:
        """Each text's token ids, [CLS] and [SEP] included, not truncated."""
        return [e.ids for e in self.tokenizer.encode_batch(texts)]

    def framed(self, ids: list[int]) -> list[int]:
        """Token ids given by a client, with [CLS] before and [SEP] after unless already there."""
        head = [] if ids[:1] == [self.cls_id] else [self.cls_id]
        tail = [] if ids[-1:] == [self.sep_id] and len(ids) > 1 else [self.sep_id]
        return head + ids + tail

    def embed(self, batch: list[list[int]]) -> mx.array:
        """One float32 vector per token-id list, computed in one padded forward."""
        width = max(len(ids) for ids in batch)
        ids = mx.array([row + [0] * (width - len(row)) for row in batch], dtype=mx.int32)
        attention = mx.array([[1] * len(row) + [0] * (width - len(row)) for row in batch])
        hidden = self.bert(ids, attention)
        if self.pooling == "cls":
            pooled = hidden[:, 0, :]
        else:
            weights = attention.astype(hidden.dtype)[:, :, None]
            pooled = (hidden * weights).sum(axis=1) / mx.maximum(weights.sum(axis=1), 1e-9)
        if self.normalize:
            norms = mx.sqrt((pooled * pooled).sum(axis=-1, keepdims=True))
            pooled = pooled / mx.maximum(norms, 1e-12)
        return pooled


def load_encoder(path: Path) -> Encoder:
    """Load the sentence-transformers model in directory `path`."""
    config = BertConfig.read(_json(path / "config.json"))
    modules = _json(path / "modules.json")
    kinds = [str(m.get("type", "")).rsplit(".", 1)[-1] for m in modules]
    pooling_dir = next((m["path"] for m in modules if m.get("type", "").endswith("Pooling")), None)
    pooling = _pooling(_json(path / pooling_dir / "config.json") if pooling_dir else {})
    bert = Bert(config)
    weights = mx.load(str(path / "model.safetensors"))
    assert isinstance(weights, dict)
    bert.load_weights([(_renamed(k), v) for k, v in weights.items() if not _UNUSED.match(k)])
    mx.eval(bert.parameters())
    tokenizer = Tokenizer.from_file(str(path / "tokenizer.json"))
    tokenizer.no_truncation()  # inputs too long are refused, never cut short
    tokenizer.no_padding()  # a forward pads to its own longest input
    special = (
        _json(path / "tokenizer_config.json") if (path / "tokenizer_config.json").is_file() else {}
    )
    cls_id = tokenizer.token_to_id(special.get("cls_token", "[CLS]"))
    sep_id = tokenizer.token_to_id(special.get("sep_token", "[SEP]"))
    if cls_id is None or sep_id is None:
        raise ModelImportError(f"{path}: the tokenizer has no [CLS] or [SEP] token")
    return Encoder(
        bert=bert,
        tokenizer=tokenizer,
        pooling=pooling,
        normalize="Normalize" in kinds,
        max_tokens=config.max_position_embeddings,
        dimensions=config.hidden_size,
        cls_id=cls_id,
        sep_id=sep_id,
    )


def _pooling(config: dict[str, Any]) -> Pooling:
    """The pooling the module's config asks for; mean when there is no pooling config."""
    modes = {k.removeprefix("pooling_mode_") for k, v in config.items() if v is True}
    if modes <= {"mean_tokens"}:
        return "mean"
    if modes == {"cls_token"}:
        return "cls"
    raise ModelImportError(f"pooling {sorted(modes)} is not supported (mean or cls only)")


def _json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise ModelImportError(f"cannot read {path}: {err}") from err
