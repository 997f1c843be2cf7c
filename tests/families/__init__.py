"""Model families on real vocabularies: tokenizers mlx-lm loads (vocab.py), and tiny real models
that say what a test chooses (scripted.py), with example replies in each family's format
(examples.py).

    from tests.families import family_dir, scripted_model, read_script, worker_env
    from tests.families.examples import REPLIES

    model = scripted_model(family_dir("qwen3"), REPLIES[("qwen3", "think-then-tool-call")], root)
    worker = stack.start_worker(**worker_env(model))   # tests/conftest.py's `stack`
    sdk.chat.completions.create(model=model.name, messages=[{"role": "user", "content": "hi"}])
    read_script(model)["reply_text"]                   # exactly what the model writes

The families: qwen3, gpt-oss, deepseek-r1, llama3, phi4-mini, and the stand-ins gemma and
mistral (vocab.py says what is real in each).
"""

from tests.families.scripted import (
    ScriptError,
    prompt_tail,
    read_script,
    scripted_model,
    worker_env,
)
from tests.families.vocab import FAMILIES, family_dir, family_tokenizer

__all__ = [
    "FAMILIES",
    "ScriptError",
    "family_dir",
    "family_tokenizer",
    "prompt_tail",
    "read_script",
    "scripted_model",
    "worker_env",
]
