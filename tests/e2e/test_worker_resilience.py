"""No input, however malformed, stops the worker from serving the requests after it."""

from __future__ import annotations

import openai
from redis import Redis
from rq import Queue
from rq.serializers import JSONSerializer

from shared.queue.config import Settings
from shared.queue.jobs import JOB_FUNCTION, JobOutcome
from shared.queue.keys import Keys
from tests.support import MODEL
from worker.ops.cluster import wait_until

FRANCE = [{"role": "user", "content": "What is the capital of France?"}]


def test_garbage_job_payloads_do_not_break_the_worker(
    client: openai.OpenAI, settings: Settings, redis: Redis
) -> None:
    queue = Queue(
        Keys(settings.namespace).queue(MODEL), connection=redis, serializer=JSONSerializer
    )
    # Not a generation job: refused before it is run, and failed.
    refused = queue.enqueue_call(JOB_FUNCTION, args=("not a dict",))
    # A generation job whose payload does not parse: ended at once with an error outcome.
    malformed = [
        queue.enqueue_call(JOB_FUNCTION, args=({"nonsense": True},)),
        queue.enqueue_call(JOB_FUNCTION, args=({"job_id": "x", "model": MODEL, "prompt": 7},)),
    ]
    reply = client.chat.completions.create(model=MODEL, messages=FRANCE, temperature=0)
    assert "Paris" in (reply.choices[0].message.content or "")
    wait_until(lambda: refused.get_status(refresh=True) == "failed", 10, "the refusal")
    assert "refused" in (refused.latest_result().exc_string or "")  # type: ignore[union-attr]
    wait_until(
        lambda: all(j.get_status(refresh=True) == "finished" for j in malformed),
        10,
        "the malformed jobs' end",
    )
    for job in malformed:
        outcome = JobOutcome.model_validate(job.return_value())
        assert (outcome.finish_reason, outcome.completion_tokens) == ("error", 0)


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
