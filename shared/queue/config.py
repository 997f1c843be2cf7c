"""Configuration from the environment: every setting, its default and its variable, in one place.

Processes build a `Settings` once at start (`Settings()` reads the environment) and pass it
down explicitly; tests construct one directly. The configuration table of docs/operations.md
mirrors this.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from shared.wire.fleet.keep_alive import KeepAlive


def _default_models_dir() -> Path:
    return Path.home() / ".cache" / "mlxq" / "models"


def _default_prefix_cache_dir() -> Path:
    return _default_models_dir().parent / "prefix-cache"


def _default_redis_dir() -> Path:
    data_home = os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share"
    return Path(data_home) / "mlxq" / "redis"


# A limit at the end of an MLXQ_API_KEYS entry: `sk-key:rpm=60:tpm=40000:queued=90000:open=8`.
_KEY_LIMIT = re.compile(r":(rpm|tpm|queued|open)=([0-9]+)$")
# The prefix cache scope an entry shares with the other keys naming it: `sk-key:cache=team`.
_KEY_CACHE = re.compile(r":cache=([A-Za-z0-9_.-]{1,64})$")


class KeyLimits(BaseModel):
    """The limits of one API key (api/limits/rates.py); None: none. Requests and tokens per
    minute, and `queued`: the most tokens its accepted but unfinished jobs may hold at once
    (OpenAI's batch queue limit, here over every lane: shared/queue/queued_tokens.py), and
    `open`: the most requests it may have open at once, streams included
    (api/limits/open_requests.py)."""

    model_config = ConfigDict(frozen=True)

    rpm: int | None = Field(default=None, ge=1)
    tpm: int | None = Field(default=None, ge=1)
    queued: int | None = Field(default=None, ge=1)
    open: int | None = Field(default=None, ge=1)

    @property
    def per_minute(self) -> bool:
        """Whether the key has requests or tokens per minute (and so the x-ratelimit headers)."""
        return self.rpm is not None or self.tpm is not None

    def __bool__(self) -> bool:
        return self.per_minute or self.queued is not None or self.open is not None


class ApiKey(BaseModel):
    """One entry of MLXQ_API_KEYS: a key, and after it, in any order, its limits (`:rpm=N`,
    `:tpm=N`, `:queued=N`, `:open=N`) and the name of the prefix cache scope it shares with the
    other keys naming it (`:cache=NAME`; none: the key's cache is its own,
    shared/queue/prefix/cache_scope.py)."""

    model_config = ConfigDict(frozen=True)

    key: SecretStr
    limits: KeyLimits = KeyLimits()
    cache: str | None = None

    @classmethod
    def parse(cls, entry: str) -> ApiKey:
        key, limits, cache = entry, {}, None
        while True:
            if (found := _KEY_LIMIT.search(key)) is not None:
                limits[found.group(1)] = int(found.group(2))
            elif (found := _KEY_CACHE.search(key)) is not None:
                cache = found.group(1)
            else:
                break
            key = key[: found.start()]
        return cls(key=SecretStr(key), limits=KeyLimits.model_validate(limits), cache=cache)


def _split_commas(value: Any) -> Any:
    """A comma-separated variable as a tuple of its non-empty items."""
    if isinstance(value, str):
        return tuple(item.strip() for item in value.split(",") if item.strip())
    return value


class QueueSettings(BaseModel):
    """The queue and its Redis: where jobs meet, how long what is stored lives, placement."""

    redis_url: str = Field(
        default="redis://127.0.0.1:6379/0",
        validation_alias=AliasChoices("REDIS_URL", "MLXQ_REDIS_URL"),
    )
    # `mlxq run` only: where the Redis it starts (when none answers at REDIS_URL) keeps its
    # append-only file.
    redis_dir: Path = Field(default_factory=_default_redis_dir)
    namespace: str = Field(default="mlxq", pattern=r"^[A-Za-z0-9_.-]{1,32}$")
    heartbeat_s: float = Field(default=2.0, gt=0)
    redis_timeout_s: float = Field(default=1.5, gt=0)
    # With replicas behind Sentinel: a creating POST is answered once this many replicas hold
    # its writes, waiting at most redis_wait_ms (api/stores/replicas.py); 0: answer at once.
    redis_wait_replicas: int = Field(default=0, ge=0)
    redis_wait_ms: int = Field(default=200, ge=1)
    # Every open stream or busy slot may hold a connection at once.
    redis_max_connections: int = Field(default=2048, ge=16)
    # Prefix-aware placement (api/queue/placement.py): the longest an interactive job waits for the
    # worker holding its prefix (0: placement off), and the prefill time a cached token saves.
    placement_wait_s: float = Field(default=2.0, ge=0)
    prefill_s_per_token: float = Field(default=0.0044, gt=0)
    bulk_retries: int = Field(default=2, ge=0)
    # How often a batch line is retried on another worker when its worker dies.
    batch_line_retries: int = Field(default=3, ge=0)
    job_timeout_s: int = Field(default=3600, ge=1)
    result_ttl_s: int = Field(default=600, ge=1)
    # Stored responses (and their event logs), batches and files.
    response_ttl_s: int = Field(default=24 * 3600, ge=60)
    batch_ttl_s: int = Field(default=7 * 24 * 3600, ge=3600)
    # A file's content is kept in chunks of at most this (api/stores/files.py): no file needs
    # one Redis value (capped at 512 MB) as large as itself, and none is read or written whole.
    file_chunk_bytes: int = Field(default=4 * 1024 * 1024, ge=1)

    @property
    def replay_ttl_s(self) -> int:
        """How long a job's replay log lives: as long as it may run, then as long as RQ keeps
        its result."""
        return self.job_timeout_s + self.result_ttl_s


class LimitSettings(BaseModel):
    """Limits: what the queue takes, how long a request waits and a job runs, body sizes."""

    # The queue's caps (shared/queue/backlog.py): its jobs, and their prompt tokens.
    queue_cap: int = Field(default=1024, ge=1)
    queue_token_cap: int = Field(default=262_144, ge=1)
    retry_after_s: int = Field(default=2, ge=1)
    queue_timeout_s: float = Field(default=120.0, gt=0)
    run_limit_s: float = Field(default=600.0, gt=0)
    run_limit_action: Literal["length", "error"] = "length"
    # How long an API request waits between two events of a running job.
    event_timeout_s: float = Field(default=120.0, gt=0)
    default_max_tokens: int = Field(default=4096, ge=1)
    max_body_bytes: int = Field(default=8 * 1024 * 1024, ge=1024)
    max_file_bytes: int = Field(default=100 * 1024 * 1024, ge=1024)
    # The requests one batch may hold: OpenAI's 50,000; lower it to bound what one batch queues.
    batch_max_lines: int = Field(default=50_000, ge=1, le=50_000)
    # A request's images (shared/wire/images.py), each bounded before it is decoded. 20 MB an
    # image is OpenAI's vision guide's figure (Anthropic's API takes 5 MB); 16 a request is below
    # Anthropic's 100 and OpenAI's 500 (vLLM's `--limit-mm-per-prompt` bounds it per model); 33
    # megapixels is 8K UHD (7680 x 4320), under Anthropic's 8000 x 8000 and under Pillow's own
    # decompression-bomb bound (Image.MAX_IMAGE_PIXELS, 89 megapixels). The body's cap
    # (max_body_bytes) bounds them all together first: base64 is 4/3 of the bytes.
    image_max_bytes: int = Field(default=20 * 1024 * 1024, ge=1)
    image_max_per_request: int = Field(default=16, ge=0)
    image_max_pixels: int = Field(default=7680 * 4320, ge=1)
    # Image URLs that are not data URLs: "off" refuses them (400 naming the part); "allow" is
    # refused too, saying that fetching is not built yet. Never an image silently dropped.
    image_urls: Literal["off", "allow"] = "off"


class QuotaSettings(BaseModel):
    """What one key may keep in Redis at once (api/limits/quotas.py); 0: no limit. Without keys
    the one local owner has them too. Each bounds one key whatever the others do; what Redis
    needs for all of them together is keys x quotas (docs/operations.md, "Security and
    limits")."""

    # Files (uploads and batch outputs) and their bytes: 1 GiB is ten of the largest uploads
    # (MLXQ_MAX_FILE_BYTES), and keeps one key from filling a Redis of a few GiB.
    quota_files: int = Field(default=10_000, ge=0)
    quota_file_bytes: int = Field(default=1024**3, ge=0)
    # Stored responses (each its request and its event log, MLXQ_RESPONSE_TTL_S): about seven a
    # minute, every minute of a day.
    quota_responses: int = Field(default=10_000, ge=0)
    # Their records' bytes (the request: its input items, instructions, tools, schemas). 256 MiB
    # is 10,000 responses of 26 KiB, or about 40 carrying a 6 MiB schema: one key's responses
    # alone no longer fill a Redis of a few GiB.
    quota_response_bytes: int = Field(default=256 * 1024**2, ge=0)
    # Batches kept (any status, MLXQ_BATCH_TTL_S), and those not ended: each open one holds its
    # lines' jobs, a copy of its input, in the queue.
    quota_batches: int = Field(default=1_000, ge=0)
    quota_open_batches: int = Field(default=10, ge=0)
    # Background responses queued or in progress: their lane has no cap of its own.
    quota_background: int = Field(default=100, ge=0)
    # Idempotency-Key records (each keeps its whole answer for 24 h).
    quota_idempotency_keys: int = Field(default=10_000, ge=0)
    # Their kept answers' bytes: a chat completion with n=128 keeps megabytes for a day.
    quota_idempotency_bytes: int = Field(default=256 * 1024**2, ge=0)


class WorkerSettings(BaseModel):
    """A worker and its engine: what it serves, its batch, prefill, KV, prefix cache, shutdown."""

    models_dir: Path = Field(default_factory=_default_models_dir)
    # What a worker serves: a model directory, a name under models_dir, or a hub id.
    model: str = "SmolLM2-135M-Instruct"
    # `mlxq run` only: the models to serve, one worker process each (comma-separated in
    # MLXQ_MODELS); none: MLXQ_MODEL and MLXQ_EMBEDDING_MODEL.
    models: Annotated[tuple[str, ...], NoDecode] = ()
    # `mlxq run` only, without MLXQ_MODELS: the embedding model served beside MLXQ_MODEL
    # (worker/engine/embedding/download.py); empty: none.
    embedding_model: str = "all-MiniLM-L6-v2"
    # "mlx" runs the model; "synthetic" emits timestamp tokens (relay benchmarks only).
    engine: Literal["mlx", "synthetic"] = "mlx"
    synthetic_step_s: float = Field(default=0.05, gt=0)
    # Above 0, the synthetic engine models prefill (worker/engine/doubles/synthetic_prefill.py): the
    # served model's tokenizer, a prefix cache, and this many seconds per uncached prompt token.
    synthetic_prefill_s_per_token: float = Field(default=0.0, ge=0)
    batch_size: int = Field(default=32, ge=1, le=1024)
    # An embedding worker: inputs encoded together in one forward, from any of its jobs.
    embed_batch: int = Field(default=64, ge=1, le=2048)
    # Slots of each worker that take only interactive jobs (at most batch_size - 1).
    interactive_slots: int = Field(default=2, ge=0)
    # Prompt tokens one step prefills at most (worker/engine/batch/mlx_lm_prefill.py), and at most
    # while other sequences decode: their next token waits for that step's prefill (256:
    # measured, 67aa90f's README, "The prefill budget while sequences decode"). While they
    # decode, a step also prefills only what takes about `prefill_seconds_decoding` at the rate
    # its prefill ran lately: machines differ tenfold in prefill speed (67aa90f's README, "The
    # prefill budget in time").
    prefill_tokens: int = Field(default=4096, ge=1)
    prefill_tokens_decoding: int = Field(default=256, ge=1)
    prefill_seconds_decoding: float = Field(default=0.4, gt=0)
    # While more interactive sequences wait for their first token than stream their next, whole
    # short prompts are prefilled up to `prefill_tokens` a step, past the time: the few running
    # streams pause once and a burst starts together (docs/benchmarks.md, "Short bursts").
    prefill_burst: bool = True
    # Speculative decoding in the slot batch (worker/engine/sequence/drafts.py): each sequence
    # drafts up to this many tokens by n-gram prompt lookup, verified exactly; 0: off. Only
    # while a step decodes at most `speculation_rows` rows (more: the step is compute-bound).
    # On by default: on the README stack it gave 2.9-3.8x the tokens/s of off at c=1 on copying
    # and was not slower on short chats at c=1 and c=16 (docs/benchmarks.md).
    speculation_tokens: int = Field(default=5, ge=0, le=16)
    speculation_rows: int = Field(default=2, ge=1)
    # The batch under the engine (worker/engine/batch/token_batch.py): mlxq's own slots, or mlx-lm's
    # BatchGenerator (always used for models whose cache is not a plain KV cache).
    batch: Literal["slots", "mlx-lm"] = "slots"
    # KV positions the slot batch's sequences share (rows x the longest row's positions): a
    # sequence waits for room, one that could never fit is refused; None: no bound but each
    # sequence's window. The pool sets it per model (MLXQ_POOL_KV_TOKENS).
    kv_tokens: int | None = Field(default=None, ge=1)
    # The slot batch's KV quantized to this many bits (0, 4 or 8), group-wise as mx.quantize
    # (worker/engine/batch/quantized_kv.py): 0 keeps the model's dtype.
    kv_bits: int = Field(default=0, ge=0, le=8, multiple_of=4)
    kv_group_size: int = 64
    # KV caches of prompts seen before, per worker (worker/engine/prefix_cache.py); 0 entries: off.
    prefix_cache_entries: int = Field(default=64, ge=0)
    prefix_cache_mb: int = Field(default=512, ge=1)
    # Its disk tier (worker/engine/prefix_disk.py): what memory evicts, and all of it at
    # shutdown, kept in this folder beside the models, at most this many MiB over every model's
    # files (least recently used removed first), and restored after a restart; 0 MiB: off.
    prefix_cache_dir: Path = Field(default_factory=_default_prefix_cache_dir)
    prefix_cache_disk_mb: int = Field(default=4096, ge=0)
    # Its writer writes each cache soon after memory takes it in (write-behind: a crash keeps it),
    # with at most this many MiB of caches waiting (more are dropped, never waited for) and at
    # most this many MB written a second, so its copies leave the engine the cores it steps on
    # (worker/engine/prefix_disk_writer.py). A 2,000-token cache of the default model: 92 MB.
    prefix_cache_disk_queue_mb: int = Field(default=256, ge=0)
    prefix_cache_disk_write_mb_s: float = Field(default=100.0, gt=0)
    # With a disk tier: a worker fetches a prompt's cache from the worker holding it instead of
    # prefilling it, where the transfer, at this rate until one is measured, is clearly faster
    # (worker/runtime/prefix/prefix_fetch.py); and lends what it holds to the others. The rate, end
    # to end (the holder's write included): 41-65 MB/s measured over loopback on 2 busy cores.
    prefix_fetch: bool = True
    prefix_fetch_mb_s: float = Field(default=50.0, gt=0)
    # The most MiB of one lent cache file, and of the files a lender has put into Redis within
    # a reply's life (30 s): Redis holds every key's data, so a fetch never fills it.
    prefix_fetch_max_mb: int = Field(default=512, ge=1)
    prefix_fetch_in_flight_mb: int = Field(default=1024, ge=1)
    # The secret a lent cache file is tagged with and checked under (HMAC-SHA256, bound to its
    # ask: worker/runtime/prefix/lend_tag.py), so that only a worker holding it can feed another
    # KV. From the environment only, never Redis: whoever writes to Redis is what it keeps out.
    # None (or empty): files go untagged and any answer is taken, as before it existed.
    fleet_secret: SecretStr | None = None
    drain_timeout_s: float = Field(default=30.0, ge=0)
    watchdog_s: float = Field(default=60.0, gt=0)
    fault_injection: bool = False

    @field_validator("models", mode="before")
    @classmethod
    def _split_commas(cls, value: Any) -> Any:
        return _split_commas(value)

    @field_validator("kv_group_size")
    @classmethod
    def _kv_group_size(cls, value: int) -> int:
        if value not in (32, 64, 128):  # the group sizes mx.quantize takes
            raise ValueError("a KV quantization group is 32, 64 or 128 values")
        return value

    def served_models(self) -> list[str]:
        """What `mlxq run` serves: MLXQ_MODELS, or else MLXQ_MODEL and MLXQ_EMBEDDING_MODEL."""
        return list(self.models) or [self.model, *filter(None, [self.embedding_model])]


class PoolSettings(BaseModel):
    """The model pool (worker/pool/): the catalog a machine may serve, its memory budget, and
    how models are loaded and unloaded on demand."""

    # The catalog: every model folder under models_dir (`catalog_scan`), and these (names under
    # models_dir or folders), each maybe with options after it:
    # `name:rows=32:kv=65536:keep_alive=10m:pin` (worker/pool/catalog.py).
    catalog: Annotated[tuple[str, ...], NoDecode] = ()
    catalog_scan: bool = True
    # MiB the pool's workers may take together (weights, KV, prefix caches, headroom); None: a
    # share of the machine (`pool_budget_share` of its RAM; of MLX's recommended working set on
    # a Mac).
    pool_budget_mb: int | None = Field(default=None, ge=1)
    pool_budget_share: float = Field(default=0.75, gt=0, le=1)
    # Each loaded chat model's most sequences at once, and the KV positions they share, unless
    # its catalog entry says otherwise (`rows=`, `kv=`): fixed per entry, so that no request
    # option forces a reload. Every model serves its own context window; None: a fifth of the
    # pool's budget, at least 4,096 positions (worker/pool/catalog.py `default_kv_tokens`).
    # 32 rows: docs/benchmarks.md, "Short bursts".
    pool_rows: int = Field(default=32, ge=1, le=1024)
    pool_kv_tokens: int | None = Field(default=None, ge=16)
    # MiB per worker process besides weights, KV and prefix cache (Python, MLX, the tokenizer,
    # a forward's activations): measured in docs/operations.md.
    pool_headroom_mb: int = Field(default=512, ge=0)
    # How long an idle model stays loaded (Ollama's keep_alive: "5m", seconds, 0, -1 forever).
    keep_alive: KeepAlive = 300.0
    # The longest a request's keep_alive may keep a model (a key that is not an operator's;
    # shared/wire/fleet/keep_alive.py `asked`).
    keep_alive_max: KeepAlive = 3600.0
    # A model's queue must outrun its workers this long before another replica loads, and a
    # model loaded less than `pool_cooldown_s` ago is not evicted for another.
    pool_stable_s: float = Field(default=5.0, ge=0)
    pool_cooldown_s: float = Field(default=30.0, ge=0)
    # The longest a worker may take to load before the load counts as failed.
    pool_load_timeout_s: float = Field(default=600.0, gt=0)
    # One spare worker process, its imports done, waits for the next load (worker/pool/spare.py):
    # a load then costs the weights, not a process start.
    pool_spare: bool = True
    # Models the pool loads when it starts (`mlxq run`: the default chat and embedding models).
    pool_preload: Annotated[tuple[str, ...], NoDecode] = ()
    # This machine's name among the fleet's pools; empty: its host name.
    machine: str = Field(default="", pattern=r"^([A-Za-z0-9][A-Za-z0-9._:-]{0,127})?$")

    @field_validator("catalog", "pool_preload", mode="before")
    @classmethod
    def _split_catalog(cls, value: Any) -> Any:
        return _split_commas(value)


class CpuSettings(BaseModel):
    """A Linux CPU worker's fast paths (worker/engine/cpu/) and its BLAS."""

    # On the CPU device (worker/engine/cpu/exponentials.py): a prompt chunk's softmax and SiLU in
    # NumPy,
    # a decode forward's with a compiled polynomial exp.
    cpu_prefill: bool = True
    cpu_decode: bool = True
    # On the CPU device (worker/engine/cpu/matvec.py): few-row products through the native module
    # (one row: cblas_sgemv), which also holds 8-bit KV's decode attention.
    cpu_matvec: bool = True
    # Linux CPU workers: preload the system OpenBLAS, with this many threads (None: its default).
    openblas: bool = True
    blas_threads: int | None = Field(default=None, ge=1)


class ApiSettings(BaseModel):
    """The API under gunicorn, its keys, and the logs of every process."""

    # The API under gunicorn (api/gunicorn_conf.py).
    api_bind: str = "127.0.0.1:8000"
    api_workers: int = Field(default=1, ge=1)
    api_connections: int = Field(default=1000, ge=1)
    api_access_log: bool = False
    # API keys (comma-separated in MLXQ_API_KEYS, each maybe with its limits:
    # `key:rpm=60:tpm=40000:queued=90000`); none: no auth, and loopback only (api/http/auth.py).
    api_keys: Annotated[tuple[ApiKey, ...], NoDecode] = ()
    # Operator keys (MLXQ_ADMIN_KEYS, the same form): each is a key like the others, which also
    # sees the whole fleet's jobs in /v1/fleet (api/routes/fleet.py).
    admin_keys: Annotated[tuple[ApiKey, ...], NoDecode] = ()
    # The secret owner ids are derived from keys with (api/http/auth.py); none: a random one
    # that the first API process keeps in Redis for all of them.
    owner_secret: SecretStr | None = None
    # Host names the API answers under besides the loopback ones (comma-separated in
    # MLXQ_ALLOWED_HOSTS); checked always without keys, and with keys only once set
    # (api/http/exposure.py).
    allowed_hosts: Annotated[tuple[str, ...], NoDecode] = ()
    # Logs (shared/observe/logs.py): text or JSON lines, and the level.
    log_format: Literal["text", "json"] = "text"
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"] = "INFO"

    @field_validator("log_level", mode="before")
    @classmethod
    def _upper_level(cls, value: Any) -> Any:
        return value.upper() if isinstance(value, str) else value

    @field_validator("allowed_hosts", mode="before")
    @classmethod
    def _split_hosts(cls, value: Any) -> Any:
        return _split_commas(value)

    @field_validator("api_keys", "admin_keys", mode="before")
    @classmethod
    def _parse_keys(cls, value: Any) -> Any:
        entries = _split_commas(value)
        return tuple(ApiKey.parse(v) if isinstance(v, str) else v for v in entries)

    @property
    def keyed(self) -> bool:
        """Whether callers need a key: any key configured, an operator's included."""
        return bool(self.api_keys or self.admin_keys)


class Settings(
    QueueSettings,
    LimitSettings,
    QuotaSettings,
    WorkerSettings,
    PoolSettings,
    CpuSettings,
    ApiSettings,
    BaseSettings,
):
    """Every setting, read from the environment (MLXQ_*, and REDIS_URL): the groups above in one
    object, which each process builds once and passes down. A function that needs one concern
    may take that group's type."""

    model_config = SettingsConfigDict(env_prefix="MLXQ_", frozen=True, populate_by_name=True)
