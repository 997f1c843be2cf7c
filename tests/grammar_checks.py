"""What a forcing grammar (a forced tool call's) takes, read byte by byte: the check the
grammar tests share (tests/shared/test_call_grammar.py, tests/worker/test_answer_calls.py,
tests/families/test_forced_family_calls.py). On a real vocabulary, token by token, it is
tests/families/forcing.py's."""

from __future__ import annotations

import llguidance


def takes(grammar: str, text: str) -> bool:
    """Whether `grammar` accepts the bytes of `text` and is complete after them."""
    matcher = llguidance.LLMatcher(llguidance.LLTokenizer("byte"), grammar, log_level=0)
    return bool(matcher.consume_tokens(list(text.encode()))) and matcher.is_accepting()
