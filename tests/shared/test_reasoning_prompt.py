"""Reasoning sent back in history, and the reasoning controls, reach the chat template as the
families' templates read them, on the API's renderer (shared/queue/prompt/prompt_tokens.py); the
worker renders the same (tests/worker/test_reasoning_template.py). Also the opaque reasoning
value (shared/wire/responses/reasoning_blob.py) and the context window's ceiling.

The template (tests/shared/thinking_template.py) reads what Qwen3's and gpt-oss's read.
"""

from __future__ import annotations

import base64
from typing import Any

import pytest

from shared.queue.jobs import job_for
from shared.queue.prompt.context_window import completion_budget
from shared.queue.prompt.prompt_tokens import PromptCounter, job_chat_input
from shared.wire.anthropic.messages import MessagesRequest
from shared.wire.chat.completions import ChatCompletionRequest
from shared.wire.errors import ContextLengthError, InvalidRequestError
from shared.wire.generation.reasoning import ReasoningControl
from shared.wire.responses.reasoning_blob import decode_reasoning_blob, encode_reasoning_blob
from shared.wire.responses.responses import ResponsesRequest
from tests.shared.thinking_template import HISTORY, THINKING_TEMPLATE, word_spec

# A template that uses a variable as text: a client's variable of another type breaks it.
STRICT_TEMPLATE = "{{ 'Reasoning: ' + reasoning_effort }}{{ messages[0].content }}"


def counter(template: str = THINKING_TEMPLATE) -> PromptCounter:
    return PromptCounter(word_spec(4096, template))


def chat_prompt(template: str = THINKING_TEMPLATE, **body: Any) -> str:
    req = ChatCompletionRequest.model_validate({"model": "m", **body})
    return rendered(job_for("chatcmpl-1", req), template)


def rendered(job: Any, template: str = THINKING_TEMPLATE) -> str:
    chat = job_chat_input(job, tools_in_template=False, developer_role=False)
    assert chat is not None
    return counter(template).render_chat(chat)


def test_history_reasoning_content_goes_inside_its_assistant_turn_where_qwen3_reads_it() -> None:
    prompt = chat_prompt(messages=HISTORY)
    turn = "<|im_start|>assistant\n<think>\nA greeting is asked for.\n</think>\n\nHi!<|im_end|>"
    assert turn in prompt
    assert prompt.index("Say hi") < prompt.index(turn) < prompt.index("Again")


def test_history_reasoning_under_vllms_name_reaches_both_template_names() -> None:
    history = [{**m} for m in HISTORY]
    history[1] = {"role": "assistant", "content": "Hi!", "reasoning": "Under vLLM's name."}
    prompt = chat_prompt(messages=history)
    assert "<think>\nUnder vLLM's name.\n</think>" in prompt  # reasoning_content
    assert "[thinking: Under vLLM's name.]" in prompt  # gpt-oss's `thinking`


def test_a_turn_without_reasoning_gets_no_think_block() -> None:
    prompt = chat_prompt(messages=[HISTORY[0], {"role": "assistant", "content": "Hi!"}, HISTORY[2]])
    assert "<think>" not in prompt and "[thinking:" not in prompt


def test_effort_none_reaches_the_template_as_enable_thinking_false() -> None:
    thinking = chat_prompt(messages=HISTORY)
    assert thinking.endswith("<|im_start|>assistant\n")  # the model's default: it thinks
    quiet = chat_prompt(messages=HISTORY, reasoning_effort="none")
    assert quiet.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


@pytest.mark.parametrize(
    ("effort", "level"), [("minimal", "low"), ("medium", "medium"), ("xhigh", "high")]
)
def test_effort_reaches_gpt_oss_style_templates_as_one_of_their_three_levels(
    effort: str, level: str
) -> None:
    prompt = chat_prompt(messages=HISTORY, reasoning_effort=effort)
    assert prompt.startswith(f"<|im_start|>system\nReasoning: {level}<|im_end|>")
    assert not prompt.endswith("</think>\n\n")  # an effort alone leaves thinking on


def test_the_clients_chat_template_kwargs_win_over_the_control() -> None:
    prompt = chat_prompt(
        messages=HISTORY,
        reasoning_effort="high",
        chat_template_kwargs={"enable_thinking": False, "reasoning_effort": "medium"},
    )
    assert prompt.endswith("<think>\n\n</think>\n\n")
    assert "Reasoning: medium" in prompt


