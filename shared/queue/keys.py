"""Every Redis key, channel and RQ queue name mlxq uses, built here and nowhere else.

Layout under the namespace `ns` (default "mlxq"):

    {ns}:models                 zset  model name -> last heartbeat (unix s) of any worker serving it
    {ns}:workers:{model}        zset  worker id -> last heartbeat (unix s)
    {ns}:reply:{api_id}         channel  the events of every job an API process waits on: one
                                message per worker step, framed per job (shared/wire/events.py)
    {ns}:events:{job_id}        channel  the events of a job no API process waits on (a bulk job),
                                framed the same way
    {ns}:replay:{job_id}        list  every event of the job so far, in order (bounded TTL)
    {ns}:cancel                 channel  job ids to cancel, read by every worker
    {ns}:cancelled:{job_id}     string  set when a job is cancelled, for jobs not yet started
    {ns}:presence:{worker_id}   channel  a live worker process stays subscribed to it; when the
                                process dies its connection closes and PUBSUB NUMSUB drops to 0
    {ns}:dead:{worker_id}       string  tombstone: the worker was declared dead and its jobs taken
                                over; a worker that finds its own tombstone stops at once
    {ns}:reaped:{execution}     string  claim: one reaper (or watchdog) handles a lost execution
    {ns}:taking:{worker_id}     list  job ids a worker's slots moved off a queue and hold (popped,
                                then running) so that a worker dying between the two loses none
    {ns}:backlog:{model}        hash  queued interactive job id -> its estimated prompt tokens
    {ns}:backlog_tokens:{model} string  the sum of that hash (the queue's token cap reads it)
    {ns}:order:{model}          hash  queued interactive job id -> its place in the fair order
                                (shared/queue/fair_order.py): "{round} {priority} {share}"
    {ns}:rounds:{model}         hash  share (an API key's owner, or `user`) -> its last round
    {ns}:round:{model}          string  the round of the job taken last
    {ns}:blocks:{worker_id}     set  the prefix-block hashes
                                (shared/queue/prefix/prefix_blocks.py) of what the worker's
                                prefix cache holds or is computing; rewritten
                                each heartbeat, added to when a slot takes a job, with a TTL
    {ns}:prefix_asks:{worker_id} list  asks for a prefix cache this worker holds, from the
                                worker that took its job (worker/runtime/prefix/prefix_fetch.py)
    {ns}:lends:{worker_id}      string  the identity of the caches this worker lends (while its
                                lending thread runs, with a TTL)
    {ns}:prefix_reply:{ask_id}  list  the cache file asked for, in pieces, then an empty piece
    {ns}:placement:{model}      hash  queued interactive job id -> "{worker_id}|{unix s}": the
                                worker that holds its prefix takes it first, any worker after
                                that time (api/queue/placement.py, worker/runtime/intake/slots.py)
    {ns}:job_blocks:{model}     hash  queued interactive job id -> its prompt's block hashes,
                                comma-separated, added to its taker's blocks set when taken
    {ns}:hint:{model}:{hint}    string  the worker the last job of a placement hint (a scoped
                                `prompt_cache_key`: shared/queue/prefix/cache_scope.py) was
                                placed on, with a TTL (api/queue/placement.py)
    {ns}:tokenizer:{model}      hash  "spec": the model's TokenizerSpec
                                (shared/queue/prompt/prompt_tokens.py), "digest": its digest;
                                written by each worker serving the model
    {ns}:worker:{worker_id}     hash  a worker's report (shared/observe/fleet.py WorkerStats):
                                host, model, slots in use per lane, tokens/s; rewritten each
                                heartbeat, with a TTL of a few heartbeats so a dead worker's
                                report goes away
    {ns}:metrics:{model}        hash  the fleet's cumulative request figures for a model
                                (shared/observe/metrics.py): counters and histogram buckets,
                                added to by the worker that ends each job
    {ns}:refusals               hash  "{status}:{code}" -> HTTP 429/503 answers, every API process
    {ns}:recent_jobs            list  the last finished jobs (shared/observe/metrics.py JobRecord),
                                newest first, trimmed to a few dozen
    {ns}:history                list  the fleet's samples of the last minutes (shared/observe/
                                history.py StoredSample), newest first, trimmed, with a TTL
    {ns}:history:turn           string  held for one sample period by the worker taking the
                                fleet's sample, so the fleet takes one per period
    {ns}:pools                  zset  pool agent (a machine, shared/queue/pool.py) -> its last beat
    {ns}:pool:{machine}         string  the machine's pool report
                                (shared/wire/fleet/pool.py PoolReport): catalog with costs,
                                budget, loaded and loading models, loads and evictions;
                                rewritten each beat, with a TTL of a few beats
    {ns}:loading:{model}        string  the machine loading the model: one load at a time per
                                model in the fleet (SET NX, a TTL of the load's time limit)
    {ns}:load_failed:{model}    string  the last failed load of the model (shared/wire/fleet/pool.py
                                LoadFailure); the API ends the waits of jobs queued before it
    {ns}:pins                   set  pinned models: loaded and kept, never evicted (`mlxq pin`)
    {ns}:pool_orders            hash  model -> an operator's order (`mlxq load|unload`,
                                shared/wire/fleet/pool.py PoolOrder), read by every pool agent
    RQ queue "{ns}.{model}"     interactive jobs for one model (RQ prefixes its keys "rq:")
    RQ queue "{ns}.{model}.background"  background responses (and `service_tier: flex`):
                                workers take them only when the interactive queue is empty
    RQ queue "{ns}.{model}.batch"  batch lines: taken only when both others are empty
    RQ queue "{ns}.{model}.{lane}#{share}"  a bulk lane's (background, batch) jobs of one
                                share (a caller, shared/queue/fair_order.py), in arrival order;
                                the lane's own queue holds what is put back, and RQ's origin
                                of every job of the lane (shared/queue/turns.py)
    {ns}:turns:{lane}:{model}   zset  share -> when it was last served, for the shares of a bulk
                                lane with jobs (or served in the current round): the lowest
                                takes the next turn (shared/queue/turns.py)
    {ns}:response:{id}          hash  a stored response: owner, record
                                (shared/wire/responses/responses.py), cancelled;
                                TTL MLXQ_RESPONSE_TTL_S. Its events are the job's replay.
    {ns}:file:{id}              hash  a file: owner, object (shared/wire/batch/files.py), chunks,
                                chunk:0, chunk:1... (api/stores/files.py; `content` before chunks)
    {ns}:files:{owner}          zset  the owner's file ids -> created_at
    {ns}:batch:{id}             hash  a batch: owner, record, status, *_at times, counters, file ids
    {ns}:batch:{id}:lines       list  the custom_id of every input line, in input order
    {ns}:batch:{id}:results     hash  line index -> its output or error line; the first write wins
    {ns}:batch:{id}:finalizing  string  held by the batch's finalizer process, which writes its
                                output files (api/stores/batch_finalize.py); TTL 60 s, renewed
    {ns}:batches:{owner}        zset  the owner's batch ids -> created_at
    {ns}:ratelimit:{owner}      hash  an API key's rate-limit buckets (api/limits/rates.py):
                                requests and tokens left, and when (Redis ms); TTL 60 s
    {ns}:queued:{owner}         hash  what an API key with a queued-token limit holds
                                (shared/queue/queued_tokens.py): job id (or batch id) -> its
                                tokens; released when the job ends, the batch's per line
    {ns}:queued_until:{owner}   zset  the same entries -> when (Redis ms) each must have ended,
                                past which admission drops it (a lost release)
    {ns}:open:{owner}           zset  an API key's requests open now, where it has `:open=N`
                                (api/limits/open_requests.py): job id -> when (Redis ms) its
                                hold ends at the latest (an API process that died mid-request);
                                TTL: its longest entry
    {ns}:quota:{owner}:{kind}   zset  what an API key keeps of one kind (api/limits/quotas.py:
                                files, responses, batches, open_batches, background,
                                idempotency): object id -> when its hold ends (Redis ms), its
                                lifetime or its deadline; entries past it are trimmed at the
                                next check. TTL: its longest entry
    {ns}:usage:{owner}:{kind}   hash  the bytes of those objects, for a kind that counts them
                                (files): "total" -> their sum, "object:{id}" -> one object's;
                                TTL: as its kind's entries, never longer
    {ns}:written:{api_id}       string  written by an API process right before WAIT, so that the
                                WAIT covers every earlier write (api/stores/replicas.py)
    {ns}:owner_secret           string  the secret owner ids are derived from API keys with
                                (api/http/auth.py), made once by the first API process that
                                needs it unless MLXQ_OWNER_SECRET is set; no TTL
    {ns}:idempotency:{owner}:{digest}  string  an Idempotency-Key of the owner (its SHA-256): the
                                request it came with and, once answered, the answer
                                (api/stores/idempotency.py); TTL 24 h

Nothing from a request reaches a key unchecked: every part that can come from outside (a model
name, an id) must match `MODEL_NAME_PATTERN` or `ID_PATTERN` (no spaces, no glob characters, no
separators of other keys), and the key builders below refuse anything else with
`InvalidKeyPartError`. Callers validate first (`is_valid_id`, the request models); the builders'
check is the last line of defence against key injection.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from shared.wire.errors import InvalidKeyPartError
from shared.wire.ids import ID_PATTERN, MODEL_NAME_PATTERN

# RQ's prefix of a queue's list key (rq's `Queue.redis_queue_namespace_prefix`, checked by
# tests/shared/test_turns.py), written out: the engine imports this module, and never RQ.
RQ_QUEUE_PREFIX = "rq:queue:"
_MODEL_NAME = re.compile(MODEL_NAME_PATTERN.rstrip("$"))
_ID = re.compile(ID_PATTERN.rstrip("$"))


def is_valid_id(value: str) -> bool:
    """Whether `value` may be used as an id inside a key (check request ids with this)."""
    return _ID.fullmatch(value) is not None


def is_valid_model_name(value: str) -> bool:
    return _MODEL_NAME.fullmatch(value) is not None


def _id(value: str) -> str:
    if not is_valid_id(value):
        raise InvalidKeyPartError(f"invalid id {value[:64]!r}", param="id")
    return value


def _model(value: str) -> str:
    if not is_valid_model_name(value):
        raise InvalidKeyPartError(f"invalid model name {value[:64]!r}", param="model")
    return value


@dataclass(frozen=True)
class Keys:
    """The key builder for one namespace."""

    ns: str = "mlxq"

    def models(self) -> str:
        return f"{self.ns}:models"

    def model_kinds(self) -> str:
        """Hash: model name -> what it serves, `chat` or `embedding` (its workers set it)."""
        return f"{self.ns}:model-kinds"

    def pools(self) -> str:
        return f"{self.ns}:pools"

    def pool(self, machine: str) -> str:
        return f"{self.ns}:pool:{_model(machine)}"  # a host name

    def loading(self, model: str) -> str:
        return f"{self.ns}:loading:{_model(model)}"

    def load_failed(self, model: str) -> str:
        return f"{self.ns}:load_failed:{_model(model)}"

    def pins(self) -> str:
        return f"{self.ns}:pins"

    def pool_orders(self) -> str:
        return f"{self.ns}:pool_orders"

    def workers(self, model: str) -> str:
        return f"{self.ns}:workers:{_model(model)}"

    def events(self, job_id: str) -> str:
        return f"{self.ns}:events:{_id(job_id)}"

    def reply(self, api_id: str) -> str:
        return f"{self.ns}:reply:{_id(api_id)}"

    def replay(self, job_id: str) -> str:
        return f"{self.ns}:replay:{_id(job_id)}"

    def cancel_channel(self) -> str:
        return f"{self.ns}:cancel"

    def cancelled(self, job_id: str) -> str:
        return f"{self.ns}:cancelled:{_id(job_id)}"

    def prefix_blocks(self, worker_id: str) -> str:
        return f"{self.ns}:blocks:{worker_id}"

    def prefix_asks(self, worker_id: str) -> str:
        return f"{self.ns}:prefix_asks:{worker_id}"

    def lends(self, worker_id: str) -> str:
        return f"{self.ns}:lends:{worker_id}"

    def prefix_reply(self, ask_id: str) -> str:
        return f"{self.ns}:prefix_reply:{_id(ask_id)}"

    def placement(self, model: str) -> str:
        return f"{self.ns}:placement:{_model(model)}"

    def job_blocks(self, model: str) -> str:
        return f"{self.ns}:job_blocks:{_model(model)}"

    def cache_hint(self, model: str, hint: str) -> str:
        return f"{self.ns}:hint:{_model(model)}:{_id(hint)}"

    def tokenizer(self, model: str) -> str:
        return f"{self.ns}:tokenizer:{_model(model)}"

    def presence(self, worker_id: str) -> str:
        return f"{self.ns}:presence:{worker_id}"

    def dead(self, worker_id: str) -> str:
        return f"{self.ns}:dead:{worker_id}"

    def taking(self, worker_id: str) -> str:
        return f"{self.ns}:taking:{worker_id}"

    def reaped(self, execution: str) -> str:
        return f"{self.ns}:reaped:{execution}"

    def worker_stats(self, worker_id: str) -> str:
        return f"{self.ns}:worker:{worker_id}"

    def model_metrics(self, model: str) -> str:
        return f"{self.ns}:metrics:{_model(model)}"

    def refusals(self) -> str:
        return f"{self.ns}:refusals"

    def recent_jobs(self) -> str:
        return f"{self.ns}:recent_jobs"

    def history(self) -> str:
        return f"{self.ns}:history"

    def history_turn(self) -> str:
        return f"{self.ns}:history:turn"

    def backlog(self, model: str) -> str:
        return f"{self.ns}:backlog:{_model(model)}"

    def backlog_tokens(self, model: str) -> str:
        return f"{self.ns}:backlog_tokens:{_model(model)}"

    def order(self, model: str) -> str:
        return f"{self.ns}:order:{_model(model)}"

    def rounds(self, model: str) -> str:
        return f"{self.ns}:rounds:{_model(model)}"

    def round(self, model: str) -> str:
        return f"{self.ns}:round:{_model(model)}"

    def queue(self, model: str) -> str:
        return f"{self.ns}.{_model(model)}"

    def background_queue(self, model: str) -> str:
        return f"{self.ns}.{_model(model)}.background"

    def batch_queue(self, model: str) -> str:
        return f"{self.ns}.{_model(model)}.batch"

    def lane(self, model: str, lane: str) -> str:
        """The queue of a lane (shared/queue/jobs.py `Lane`): interactive, background or batch."""
        if lane == "background":
            return self.background_queue(model)
        return self.batch_queue(model) if lane == "batch" else self.queue(model)

    def share_queue(self, model: str, lane: str, share: str) -> str:
        """The RQ queue of one share's jobs in a bulk lane (shared/queue/turns.py). `#` is in
        neither a model name nor an id, so no other queue's name can be this one."""
        return f"{self.lane(model, lane)}#{_id(share)}"

    def share_queue_prefix(self, model: str, lane: str) -> str:
        """The Redis key of `share_queue` without its share: the scripts of shared/queue/turns.py
        add the share, which only they know."""
        return f"{RQ_QUEUE_PREFIX}{self.lane(model, lane)}#"

    def turns(self, model: str, lane: str) -> str:
        return f"{self.ns}:turns:{_id(lane)}:{_model(model)}"

    def lanes(self, model: str) -> list[str]:
        """A model's queues in the order workers take from them."""
        return [self.queue(model), self.background_queue(model), self.batch_queue(model)]

    def response(self, response_id: str) -> str:
        return f"{self.ns}:response:{_id(response_id)}"

    def file(self, file_id: str) -> str:
        return f"{self.ns}:file:{_id(file_id)}"

    def files(self, owner: str) -> str:
        return f"{self.ns}:files:{_id(owner)}"

    def batch(self, batch_id: str) -> str:
        return f"{self.ns}:batch:{_id(batch_id)}"

    def batch_lines(self, batch_id: str) -> str:
        return f"{self.ns}:batch:{_id(batch_id)}:lines"

    def batch_results(self, batch_id: str) -> str:
        return f"{self.ns}:batch:{_id(batch_id)}:results"

    def batch_finalizing(self, batch_id: str) -> str:
        return f"{self.ns}:batch:{_id(batch_id)}:finalizing"

    def batches(self, owner: str) -> str:
        return f"{self.ns}:batches:{_id(owner)}"

    def owner_secret(self) -> str:
        return f"{self.ns}:owner_secret"

    def idempotency(self, owner: str, key_digest: str) -> str:
        return f"{self.ns}:idempotency:{_id(owner)}:{_id(key_digest)}"

    def rate_limit(self, owner: str) -> str:
        return f"{self.ns}:ratelimit:{_id(owner)}"

    def queued_tokens(self, owner: str) -> str:
        return f"{self.ns}:queued:{_id(owner)}"

    def queued_until(self, owner: str) -> str:
        return f"{self.ns}:queued_until:{_id(owner)}"

    def open_requests(self, owner: str) -> str:
        return f"{self.ns}:open:{_id(owner)}"

    def quota(self, owner: str, kind: str) -> str:
        return f"{self.ns}:quota:{_id(owner)}:{_id(kind)}"

    def usage(self, owner: str, kind: str) -> str:
        return f"{self.ns}:usage:{_id(owner)}:{_id(kind)}"

    def written(self, api_id: str) -> str:
        return f"{self.ns}:written:{_id(api_id)}"
