"""A forcing grammar run over a family's real vocabulary (vocab.py), token by token, as the
engine's constraint applies it: the check that a forced call's markers are the added tokens
they are and that the call ends with the end token (tests/families/test_forced_family_calls.py,
tests/worker/test_answer_calls.py)."""

from __future__ import annotations

import mlx.core as mx

from tests.families.vocab import family_tokenizer
from worker.engine.sequence.grammar import Grammars


def refused_at(
    grammar: str | None,
    text: str,
    family: str = "qwen3",
    end_token: str = "<|im_end|>",
    context: tuple[int, ...] = (1, 2),
) -> str | None:
    """On the family's vocabulary, `text` up to the first of its tokens (then the end token)
    that the grammar refuses; None: it allows each in turn, and after the text only the end
    token. `context`: the prompt's last tokens before them."""
    assert grammar is not None
    tokenizer = family_tokenizer(family)
    end = tokenizer.convert_tokens_to_ids(end_token)
    vocab = len(tokenizer.get_vocab())
    forced = Grammars(tokenizer._tokenizer, frozenset({end}), vocab).constraint(grammar)
    prompt = list(context)
    for token in [*tokenizer.encode(text, add_special_tokens=False), end]:
        allowed = forced(mx.array(prompt), mx.zeros(vocab))
        if allowed[token].item() != 0.0:
            return str(tokenizer.decode([*prompt[len(context) :], token]))
        prompt.append(token)
    assert allowed.max().item() == 0.0 and (allowed == 0).sum().item() == 1  # only the end token
    return None


def assert_forced_to_the_end(
    grammar: str | None,
    text: str,
    family: str = "qwen3",
    end_token: str = "<|im_end|>",
    context: tuple[int, ...] = (1, 2),
) -> None:
    """On the family's vocabulary, the grammar allows each of `text`'s tokens in turn, then only
    the end token; `context`: the prompt's last tokens before them."""
    refused = refused_at(grammar, text, family, end_token, context)
    assert refused is None, f"refused at: {refused!r}"
