"""Rebuild the Hugging Face tokenizer files from the vocabulary a GGUF carries.

This module owns turning llama.cpp's tokenizer metadata into `tokenizer.json`,
`tokenizer_config.json` and `special_tokens_map.json` content: byte-level BPE vocabularies
(gpt2) and SentencePiece ones (llama), the special tokens kept whole, and the post-processor
that adds BOS/EOS. A vocabulary it cannot rebuild faithfully is refused with `ModelImportError`.
"""

from __future__ import annotations

from typing import Any

from tokenizers import (
    AddedToken,
    Regex,
    Tokenizer,
    decoders,
    normalizers,
    pre_tokenizers,
    processors,
)
from tokenizers.models import BPE

from shared.wire.errors import ModelImportError
from worker.gguf.file import (
    Metadata,
    get_bool,
    get_ints,
    get_optional_int,
    get_strings,
)

# llama.cpp token types (tokenizer.ggml.token_type).
_NORMAL, _UNKNOWN, _CONTROL, _USER_DEFINED = 1, 2, 3, 4

_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# Qwen 2, 2.5 and 3 (llama.cpp's LLAMA_VOCAB_PRE_TYPE_QWEN2): Llama 3's split, one digit a piece.
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_LLAMA3_PRES = frozenset({"llama-bpe", "llama3", "llama-v3"})
_SPLITS = {**dict.fromkeys(_LLAMA3_PRES, _LLAMA3_SPLIT), "qwen2": _QWEN2_SPLIT}
_BYTE_LEVEL_PRES = frozenset({"smollm", "gpt-2"}) | _SPLITS.keys()


def build_tokenizer(
    meta: Metadata, context_length: int, fallback_template: str | None = None
) -> tuple[Tokenizer, dict[str, Any]]:
    """Rebuild the Hugging Face tokenizer a GGUF describes: (tokenizer, tokenizer_config).

    The chat template is the file's, else `fallback_template` (the family's format)."""
    model = meta.get("tokenizer.ggml.model")
    tokens = get_strings(meta, "tokenizer.ggml.tokens")
    types = get_ints(meta, "tokenizer.ggml.token_type") or [_NORMAL] * len(tokens)
    if len(types) != len(tokens):
        raise ModelImportError(
            "tokenizer.ggml.token_type and tokenizer.ggml.tokens differ in length"
        )
    if model == "gpt2":
        tokenizer = _byte_level_tokenizer(meta, tokens)
        addable = set(_byte_alphabet().values())
    elif model == "llama":
        tokenizer = _sentencepiece_tokenizer(meta, tokens, types)
        addable = None
    else:
        raise ModelImportError(f"unsupported tokenizer model {model!r} (gpt2 and llama are)")
    _add_special_tokens(tokenizer, tokens, types, addable)
    config = _tokenizer_config(meta, tokens, default_add_bos=model == "llama")
    config["model_max_length"] = context_length
    if "chat_template" not in config and fallback_template is not None:
        config["chat_template"] = fallback_template
    tokenizer.post_processor = _post_processor(config, tokenizer, byte_level=model == "gpt2")
    return tokenizer, config


def _byte_alphabet() -> dict[int, str]:
    """GPT-2's printable stand-in character for each byte, as byte-level BPE vocabularies use."""
    keep = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    extra = iter(range(256, 512))
    return {b: chr(b) if b in keep else chr(next(extra)) for b in range(256)}


def _byte_level_tokenizer(meta: Metadata, tokens: list[str]) -> Tokenizer:
    pre = meta.get("tokenizer.ggml.pre", "gpt-2")
    if pre not in _BYTE_LEVEL_PRES:
        raise ModelImportError(f"unsupported byte-level pre-tokenizer {pre!r}")
    alphabet = _byte_alphabet()
    chars = set(alphabet.values())
    # llama.cpp writes user-defined tokens as plain text; BPE needs them in the byte alphabet.
    spelled = [t if set(t) <= chars else "".join(alphabet[b] for b in t.encode()) for t in tokens]
    merges = [_split_merge(m) for m in get_strings(meta, "tokenizer.ggml.merges")]
    tokenizer = _bpe_tokenizer(
        vocab=_vocab(spelled), merges=merges, ignore_merges=pre in _LLAMA3_PRES, fuse_unk=False
    )
    tokenizer.pre_tokenizer = _byte_level_pre_tokenizer(pre)
    if pre == "qwen2":  # Qwen's tokenizer.json composes the text (NFC) first
        tokenizer.normalizer = normalizers.NFC()
    tokenizer.decoder = decoders.ByteLevel()
    return tokenizer


def _bpe_tokenizer(**options: Any) -> Tokenizer:
    try:
        return Tokenizer(BPE(**options))
    except Exception as exc:  # tokenizers raises bare Exception, e.g. for a merge not in the vocab
        raise ModelImportError(f"the GGUF vocabulary does not form a valid BPE: {exc}") from exc


def _split_merge(merge: str) -> tuple[str, str]:
    # Byte-level tokens spell spaces as "Ġ", so the one literal space separates the pair.
    left, sep, right = merge.partition(" ")
    if not sep or not left or not right or " " in right:
        raise ModelImportError(f"malformed merge {merge!r} in tokenizer.ggml.merges")
    return left, right


def _vocab(tokens: list[str]) -> dict[str, int]:
    vocab: dict[str, int] = {}
    for index, token in enumerate(tokens):
        # A string listed twice can only ever encode to one id; keep the first.
        vocab.setdefault(token, index)
    return vocab