def test_anthropic_thinking_disabled_and_thinking_blocks_reach_the_template() -> None:
    blob = encode_reasoning_blob("Then the redacted part.")
    assistant = [
        {"type": "thinking", "thinking": "First the visible part.", "signature": "sig"},
        {"type": "redacted_thinking", "data": blob},
        {"type": "redacted_thinking", "data": "EqQBCgIYAh...another server's"},
        {"type": "text", "text": "Hi!"},
    ]
    req = MessagesRequest.model_validate(
        {
            "model": "m",
            "max_tokens": 64,
            "thinking": {"type": "disabled"},
            "messages": [
                {"role": "user", "content": "Say hi"},
                {"role": "assistant", "content": assistant},
                {"role": "user", "content": "Again"},
            ],
        }
    )
    prompt = rendered(job_for("msg_1", req))
    assert "<think>\nFirst the visible part.\nThen the redacted part.\n</think>\n\nHi!" in prompt
    assert prompt.endswith("<think>\n\n</think>\n\n")


def test_responses_reasoning_items_give_their_text_to_the_turn_after_them() -> None:
    req = ResponsesRequest.model_validate(
        {
            "model": "m",
            "reasoning": {"effort": "none"},
            "input": [
                {"role": "user", "content": "Say hi"},
                {
                    "type": "reasoning",
                    "id": "rs_1",
                    "summary": [{"type": "summary_text", "text": "a summary"}],
                    "encrypted_content": encode_reasoning_blob("From the opaque value."),
                },
                {"type": "message", "role": "assistant", "content": "Hi!"},
                {"type": "reasoning", "id": "rs_2", "summary": [], "encrypted_content": "gAAA"},
                {"role": "user", "content": "Again"},
            ],
        }
    )
    prompt = rendered(job_for("resp_1", req))
    assert "<think>\nFrom the opaque value.\n</think>\n\nHi!" in prompt
    assert "a summary" not in prompt  # the full text wins over the summary
    assert prompt.endswith("<think>\n\n</think>\n\n")


def test_a_template_that_fails_on_a_clients_variable_is_a_400() -> None:
    with pytest.raises(InvalidRequestError, match="chat template refused"):
        chat_prompt(STRICT_TEMPLATE, messages=HISTORY, chat_template_kwargs={"reasoning_effort": 3})


def test_the_control_sets_only_what_was_asked() -> None:
    assert ReasoningControl().template_kwargs() == {}
    assert ReasoningControl(enabled=True).template_kwargs() == {
        "enable_thinking": True,
        "thinking": True,
    }
    assert ReasoningControl.of_effort("none").enabled is False
    assert ReasoningControl.of_effort("high").enabled is None


def test_an_opaque_reasoning_value_gives_its_text_back() -> None:
    text = 'Thé "quoted" 😀\nnew line'
    blob = encode_reasoning_blob(text)
    assert decode_reasoning_blob(blob) == text
    assert set(blob.removeprefix("mlxq1.")) <= set(
        "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
    )


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode()


@pytest.mark.parametrize(
    "blob",
    [
        "",
        "gAAAAABoxyz-openai-ciphertext",
        "mlxq1.!!!not base64",
        "mlxq1." + _b64(b"\xff\xfe not utf-8"),
        "mlxq1." + _b64(b'{"v": 2, "text": "a later version"}'),
        "mlxq1." + _b64(b'{"v": 1, "text": 5}'),
        "mlxq1." + _b64(b"[" * 100_000),
    ],
)
def test_an_opaque_value_this_server_did_not_make_reads_as_none(blob: str) -> None:
    assert decode_reasoning_blob(blob) is None


def test_a_ceiling_shrinks_to_the_window_where_a_demand_is_refused() -> None:
    assert completion_budget(100, 32_000, 8192, "messages", ceiling=True) == 8092
    assert completion_budget(100, 500, 8192, "messages", ceiling=True) == 500
    with pytest.raises(ContextLengthError, match="8192 tokens"):
        completion_budget(100, 32_000, 8192, "messages")
    with pytest.raises(ContextLengthError, match="resulted in 8192 tokens"):
        completion_budget(8192, 32_000, 8192, "messages", ceiling=True)
