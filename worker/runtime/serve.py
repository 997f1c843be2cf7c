"""A worker process: load one model, then serve its RQ queues until told to stop.

Threads: the main thread runs the engine loop (worker/runtime/loop.py); B RQ slot threads dequeue
jobs (worker/runtime/intake/slots.py); a heartbeat announces the model
(worker/runtime/liveness/heartbeat.py); a listener
forwards cancellations and holds the worker's presence (worker/runtime/cancellations.py); a reaper
takes over the jobs of dead workers (worker/runtime/liveness/reaper.py); a watchdog watches the
loop's progress
(worker/runtime/liveness/watchdog.py). SIGTERM/SIGINT: drain (worker/runtime/liveness/drain.py),
deregister, exit 0. Exit statuses for a supervisor: 0 after a stop it was asked for; EXIT_WEDGED
when the engine loop crashed or stopped making progress (its jobs were handed back first);
EXIT_BURIED when other workers declared this one dead (it hung or slept) and took over its jobs.
"""

from __future__ import annotations

import faulthandler
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from redis.exceptions import RedisError

from shared.observe import tracing
from shared.queue import backlog
from shared.queue.config import Settings
from shared.queue.connection import connect, connect_blocking
from shared.queue.keys import Keys
from shared.queue.liveness import LIVE_FACTOR
from shared.queue.prompt.prompt_tokens import PromptCounter, TokenizerSpec
from shared.wire.fleet.catalog import ModelKind
from worker.engine.batch.quantized_kv import KVQuantization, kv_quantization, prompt_cache
from worker.engine.batch.token_batch import kv_form
from worker.engine.doubles.faults import FaultyEngine
from worker.engine.doubles.synthetic import SyntheticEngine
from worker.engine.doubles.synthetic_prefill import SyntheticPrefill, SyntheticPrefixCache
from worker.engine.embedding.download import (
    DEFAULT_EMBEDDER_NAME,
    ensure_default_embedder,
    is_embedder_dir,
)
from worker.engine.embedding.encoder import load_encoder
from worker.engine.embedding.engine import EmbeddingEngine, warm_up
from worker.engine.generation.engine import BatchEngine, Engine, EngineSettings
from worker.engine.hub import cached_folder
from worker.engine.model import Routes, load_model, load_tokenizer_only, native_folder
from worker.engine.prefix_cache import PrefixCache
from worker.engine.prefix_disk import DiskTier, open_tier
from worker.engine.prefix_disk_writer import WriteBounds
from worker.engine.prefix_identity import model_folder
from worker.engine.sequence.drafts import Speculation
from worker.gguf.default_model import DEFAULT_MODEL_NAME, ensure_default_model
from worker.runtime.cancellations import listen_for_cancels
from worker.runtime.intake.slots import (
    LEAVE_S,
    SlotWorker,
    held,
    make_slots,
    start_slots,
    stop_slots,
)
from worker.runtime.job_function import Runtime, bind
from worker.runtime.kinds.embedding_kind import EmbeddingKind
from worker.runtime.kinds.generation_kind import GenerationKind
from worker.runtime.liveness.drain import Drain
from worker.runtime.liveness.fence import FencedSink
from worker.runtime.liveness.heartbeat import beat, born, keep_beating, retire
from worker.runtime.liveness.reaper import Reaper
from worker.runtime.liveness.watchdog import Watchdog
from worker.runtime.loop import DrivenLoop
from worker.runtime.prefix.lend_tag import FleetKey
from worker.runtime.prefix.prefix_fetch import POP_S, FetchRule, PrefixFetch
from worker.runtime.prefix.prefix_lend import LendBounds, Lender
from worker.runtime.prefix.prefix_report import HeldPrefixes, PrefixFigures, PrefixReport
from worker.runtime.report import Reporter
from worker.runtime.tokenizer_spec import build_spec, publish_spec

log = logging.getLogger(__name__)

EXIT_WEDGED = 70  # EX_SOFTWARE
EXIT_BURIED = 75  # EX_TEMPFAIL
PRESENCE_WAIT_S = 10.0
LEND_JOIN_S = 5.0  # a lend in progress: its file's write, then its push
# A stop still going this long after the drain writes every thread's stack to the log: a stop
# was seen to hang there (before "stopped") until the pool's SIGKILL at 45 s, and said nothing.
STOP_DUMP_S = 20.0


