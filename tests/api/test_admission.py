"""Admission (api/queue/admission.py) checks a job once each way and queues it as it admitted it:
with per-key limits on, the prompt is rendered once for the rate limits, the context window and
placement; the live workers are read once for the 404 and placement; the job the route built is
left as it was, and the one queued is the admitted copy, which cannot be changed."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from flask import Flask
from pydantic import ValidationError
from redis import Redis
from redis.client import PubSub
from tokenizers import Tokenizer, models, pre_tokenizers

import api.queue.roster as roster_module
from api import create_app
from api.queue.admission import admit
from api.queue.broker import Broker
from shared.queue.config import Settings
from shared.queue.jobs import GenerationJob, job_for
from shared.queue.keys import Keys
from shared.queue.prompt.prompt_tokens import PromptCounter, TokenizerSpec
from shared.wire.chat.completions import ChatCompletionRequest
from shared.wire.errors import ContextLengthError
from shared.wire.ids import new_id
from tests.support import MODEL, STAND_IN, rq_queue

KEY = "sk-admission"
WORDS = ["[UNK]", "the", "quick", "brown", "fox", "jumps"]
WINDOW = 32
MAX_TOKENS = 5


def publish_word_tokenizer(redis: Redis, keys: Keys) -> None:
    """A worker's published spec for a one-token-per-word vocabulary and a template that writes
    the messages' contents one after another, so that a prompt's count is its words."""
    tokenizer = Tokenizer(
        models.WordLevel(vocab={w: i for i, w in enumerate(WORDS)}, unk_token="[UNK]")
    )
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    spec = TokenizerSpec(
        context_length=WINDOW,
        tokenizer_json=tokenizer.to_str(),
        chat_template="{% for m in messages %}{{ m['content'] }} {% endfor %}",
    )
    redis.hset(
        keys.tokenizer(MODEL), mapping={"spec": spec.model_dump_json(), "digest": spec.digest()}
    )


def count_calls(monkeypatch: pytest.MonkeyPatch, owner: Any, name: str) -> list[int]:
    """How often `owner.name` is called from now on (one item, the count)."""
    calls = [0]
    original: Callable[..., Any] = getattr(owner, name)

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        return original(*args, **kwargs)

    monkeypatch.setattr(owner, name, counted)
    return calls


@pytest.fixture
def keyed_app(app_settings: Settings, redis: Redis, stand_in: tuple[Keys, PubSub]) -> Flask:
    """An app whose key counts tokens per minute and queued tokens, on a model whose worker
    published a tokenizer the API counts with."""
    publish_word_tokenizer(redis, stand_in[0])
    limits = Settings(api_keys=f"{KEY}:rpm=100:tpm=100000:queued=100000").api_keys
    return create_app(app_settings.model_copy(update={"api_keys": limits}))


@contextlib.contextmanager
def keyed_request(app: Flask) -> Iterator[None]:
    """Inside a chat request of the limited key, its limits taken as a route's request has them."""
    with app.test_request_context(
        "/v1/chat/completions", method="POST", headers={"Authorization": f"Bearer {KEY}"}
    ):
        app.preprocess_request()
        yield


def chat_job(content: str) -> GenerationJob:
    req = ChatCompletionRequest.model_validate(
        {
            "model": MODEL,
            "messages": [{"role": "user", "content": content}],
            "max_tokens": MAX_TOKENS,
        }
    )
    return job_for(new_id("chatcmpl-"), req, "anonymous")


@pytest.fixture
def renders(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How often a prompt is rendered for counting from now on."""
    return count_calls(monkeypatch, PromptCounter, "render_chat")


def test_a_job_is_counted_once_read_live_once_and_queued_as_admitted(
    keyed_app: Flask,
    redis: Redis,
    stand_in: tuple[Keys, PubSub],
    renders: list[int],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    keys, _ = stand_in
    broker: Broker = keyed_app.extensions["mlxq.broker"]
    reads = count_calls(monkeypatch, roster_module, "live_workers")
    job = chat_job("the quick brown fox jumps")
    with keyed_request(keyed_app):
        admitted = admit(broker, job, None)
        broker.enqueue(admitted.job, admitted.sub)
    broker.relay.unsubscribe(admitted.sub)

    assert renders == [1] and reads == [1]
    assert admitted.prompt is not None and admitted.prompt.tokens == 5
    assert admitted.workers == {STAND_IN}
    assert admitted.job.queued_tokens == 5 + MAX_TOKENS  # the prompt and the most it may write
    assert admitted.job.reply_to == broker.api_id
    assert admitted.job.limits.queue_deadline is not None
    assert (job.queued_tokens, job.reply_to, job.limits.queue_deadline) == (None, None, None)
    (queued,) = rq_queue(redis, keys.queue(MODEL)).jobs
    assert queued.args[0] == admitted.job.model_dump(mode="json")
    with pytest.raises(ValidationError):
        admitted.job.model = "another"  # type: ignore[misc]


def test_a_prompt_over_the_window_is_refused_after_one_count_and_nothing_is_queued(
    keyed_app: Flask, redis: Redis, stand_in: tuple[Keys, PubSub], renders: list[int]
) -> None:
    job = chat_job(" ".join(["fox"] * WINDOW))
    with keyed_request(keyed_app), pytest.raises(ContextLengthError):
        admit(keyed_app.extensions["mlxq.broker"], job, None)
    assert renders == [1]
    assert rq_queue(redis, stand_in[0].queue(MODEL)).jobs == []
