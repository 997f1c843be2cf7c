"""No input, however malformed, stops the worker from serving the requests after it."""

from __future__ import annotations

import openai
from redis import Redis
from rq import Queue
from rq.serializers import JSONSerializer

from shared.queue.config import Settings
from shared.queue.jobs import JOB_FUNCTION
from shared.queue.keys import Keys
from tests.support import MODEL

FRANCE = [{"role": "user", "content": "What is the capital of France?"}]


def test_garbage_job_payloads_do_not_break_the_worker(
    client: openai.OpenAI, settings: Settings, redis: Redis
) -> None:
    queue = Queue(
        Keys(settings.namespace).queue(MODEL), connection=redis, serializer=JSONSerializer
    )
    bad = [
        queue.enqueue_call(JOB_FUNCTION, args=({"nonsense": True},)),
        queue.enqueue_call(JOB_FUNCTION, args=("not a dict",)),
        queue.enqueue_call(JOB_FUNCTION, args=({"job_id": "x", "model": MODEL, "prompt": 7},)),
    ]
    reply = client.chat.completions.create(model=MODEL, messages=FRANCE, temperature=0)
    assert "Paris" in (reply.choices[0].message.content or "")
    for job in bad:
        job.refresh()
        assert job.get_status() in ("finished", "failed")


def test_many_concurrent_streams_each_get_their_own_complete_answer(client: openai.OpenAI) -> None:
    from concurrent.futures import ThreadPoolExecutor

    def ask(n: int) -> str:
        prompt = f"Count from 1 to {n}, separated by commas."
        reply = client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": prompt}],
            temperature=0,
            max_tokens=30,
        )
        return reply.choices[0].message.content or ""

    solo = {n: ask(n) for n in (3, 5)}
    with ThreadPoolExecutor(8) as pool:
        together = list(pool.map(ask, [3, 5] * 4))
    assert together == [solo[3], solo[5]] * 4