def resolve_model(settings: Settings) -> tuple[str, str]:
    """(served name, what mlx_lm.load takes) for the configured model."""
    given = Path(settings.model).expanduser()
    if given.is_dir():
        return given.resolve().name, str(given)
    named = settings.models_dir / settings.model
    if named.is_dir():
        return settings.model, str(named)
    if settings.model == DEFAULT_MODEL_NAME:
        return settings.model, str(ensure_default_model(settings.models_dir))
    if settings.model == DEFAULT_EMBEDDER_NAME:
        return settings.model, str(ensure_default_embedder(settings.models_dir))
    cached = cached_folder(settings.model)  # a hub id: its cached snapshot, no network
    return settings.model, str(cached) if cached else settings.model


def build_engine(
    settings: Settings,
) -> tuple[str, BatchEngine | EmbeddingEngine, TokenizerSpec | None, HeldPrefixes | None]:
    """(served model name, engine, what the API needs to count its prompts, its prefix cache):
    the configured model (an embedding engine for a sentence-transformers directory: no prefix
    cache), or the synthetic engine (`build_synthetic`)."""
    if settings.engine == "synthetic":
        return build_synthetic(settings)
    name, source = resolve_model(settings)
    log.info("loading %s from %s", name, source)
    started = time.perf_counter()
    if is_embedder_dir(Path(source)):
        embedder = EmbeddingEngine(load_encoder(Path(source)), settings.embed_batch)
        warm_up(embedder)
        log.info("loaded embedding model %s in %.1f s", name, time.perf_counter() - started)
        return name, embedder, None, None
    exps = Routes(settings.cpu_prefill, settings.cpu_decode)
    native = native_folder(settings.models_dir) if settings.cpu_matvec else None
    loaded = load_model(source, exps, native)
    log.info("loaded %s in %.1f s", name, time.perf_counter() - started)
    kv = kv_form(
        loaded.model, settings.batch, kv_quantization(settings.kv_bits, settings.kv_group_size)
    )
    prefixes = (
        PrefixCache(
            loaded.model,
            settings.prefix_cache_entries,
            settings.prefix_cache_mb << 20,
            disk_tier(settings, source, loaded.model, kv),
            kv,
        )
        if settings.prefix_cache_entries
        else None
    )
    engine_class = FaultyEngine if settings.fault_injection else Engine
    engine = engine_class(loaded, engine_settings(settings, kv), prefixes)
    return name, engine, build_spec(loaded.tokenizer, loaded.context_length), prefixes


def engine_settings(settings: Settings, kv: KVQuantization | None = None) -> EngineSettings:
    """The engine's part of the worker's settings, `kv` the KV form it keeps (`kv_form`): how
    the worker runs its engine, and how the benchmarks run theirs."""
    speculation = None
    if settings.speculation_tokens:
        speculation = Speculation(settings.speculation_tokens, settings.speculation_rows)
    return EngineSettings(
        rows=settings.batch_size,
        default_max_tokens=settings.default_max_tokens,
        prefill_tokens=settings.prefill_tokens,
        batch=settings.batch,
        kv_tokens=settings.kv_tokens,
        prefill_tokens_decoding=settings.prefill_tokens_decoding,
        prefill_seconds_decoding=settings.prefill_seconds_decoding,
        prefill_burst=settings.prefill_burst,
        kv_quantization=kv,
        speculation=speculation,
        # The rows a slot may give a bulk job (worker/runtime/intake/slots.py `make_slots`).
        job_rows=settings.batch_size - min(settings.interactive_slots, settings.batch_size - 1),
    )


def disk_tier(
    settings: Settings, source: str, model: Any, kv: KVQuantization | None
) -> DiskTier | None:
    """The prefix cache's disk tier for the model loaded from `source`, its caches in `kv`'s
    form (None: it is off)."""
    if not settings.prefix_cache_disk_mb:
        return None
    folder = model_folder(source)
    tier = open_tier(
        settings.prefix_cache_dir,
        folder,
        model,
        settings.prefix_cache_disk_mb << 20,
        prompt_cache(model, kv),
        WriteBounds(
            settings.prefix_cache_disk_queue_mb << 20, settings.prefix_cache_disk_write_mb_s * 1e6
        ),
    )
    log.info("prefix cache on disk: %s (%d files)", tier.folder, len(tier))
    return tier


