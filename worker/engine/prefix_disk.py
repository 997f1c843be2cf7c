"""The prefix cache's disk tier: KV caches kept in files, so a prefix outlives the process.

The memory tier (worker/engine/prefix_cache.py) hands this tier each cache as it takes it in
(write-behind: a crash, kill -9 included, loses only what still waits for the writer), again
what it evicts, and all it holds at shutdown or when its model is unloaded
(`PrefixCache.persist_all`); a prompt whose opening memory lacks and a file holds is restored
from the file. A worker restart then costs a read of the cache instead of a prefill (issue 35:
on this CPU 50-110x less for 2,000 tokens).

Layout: `{root}/{identity}/{hash of the scope and tokens}.safetensors`, a file per token
sequence or chain (below) of one cache scope (shared/queue/prefix/cache_scope.py): a prompt is
restored only from its own scope's files. Folders are 0700 and files 0600: they hold prompts. The
identity (worker/engine/prefix_identity.py) names the weights by their content and the KV
layout (each layer's cache class, its arrays' shapes apart from the token axis, and their
dtypes, quantized ones included), so a model whose weights or KV form change gets a folder of
its own, and a file is never read as another model's cache. Files are mlx-lm's prompt-cache
format with the identity, the scope and the tokens in its metadata
(worker/engine/prefix_file.py); a file is written under a dot name and renamed, so no reader
sees half of one.

One file per chain: a conversation's caches extend one another, turn by turn. For caches that
can be cut (mlx-lm's KV caches, quantized or not), a cache that a file already holds the start
of is not written (that file is touched: a read cuts it, as memory does with a longer entry),
and a cache that extends files replaces them (its file written, theirs removed), as mlx-lm's
memory tier drops an entry's prefixes. Caches that cannot be cut get a file each.

A file that cannot be read, or whose metadata or arrays do not match (junk, truncated, another
model's, another dtype or shape), is removed and counts as a miss. The folder is capped at
`max_bytes` over every model's files, the least recently used (file modification times, touched
on each hit) removed first; workers on one machine may share it.

Threads: writes (and the cap) run on this tier's writer thread
(worker/engine/prefix_disk_writer.py), bounded in bytes waiting and in bytes a second, so the
engine's step never waits for a disk; the engine thread reads files on a hit. `held` is a
snapshot any thread may read. A file another worker sent is checked and kept by the slot thread
that fetched it (`adopt`), and read back by the engine as any other; a file this worker lends is
read by its lending thread.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np
from mlx_lm.models.cache import can_trim_prompt_cache, load_prompt_cache

from shared.queue.prefix.prefix_blocks import HeldPrompt
from worker.engine.prefix_disk_writer import UNBOUNDED, DiskWriter, WriteBounds
from worker.engine.prefix_file import (
    MIN_SHARED_TOKENS,
    SUFFIX,
    Stored,
    extends,
    file_name,
    header,
    held_of,
    is_ours,
    save,
)
from worker.engine.prefix_identity import kv_layout, model_identity, probe, token_bytes

log = logging.getLogger(__name__)

MARKS = "weights.json"  # the weight files' hashes, beside the models' folders (prefix_identity)
# A file is read whole: worth it while the tokens it saves are at least this share of it.
# Measured on this CPU, moving a 2,000-token cache beat prefilling it 50-110x (issue 35).
READ_SHARE = 16
# A dot file (a write in progress) older than this was left by a process that died mid-write.
STALE_S = 600.0
# A file written to be lent (`write_now`) is not replaced by a longer cache for this long: the
# lending thread reads it right after, and a taker in tests may read it later.
LENT_S = 60.0


@dataclass(frozen=True)
class Restored:
    """A cache read back from a file: the tokens it holds (for the scope asked)."""

    tokens: list[int]
    cache: list[Any]


class DiskTier:
    def __init__(
        self,
        root: Path,
        identity: str,
        layout: str,
        max_bytes: int,
        min_tokens: int,
        token_bytes: int = 0,
        bounds: WriteBounds = UNBOUNDED,
    ):
        """`token_bytes`: what a token adds to a file (0: unknown), for a fetch's estimate;
        `bounds`: how far and how fast the writer writes behind the memory tier."""
        self.token_bytes = token_bytes
        self._root = root
        self._dir = root / identity
        self._identity = identity
        self._layout = layout
        self._max_bytes = max_bytes
        self._min_tokens = min_tokens
        self._lock = threading.Lock()  # the index, between the threads
        self._tidying = threading.Lock()
        self._index: dict[str, Stored] = {}
        self._lent: dict[str, float] = {}  # files written to be lent, by name: when
        self._held: tuple[HeldPrompt, ...] = ()
        for folder in (root, self._dir):
            folder.mkdir(mode=0o700, parents=True, exist_ok=True)
            os.chmod(folder, 0o700)
        for path in self._dir.iterdir():
            self._admit(path)
        self._refresh_held()
        self._writer = DiskWriter(self._write_behind, bounds)

    @property
    def held(self) -> tuple[HeldPrompt, ...]:
        """The token sequences the files hold, most recently used first; replaced whole."""
        return self._held

    @property
    def folder(self) -> Path:
        return self._dir

    @property
    def identity(self) -> str:
        return self._identity

    @property
    def waiting_bytes(self) -> int:
        """Bytes of caches put and not yet written (or found held)."""
        return self._writer.waiting_bytes

    def __len__(self) -> int:
        return len(self._index)

    # The engine thread

    def restore(self, prompt: list[int], known: int, scope: str) -> Restored | None:
        """The file of `scope` holding most of `prompt`'s first tokens, read back, when it holds
        at least `min_tokens` more than `known` (what memory has) and reading it pays
        (READ_SHARE)."""
        common, best = self.best(prompt, scope)
        if best is None or not self.worth_reading(best, common - known):
            return None
        cache = self.read(best)
        if cache is None:
            return None
        with contextlib.suppress(OSError):
            os.utime(best.path)  # used now: the last to go
        return Restored(best.tokens.tolist(), cache)

    # Any thread

    def best(self, prompt: list[int], scope: str) -> tuple[int, Stored | None]:
        """The file of `scope` holding most of `prompt`'s first tokens, and how many it holds."""
        wanted = np.asarray(prompt, dtype=np.uint32)
        with self._lock:
            ranked = [(s.common(wanted), s) for s in self._index.values() if s.scope == scope]
        # Among equals, the shortest: the least to read or send.
        best = max(ranked, key=lambda r: (r[0], -len(r[1].tokens)), default=(0, None))
        return best[0], best[1]

    def worth_reading(self, stored: Stored, gain: int) -> bool:
        """Whether reading `stored` pays for the `gain` tokens it adds to what is held."""
        return gain >= self._min_tokens and gain * READ_SHARE >= len(stored.tokens)

    def file_of(self, held: HeldPrompt) -> Path | None:
        """The file holding exactly `held`, if there is one."""
        with self._lock:
            stored = self._index.get(file_name(held))
        return stored.path if stored is not None else None

    def adopt(self, data: bytes, scope: str) -> list[int] | None:
        """Keep a file another worker sent (worker/runtime/prefix/prefix_fetch.py) when it is one of
        this model's, of the `scope` asked for: the tokens it holds, or None (it is dropped, as
        a spoiled file is)."""
        temporary = self._dir / f".adopt.{os.getpid()}.{threading.get_ident()}{SUFFIX}"
        try:
            temporary.touch(mode=0o600)
            temporary.write_bytes(data)
            held = self._check(temporary)
            if held.scope != scope:
                raise ValueError("a cache of another scope than the one asked for")
            path = self._dir / file_name(held)
            os.replace(temporary, path)
        except (OSError, ValueError) as why:  # a full disk, a folder removed, not our file
            log.warning("prefix cache: not keeping a fetched file: %s", why)
            temporary.unlink(missing_ok=True)
            return None
        with self._lock:
            self._index[path.name] = Stored.of(path, held)
        self._tidy()
        return held.tokens

    def write_now(self, held: HeldPrompt, cache: list[Any]) -> Path | None:
        """Write `held`'s cache on this thread (a copy already on disk is only touched), for
        a thread that needs the file at once: the file, or None if it could not be written."""
        # Marked lent before it is indexed: the writer's thread, writing a longer cache of the
        # same chain meanwhile, would otherwise remove it as replaced before it is sent.
        with self._lock:
            self._lent[file_name(held)] = time.monotonic()
        try:
            mx.eval([c.state for c in cache])
            self._write(held, cache, chained=False)
        except Exception as err:  # a full disk (MLX's save raises RuntimeError), a gone folder
            log.warning("prefix cache: could not write a cache to %s: %s", self._dir, err)
            return None
        self._tidy()
        return self.file_of(held)

    def put(self, held: HeldPrompt, cache: list[Any], wait: bool = False) -> None:
        """Write `held`'s cache on the writer's thread (one file per chain: see the module).
        Without `wait`, dropped when it would take the bytes waiting past the writer's bound."""
        if len(held.tokens) < self._min_tokens:
            return
        # MLX's streams are per thread: the writer's thread can read arrays made real here, not
        # compute what this thread left lazy (the memory tier's are real already: no cost).
        mx.eval([c.state for c in cache])
        nbytes = sum(c.nbytes for c in cache)
        if not self._writer.offer(file_name(held), held, cache, nbytes, wait):
            log.info("prefix cache: disk behind, dropping a write of %d tokens", len(held.tokens))

    def flush(self) -> None:
        """Wait until every write put so far is done."""
        self._writer.flush()

    def close(self) -> None:
        """Finish the writes put so far, then stop the writer's thread."""
        self._writer.close()

    def read(self, stored: Stored) -> list[Any] | None:
        """`stored`'s cache, or None (a file that is not this model's is removed)."""
        try:
            cache, meta = load_prompt_cache(str(stored.path), return_metadata=True)
            mx.eval([c.state for c in cache])
            why = self._mismatch(meta, stored.held(), cache)
        except Exception as err:  # anything a file holds: it is dropped, never the worker
            why = f"unreadable ({type(err).__name__}: {err})"
        if why:
            self._discard(stored.path, why)
            return None
        return list(cache)

    def _mismatch(self, meta: dict[str, str], held: HeldPrompt, cache: list[Any]) -> str:
        """Why a cache read back is not this model's cache of `held` ('' if it is)."""
        tokens = held.tokens
        if not is_ours(meta, self._identity):
            return "another model's or format's file"
        if held_of(meta) != held:
            return "its scope or tokens differ from its name's"
        if kv_layout(cache) != self._layout:
            return "another KV layout (dtype or shape)"
        if any(getattr(c, "offset", len(tokens)) != len(tokens) for c in cache):
            return "its cache holds another number of tokens"
        return ""

    # The writer's thread

    def _write_behind(self, held: HeldPrompt, cache: list[Any]) -> int:
        written = self._write(held, cache, chained=True)
        self._tidy()
        return written

    def _write(self, held: HeldPrompt, cache: list[Any], chained: bool) -> int:
        """Write `held`'s cache, unless a file holds it already (that file is touched): the
        bytes written. `chained`: one file per chain, as the module says."""
        name = file_name(held)
        path = self._dir / name
        chained = chained and can_trim_prompt_cache(cache)
        holder = self._holder(held, chained)
        if holder is not None:
            os.utime(holder)
            return 0
        writer = f"{os.getpid()}.{threading.get_ident()}"
        temporary = self._dir / f".{name[: -len(SUFFIX)]}.{writer}{SUFFIX}"
        try:
            save(temporary, self._identity, held, cache)
            os.replace(temporary, path)
        except BaseException:
            temporary.unlink(missing_ok=True)
            raise
        stored = Stored.of(path, held)
        with self._lock:
            self._index[name] = stored
            now = time.monotonic()
            self._lent = {n: at for n, at in self._lent.items() if now - at < LENT_S}
            replaced = [
                s
                for s in self._index.values()
                if chained and extends(stored, s) and s.path.name not in self._lent
            ]
        for old in replaced:
            self._forget(old.path)
        return path.stat().st_size

    def _holder(self, held: HeldPrompt, chained: bool) -> Path | None:
        """The file holding `held`'s cache: the one of that name, or, `chained`, one of its
        scope whose tokens start with them."""
        wanted = Stored.of(self._dir / file_name(held), held)
        with self._lock:
            exact = self._index.get(wanted.path.name)
            longer = [s for s in self._index.values() if chained and extends(s, wanted)]
        paths = [s.path for s in ([exact] if exact is not None else []) + longer]
        return next((p for p in paths if p.exists()), None)

    def _tidy(self) -> None:
        """The cap, then `held` anew, one thread at a time (the writer, a fetch, a lend)."""
        with self._tidying:
            self._cap()
            self._refresh_held()

    def _cap(self) -> None:
        """Remove the least recently used files of every model until the folder fits."""
        files = sorted(_files(self._root), key=lambda f: f[1].st_mtime)
        total = sum(st.st_size for _, st in files)
        for path, st in files:
            if total <= self._max_bytes:
                break
            if path.name.startswith(".") and time.time() - st.st_mtime < STALE_S:
                continue  # a write in progress
            with contextlib.suppress(OSError):
                path.unlink()
                total -= st.st_size
        with self._lock:  # files other workers removed, this one's included
            self._index = {n: s for n, s in self._index.items() if s.path.exists()}

    def _refresh_held(self) -> None:
        with self._lock:
            stored = list(self._index.values())
        recent = sorted(stored, key=lambda s: _mtime(s.path), reverse=True)
        self._held = tuple(s.held() for s in recent)

    # Both

    def _admit(self, path: Path) -> None:
        """Index a file found in the folder at start, or remove it if it is not one of ours."""
        if path.name.startswith("."):
            if time.time() - _mtime(path) > STALE_S:
                path.unlink(missing_ok=True)
            return
        try:
            held = self._check(path)
        except ValueError as why:
            self._discard(path, str(why))
            return
        if file_name(held) != path.name:
            self._discard(path, "its scope or tokens differ from its name's")
        else:
            self._index[path.name] = Stored.of(path, held)

    def _check(self, path: Path) -> HeldPrompt:
        """The scope and tokens of a file whose header says it is this model's cache;
        ValueError, why not. (Its arrays are checked when it is read: `_mismatch`.)"""
        try:
            meta = header(path)
            held = held_of(meta)
            tokens = held.tokens
        except Exception as err:
            raise ValueError(f"unreadable ({type(err).__name__}: {err})") from err
        if not is_ours(meta, self._identity):
            raise ValueError("another model's or format's file")
        if len(tokens) < self._min_tokens:
            raise ValueError("too few tokens to keep")
        if min(tokens) < 0 or max(tokens) >= 1 << 32:
            raise ValueError("token ids out of range")
        return held

    def _discard(self, path: Path, why: str) -> None:
        log.warning("prefix cache: removing %s: %s", path, why)
        self._forget(path)

    def _forget(self, path: Path) -> None:
        path.unlink(missing_ok=True)
        with self._lock:
            self._index.pop(path.name, None)


def _files(root: Path) -> Iterator[tuple[Path, os.stat_result]]:
    for folder in root.iterdir():
        if folder.is_dir():
            for path in folder.iterdir():
                with contextlib.suppress(OSError):
                    yield path, path.stat()


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def open_tier(
    root: Path,
    model_dir: Path,
    model: Any,
    max_bytes: int,
    fresh: list[Any] | None = None,
    bounds: WriteBounds = UNBOUNDED,
) -> DiskTier:
    """The disk tier of `model` (loaded from `model_dir`; `fresh`: see `probe`) under `root`,
    its files of an earlier run indexed, its writer within `bounds`."""
    probed = probe(model, fresh)
    layout = kv_layout(probed)
    identity = model_identity(model_dir, layout, root / MARKS)
    return DiskTier(
        root, identity, layout, max_bytes, MIN_SHARED_TOKENS, token_bytes(probed), bounds
    )
