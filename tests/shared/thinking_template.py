"""A chat template written for the reasoning tests in the shape of Qwen3's (an assistant turn's
`reasoning_content` inside `<think>`, an empty think block when `enable_thinking` is false), with
gpt-oss's two readings added (`message.thinking`, a `Reasoning:` level); no published template is
copied. And a conversation whose assistant turn carries reasoning, and a model spec to count
with."""

from __future__ import annotations

from typing import Any

from tokenizers import Tokenizer, models, pre_tokenizers

from shared.queue.prompt.prompt_tokens import TokenizerSpec

THINKING_TEMPLATE = """
{%- if reasoning_effort is defined %}<|im_start|>system
Reasoning: {{ reasoning_effort }}<|im_end|>
{% endif %}
{%- for message in messages %}
{%- if message.role == "assistant" %}<|im_start|>assistant
{% if message.reasoning_content %}<think>
{{ message.reasoning_content }}
</think>

{% endif %}{{ message.content }}<|im_end|>
{% if message.thinking %}[thinking: {{ message.thinking }}]
{% endif %}
{%- else %}<|im_start|>{{ message.role }}
{{ message.content }}<|im_end|>
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% if enable_thinking is defined and enable_thinking is false %}<think>

</think>

{% endif %}
{%- endif %}
"""

HISTORY: list[dict[str, Any]] = [
    {"role": "user", "content": "Say hi"},
    {"role": "assistant", "content": "Hi!", "reasoning_content": "A greeting is asked for."},
    {"role": "user", "content": "Again"},
]


def word_spec(context_length: int, template: str = THINKING_TEMPLATE) -> TokenizerSpec:
    """A model's published spec with this template and a tokenizer of one token per word, as a
    worker publishes it for a model that thinks by default (mlx-lm's `enable_thinking:
    has_thinking`)."""
    words = Tokenizer(models.WordLevel({"[UNK]": 0}, unk_token="[UNK]"))
    words.pre_tokenizer = pre_tokenizers.Whitespace()
    return TokenizerSpec(
        context_length=context_length,
        tokenizer_json=words.to_str(),
        chat_template=template,
        template_vars={"enable_thinking": True},
    )