def build_synthetic(
    settings: Settings,
) -> tuple[str, SyntheticEngine, TokenizerSpec | None, HeldPrefixes | None]:
    """The synthetic engine: without a prefill model, no tokenizer published and no cache;
    with one, the served model's tokenizer (published as a real worker's) and a prefix cache."""
    step_s, cost = settings.synthetic_step_s, settings.synthetic_prefill_s_per_token
    if not cost:
        log.warning("SYNTHETIC engine: no model, tokens every %.3f s", step_s)
        return settings.model, SyntheticEngine(step_s, settings.default_max_tokens), None, None
    name, source = resolve_model(settings)
    tokenizer, context_length = load_tokenizer_only(source)
    spec = build_spec(tokenizer, context_length)
    if spec.tokenizer_json is None:
        raise SystemExit(f"the synthetic prefill model needs {name}'s tokens counted exactly")
    entries = settings.prefix_cache_entries
    cache = SyntheticPrefixCache(entries) if entries else None
    prefill = SyntheticPrefill(PromptCounter(spec), cache, cost, settings.prefill_tokens)
    log.warning(
        "SYNTHETIC engine: no model, tokens every %.3f s, %s's tokenizer, prefill %.4f s/token",
        step_s,
        name,
        cost,
    )
    return name, SyntheticEngine(step_s, settings.default_max_tokens, prefill), spec, cache


def serve(settings: Settings) -> None:
    tracing.setup("mlxq-worker")
    name, engine, spec, prefixes = build_engine(settings)
    keys = Keys(settings.namespace)
    redis = connect(settings)
    if spec is not None:
        _until_redis_answers(lambda: publish_spec(redis, keys, name, spec))
    replay_ttl_s = settings.replay_ttl_s
    worker_id = f"{socket.gethostname()}.{os.getpid()}"
    buried = "declared dead by the other workers"
    sink = FencedSink(
        redis,
        replay_ttl_s,
        keys,
        worker_id,
        gap_s=LIVE_FACTOR * settings.heartbeat_s,
        on_buried=lambda: die(EXIT_BURIED, buried),
    )
    release = redis.register_script(backlog.RELEASE)
    timeout_s = float(settings.job_timeout_s)
    figures = PrefixFigures()
    plumbing = (sink, redis, keys, timeout_s, release, worker_id)
    # A runtime of each kind under its own name: one name for both would make mypy type it
    # Runtime[Any, ...] and stop checking that the kind fits its engine.
    loop: DrivenLoop
    kind: ModelKind  # what the worker announces its model is: what its job kind serves
    if isinstance(engine, EmbeddingEngine):  # no prefix cache: no figures of one
        embedding = Runtime.start(EmbeddingKind(), engine, *plumbing)
        loop, kind, recency = bind(embedding), embedding.kind.serves, embedding.recency
    else:
        prefetch = prefix_fetch(settings, keys, name, worker_id, prefixes)
        generation = Runtime.start(GenerationKind(), engine, *plumbing, figures, prefetch)
        loop, kind, recency = bind(generation), generation.kind.serves, generation.recency

    services = threading.Event()  # stops the heartbeat, listener and reaper
    # Stops the watchdog as the loop stops: a loop that was told to stop steps no more by design,
    # and what it still holds is handed back below, however long Redis takes to answer.
    stepping = threading.Event()
    slots: list[SlotWorker] = []
    reaper = Reaper(
        redis,
        keys,
        name,
        worker_id,
        settings.heartbeat_s,
        replay_ttl_s,
        held=lambda: held(slots),
        cancel=loop.cancel,
    )

    def die(status: int, why: str) -> None:
        """End the process now, from any thread, after handing its jobs on."""
        log.critical("worker %s: %s; exiting with status %d", worker_id, why, status)
        if status == EXIT_WEDGED:
            try:
                log.info(
                    "failed %d jobs",
                    reaper.hand_back(worker_id, why, died=True, interactive_only=True),
                )
                if stop_slots(slots, wait_s=LEAVE_S):  # else the live workers' reapers will
                    log.info("requeued %d jobs", reaper.hand_back(worker_id, why, died=True))
                retire(redis, keys, name, worker_id)
            except Exception:
                log.exception("could not hand the jobs back")
        logging.shutdown()
        os._exit(status)

    _until_redis_answers(lambda: born(redis, keys, worker_id, name, kind))
    blocking = connect_blocking(settings)
    present = listen_for_cancels(blocking, keys, loop, worker_id, services)
    lending = start_lending(settings, keys, worker_id, prefixes, services)
    if not present.wait(PRESENCE_WAIT_S):
        log.warning("presence not confirmed yet (Redis slow?); serving anyway")
    drafts = engine.drafts if isinstance(engine, Engine) else None
    reporter = Reporter(
        loop,
        lambda: held(slots),
        keys,
        name,
        worker_id,
        settings.batch_size,
        figures,
        recency,
        drafts,
    )
    # An embedding worker (or a synthetic one without its prefill model) has no prefix cache: it
    # publishes no blocks.
    advertised = PrefixReport(prefixes, keys, worker_id) if prefixes is not None else None
    # Known before it takes a job: then it can be reaped.
    _until_redis_answers(
        lambda: beat(
            redis, keys, name, worker_id, reporter.stats(), settings.heartbeat_s, advertised
        )
    )
    keep_beating(
        redis,
        keys,
        name,
        worker_id,
        settings.heartbeat_s,
        services,
        on_tombstone=lambda: die(EXIT_BURIED, buried),
        report=reporter.stats,
        prefixes=advertised,
    )
    size, interactive = settings.batch_size, settings.interactive_slots
    made = make_slots(blocking, keys, name, worker_id, size, interactive, settings.heartbeat_s)
    slots += start_slots(made)
    reaper.run(services)
    Watchdog(
        loop, settings.watchdog_s, lambda stall: die(EXIT_WEDGED, f"wedged: {stall.describe()}")
    ).start(stepping)
    drain = Drain(slots, loop, settings.drain_timeout_s)
    drain.on_signals()
    log.info("worker %s serving %s with %d slots", worker_id, name, settings.batch_size)

    try:
        loop.run(drain.loop_stop)
    except Exception:
        log.exception("the engine loop crashed")
        die(EXIT_WEDGED, "the engine loop crashed")
    stepping.set()
    faulthandler.dump_traceback_later(STOP_DUMP_S)
    left = stop_slots(slots, wait_s=LEAVE_S)
    why = "the worker shut down before finishing it"
    try:
        handed = reaper.hand_back(worker_id, why, died=False, interactive_only=not left)
        services.set()
        retire(redis, keys, name, worker_id)
    except RedisError as err:  # the live workers' reapers will hand them on instead
        log.warning("could not hand back or deregister: %s", err)
        return
    finally:  # its jobs handed on first: they need not wait for the disk
        keep_on_disk(prefixes, lending)
    faulthandler.cancel_dump_traceback_later()
    log.info("worker %s stopped (%d jobs handed back)", worker_id, handed)


