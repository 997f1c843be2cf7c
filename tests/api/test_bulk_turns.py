"""The bulk lanes' turns (shared/queue/turns.py), on the session's real Redis: jobs queued as the
API queues them (`Broker.submit_bulk`) and taken as a worker's slot takes them
(worker/runtime/intake/slots.py), so the test runs the scripts the fleet runs: callers take
turns, what is put back goes first, a caller that trickles keeps its place in the round, and the
lane's depth, a job's position and its removal see every caller's list."""

from __future__ import annotations

from redis import Redis
from rq import Queue
from rq.serializers import JSONSerializer

from api.queue.broker import Broker, standalone
from shared.queue import turns
from shared.queue.config import Settings
from shared.queue.jobs import JOB_FUNCTION, GenerationJob, Lane
from shared.queue.keys import RQ_QUEUE_PREFIX, Keys
from shared.wire.batch.batches import BatchLine
from shared.wire.chat.completions import ChatMessage
from tests.support import MODEL, rq_queue
from worker.runtime.intake.slots import SlotWorker, make_slots

HI = [ChatMessage(role="user", content="hi")]


def job(job_id: str, share: str) -> GenerationJob:
    return GenerationJob(job_id=job_id, model=MODEL, messages=HI, share=share, replay_ttl_s=60)


def submit(broker: Broker, share: str, count: int, start: int = 0) -> None:
    broker.submit_bulk([job(f"resp_{share}{i}", share) for i in range(start, start + count)])


def bulk_slot(redis: Redis, keys: Keys) -> SlotWorker:
    (slot,) = make_slots(redis, keys, MODEL, f"{keys.ns}.1", count=1, interactive=0)
    return slot


def take(slot: SlotWorker) -> str:
    """The share of the next job the slot takes, then the job is done with."""
    taken = slot._take()
    assert taken is not None
    found, _ = taken
    slot.connection.lrem(slot.taking_key, 1, found.id)
    return str(found.args[0]["share"])


def waiting(redis: Redis, keys: Keys, lane: Lane = "background") -> int:
    lane_keys, prefix = turns.script_keys(keys, MODEL, lane)
    reply = redis.register_script(turns.WAITING)(keys=lane_keys, args=[prefix])
    return int(reply[0])


def test_callers_take_turns_whatever_each_has_queued(redis: Redis, app_settings: Settings) -> None:
    keys, broker = Keys(app_settings.namespace), standalone(app_settings)
    submit(broker, "alpha", 6)
    submit(broker, "beta", 2)
    submit(broker, "gamma", 1)
    slot = bulk_slot(redis, keys)
    order = [take(slot) for _ in range(9)]
    assert order == ["alpha", "beta", "gamma", "alpha", "beta"] + ["alpha"] * 4
    assert slot._take() is None
    assert redis.zcard(keys.turns(MODEL, "background")) == 0  # an empty lane keeps no turns


def test_a_caller_that_sends_each_job_after_its_last_is_taken_keeps_one_turn_a_round(
    redis: Redis, app_settings: Settings
) -> None:
    keys, broker = Keys(app_settings.namespace), standalone(app_settings)
    submit(broker, "alpha", 6)
    submit(broker, "beta", 1)
    slot = bulk_slot(redis, keys)
    order = [take(slot), take(slot)]
    submit(broker, "beta", 1, start=1)  # beta's list was empty: it keeps its place, not a new one
    order += [take(slot), take(slot), take(slot)]
    assert order == ["alpha", "beta", "alpha", "beta", "alpha"]


def test_what_is_put_back_on_the_lane_goes_before_any_callers_turn(
    redis: Redis, app_settings: Settings
) -> None:
    keys, broker = Keys(app_settings.namespace), standalone(app_settings)
    submit(broker, "alpha", 3)
    # As RQ's retry and the reaper's hand-back queue a job: on the lane's own RQ queue.
    lane = rq_queue(redis, keys.background_queue(MODEL))
    lane.enqueue_call(JOB_FUNCTION, args=(job("resp_back", "beta").model_dump(mode="json"),))
    slot = bulk_slot(redis, keys)
    assert take(slot) == "beta"
    assert take(slot) == "alpha"


def test_batch_lines_wait_in_their_own_lane_after_background_jobs(
    redis: Redis, app_settings: Settings
) -> None:
    keys, broker = Keys(app_settings.namespace), standalone(app_settings)
    line = job("resp_line", "alpha").model_copy(update={"batch_line": _line()})
    broker.submit_bulk([line])
    submit(broker, "beta", 1)
    assert (waiting(redis, keys, "background"), waiting(redis, keys, "batch")) == (1, 1)
    slot = bulk_slot(redis, keys)
    assert take(slot) == "beta"
    assert take(slot) == "alpha"


def test_depth_position_and_removal_see_every_callers_list(
    redis: Redis, app_settings: Settings
) -> None:
    keys, broker = Keys(app_settings.namespace), standalone(app_settings)
    submit(broker, "alpha", 5)
    submit(broker, "beta", 2)
    assert waiting(redis, keys) == 7
    # beta's second job: beta's first, and alpha's two turns before each of beta's.
    assert broker.bulk.position("resp_beta1", MODEL, "background", "beta") == 3
    assert broker.bulk.position("resp_alpha4", MODEL, "background", "alpha") == 6
    assert broker.bulk.position("resp_gone", MODEL, "background", "beta") is None
    assert broker.bulk.remove("resp_alpha2", MODEL, "background", None)
    assert not broker.bulk.remove("resp_alpha2", MODEL, "background", "alpha")
    assert waiting(redis, keys) == 6


def test_rq_lists_each_callers_waiting_jobs_and_records_them_on_the_lane(
    redis: Redis, app_settings: Settings
) -> None:
    keys, broker = Keys(app_settings.namespace), standalone(app_settings)
    submit(broker, "alpha", 3)
    queues = {q.name: q.count for q in Queue.all(connection=redis, serializer=JSONSerializer)}
    assert queues[keys.share_queue(MODEL, "background", "alpha")] == 3
    recorded = rq_queue(redis, keys.background_queue(MODEL)).fetch_job("resp_alpha0")
    assert recorded is not None and recorded.origin == keys.background_queue(MODEL)
    slot = bulk_slot(redis, keys)
    for _ in range(3):
        take(slot)
    assert slot._take() is None  # the empty caller leaves the turns and RQ's list of queues
    names = {q.name for q in Queue.all(connection=redis, serializer=JSONSerializer)}
    assert keys.share_queue(MODEL, "background", "alpha") not in names


def test_share_queue_keys_are_rqs() -> None:
    assert Queue.redis_queue_namespace_prefix == RQ_QUEUE_PREFIX
    keys = Keys("ns")
    assert keys.share_queue_prefix(MODEL, "batch") + "k1" == (
        rq_queue_key(keys.share_queue(MODEL, "batch", "k1"))
    )


def rq_queue_key(name: str) -> str:
    return f"{Queue.redis_queue_namespace_prefix}{name}"


def _line() -> BatchLine:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
    return BatchLine(
        batch_id="batch_t",
        index=0,
        custom_id="c0",
        endpoint="/v1/chat/completions",
        body=body,
        expires_at=2**31,
    )