def _byte_level_pre_tokenizer(pre: str) -> Any:
    if pre in _SPLITS:
        return pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(_SPLITS[pre]), behavior="isolated", invert=False),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre == "smollm":
        # SmolLM's own tokenizer splits every digit apart before the GPT-2 regex.
        digits = pre_tokenizers.Digits(individual_digits=True)
        return pre_tokenizers.Sequence([digits, byte_level])
    return pre_tokenizers.Sequence([byte_level])


def _sentencepiece_tokenizer(meta: Metadata, tokens: list[str], types: list[int]) -> Tokenizer:
    """A SentencePiece BPE vocabulary as an HF BPE with byte fallback, like Llama 2's own."""
    scores = meta.get("tokenizer.ggml.scores")
    if not isinstance(scores, list) or len(scores) != len(tokens):
        raise ModelImportError("a SentencePiece GGUF needs one tokenizer.ggml.scores per token")
    unk_id = get_optional_int(meta, "tokenizer.ggml.unknown_token_id")
    tokenizer = _bpe_tokenizer(
        vocab=_vocab(tokens),
        merges=_sentencepiece_merges(tokens, types, [float(s) for s in scores]),
        unk_token=tokens[unk_id] if unk_id is not None else None,
        byte_fallback=True,
        fuse_unk=True,
    )
    add_prefix = get_bool(meta, "tokenizer.ggml.add_space_prefix", True)
    # A normalizer (not Metaspace) so the space prefix follows every special token, as
    # llama.cpp and Llama 2's own tokenizer.json do.
    steps: list[normalizers.Normalizer] = [normalizers.Replace(" ", "▁")]
    if add_prefix:
        steps.insert(0, normalizers.Prepend("▁"))
    tokenizer.normalizer = normalizers.Sequence(steps)
    tokenizer.pre_tokenizer = None
    parts = [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
    if add_prefix:
        parts.append(decoders.Strip(" ", 1, 0))
    tokenizer.decoder = decoders.Sequence(parts)
    return tokenizer


def _sentencepiece_merges(
    tokens: list[str], types: list[int], scores: list[float]
) -> list[tuple[str, str]]:
    """Recover BPE merges: SentencePiece merges the adjacent pair whose result scores highest.

    Ranking every split of every normal piece by its score reproduces that order.
    """
    score = {t: s for t, s, kind in zip(tokens, scores, types, strict=True) if kind == _NORMAL}
    ranked: list[tuple[float, str, str]] = []
    for piece, piece_score in score.items():
        for cut in range(1, len(piece)):
            left, right = piece[:cut], piece[cut:]
            if left in score and right in score:
                ranked.append((-piece_score, left, right))
    ranked.sort(key=lambda r: (r[0], -len(r[1])))
    return [(left, right) for _, left, right in ranked]


def _add_special_tokens(
    tokenizer: Tokenizer, tokens: list[str], types: list[int], addable: set[str] | None
) -> None:
    """Keep control and user-defined tokens whole, as llama.cpp matches them in the text."""
    special: list[AddedToken] = []
    plain: list[AddedToken] = []
    for token, kind in zip(tokens, types, strict=True):
        if addable is not None and not set(token) <= addable:
            continue  # stored as plain text; it would get a new id past the vocabulary
        if kind in (_CONTROL, _UNKNOWN):
            special.append(AddedToken(token, special=True, normalized=False))
        elif kind == _USER_DEFINED:
            plain.append(AddedToken(token, special=False, normalized=False))
    tokenizer.add_special_tokens(special)
    tokenizer.add_tokens(plain)


def _tokenizer_config(meta: Metadata, tokens: list[str], default_add_bos: bool) -> dict[str, Any]:
    config: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "clean_up_tokenization_spaces": False,
        # llama.cpp adds BOS to SentencePiece vocabularies that do not say otherwise.
        "add_bos_token": get_bool(meta, "tokenizer.ggml.add_bos_token", default_add_bos),
        "add_eos_token": get_bool(meta, "tokenizer.ggml.add_eos_token", False),
    }
    for name, key in (("bos", "bos"), ("eos", "eos"), ("pad", "padding"), ("unk", "unknown")):
        token_id = get_optional_int(meta, f"tokenizer.ggml.{key}_token_id")
        if token_id is not None and 0 <= token_id < len(tokens):
            config[f"{name}_token"] = tokens[token_id]
    if isinstance(template := meta.get("tokenizer.chat_template"), str):
        config["chat_template"] = template
    return config


def _post_processor(config: dict[str, Any], tokenizer: Tokenizer, byte_level: bool) -> Any:
    steps: list[Any] = [processors.ByteLevel(trim_offsets=False)] if byte_level else []
    bos = config.get("bos_token") if config["add_bos_token"] else None
    eos = config.get("eos_token") if config["add_eos_token"] else None
    if bos is not None or eos is not None:
        head = [bos] if bos is not None else []
        tail = [eos] if eos is not None else []
        single = [*head, "$A", *tail]
        pair = [*single, *(f"{t}:1" for t in head), "$B:1", *(f"{t}:1" for t in tail)]
        special = [(t, tokenizer.token_to_id(t)) for t in {*head, *tail}]
        steps.append(
            processors.TemplateProcessing(single=single, pair=pair, special_tokens=special)
        )
    return processors.Sequence(steps) if steps else None


def special_tokens_map(tokenizer_config: dict[str, Any]) -> dict[str, str]:
    names = ("bos_token", "eos_token", "pad_token", "unk_token")
    return {name: tokenizer_config[name] for name in names if name in tokenizer_config}