def prefix_fetch(
    settings: Settings,
    keys: Keys,
    name: str,
    worker_id: str,
    prefixes: HeldPrefixes | None,
) -> PrefixFetch | None:
    """How this worker fetches what other workers' caches hold (None: off, or no disk tier)."""
    if not isinstance(prefixes, PrefixCache) or prefixes.disk is None or not settings.prefix_fetch:
        return None
    rule = FetchRule(
        settings.prefill_s_per_token, prefixes.disk.token_bytes, settings.prefix_fetch_mb_s * 1e6
    )
    # Its pops wait up to POP_S, longer than a call's timeout.
    blocking = connect_blocking(settings, read_timeout_s=POP_S + settings.redis_timeout_s)
    bounds, fleet = _lend_bounds(settings), FleetKey.configured(settings.fleet_secret)
    return PrefixFetch(
        blocking, keys, name, worker_id, settings.heartbeat_s, prefixes, rule, bounds, fleet
    )


def start_lending(
    settings: Settings,
    keys: Keys,
    worker_id: str,
    prefixes: HeldPrefixes | None,
    stop: threading.Event,
) -> Lender | None:
    """Answer other workers' asks for what this worker's cache holds, until `stop` (None: it
    does not lend)."""
    if not isinstance(prefixes, PrefixCache) or prefixes.disk is None:
        return None
    if not settings.prefix_fetch:
        return None
    fleet = FleetKey.configured(settings.fleet_secret)
    lender = Lender(
        connect_blocking(settings), keys, worker_id, prefixes, _lend_bounds(settings), fleet
    )
    lender.start(stop)
    return lender


def _lend_bounds(settings: Settings) -> LendBounds:
    return LendBounds(settings.prefix_fetch_max_mb << 20, settings.prefix_fetch_in_flight_mb << 20)


def keep_on_disk(prefixes: HeldPrefixes | None, lender: Lender | None) -> None:
    """Write all the prefix cache holds to its disk tier, for the next worker on its folder,
    once its lending has stopped (no lend half done as the cache closes)."""
    if lender is not None:
        lender.close(LEND_JOIN_S)
    if isinstance(prefixes, PrefixCache) and prefixes.disk is not None:
        started = time.perf_counter()
        prefixes.close()
        log.info("prefix cache kept on disk in %.1f s", time.perf_counter() - started)


def _until_redis_answers(step: Callable[[], object]) -> None:
    """Run a start-up step, waiting for Redis if it is down (a worker may start first)."""
    while True:
        try:
            step()
            return
        except RedisError as err:
            log.warning("waiting for Redis: %s", err)
            time.sleep(1.0)
