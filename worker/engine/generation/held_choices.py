"""A job's choices beyond its share of the batch's rows, held back until rows of its own end.

Each of a job's `n` choices (up to 128) is a row of the batch. Let in all at once, one job's
choices took every row, and those that found none waited in the batch's queue ahead of every
later job's: one request of n=128 held every other request behind it for its whole length. So a
job holds at most `share` rows at once (the engine's `job_rows`: the rows not reserved for
interactive work, MLXQ_BATCH_SIZE - MLXQ_INTERACTIVE_SLOTS), and its other choices wait here,
entering as the job's own rows end.

Waiting choices of one prompt share one copy of its KV cache, taken before the batch takes the
original (which it fills in place); each choice that enters gets a copy of that, and the last one
the copy itself. So a job's prompt KV is held at most share + 1 times, where every choice had
its own copy from the start.
"""

from __future__ import annotations

import copy
from collections import Counter, deque
from collections.abc import Mapping
from dataclasses import dataclass, field

from shared.wire.generation.logprobs import TokenLogprob
from worker.engine.prefix_cache import Reuse
from worker.engine.prepare import PreparedJob

Row = tuple[PreparedJob, int]  # a job and the index of one of its choices
Key = tuple[str, int]  # a job's id and the index of the prompt a choice continues


@dataclass
class _Waiting:
    """One job's held choices, oldest first, with their prompts' starts."""

    rows: deque[Row] = field(default_factory=deque)
    starts: dict[Key, Reuse] = field(default_factory=dict)
    scored: dict[Key, list[TokenLogprob] | None] = field(default_factory=dict)


@dataclass(frozen=True)
class Entering:
    """Rows to insert now, with the start and the scored opening of each of their prompts."""

    rows: list[Row]
    starts: dict[Key, Reuse]
    scored: dict[Key, list[TokenLogprob] | None]


def key_of(row: Row) -> Key:
    prepared, index = row
    return prepared.job_id, prepared.choices[index].prompt


class HeldChoices:
    def __init__(self, share: int):
        self.share = max(1, share)
        self._waiting: dict[str, _Waiting] = {}

    def admit(
        self,
        rows: list[Row],
        running: Mapping[str, int],
        starts: Mapping[Key, Reuse],
        scored: Mapping[Key, list[TokenLogprob] | None],
    ) -> tuple[list[Row], list[Row]]:
        """Of `rows` (`running`: each job's rows in the batch now), those within their job's
        share, in order, and those held."""
        taken: Counter[str] = Counter()
        now: list[Row] = []
        later: list[Row] = []
        for row in rows:
            job_id = row[0].job_id
            if job_id not in self._waiting and running.get(job_id, 0) + taken[job_id] < self.share:
                taken[job_id] += 1
                now.append(row)
            else:
                later.append(row)
        entering = {key_of(row) for row in now}
        for row in later:
            self._hold(row, starts[key_of(row)], scored.get(key_of(row)), key_of(row) in entering)
        return now, later

    def _hold(
        self, row: Row, start: Reuse, scored: list[TokenLogprob] | None, entering: bool
    ) -> None:
        waiting = self._waiting.setdefault(row[0].job_id, _Waiting())
        key = key_of(row)
        if key not in waiting.starts:
            # A choice of this prompt enters now with the original, which the batch fills.
            cache = copy.deepcopy(start.cache) if entering else start.cache
            waiting.starts[key] = Reuse(cache, start.tokens, start.hits)
            waiting.scored[key] = scored
        waiting.rows.append(row)

    def __bool__(self) -> bool:
        return bool(self._waiting)

    def jobs(self) -> list[str]:
        """The jobs with choices waiting."""
        return list(self._waiting)

    def release(self, job_id: str, room: int) -> Entering:
        """Up to `room` of the job's held choices, each prompt's start copied for them but the
        last, which takes the held one."""
        waiting = self._waiting[job_id]
        rows = [waiting.rows.popleft() for _ in range(min(room, len(waiting.rows)))]
        starts: dict[Key, Reuse] = {}
        for key in dict.fromkeys(key_of(row) for row in rows):
            held = waiting.starts[key]
            if any(key_of(row) == key for row in waiting.rows):  # more of its choices wait
                starts[key] = Reuse(copy.deepcopy(held.cache), held.tokens, held.hits)
            else:
                starts[key] = waiting.starts.pop(key)
        scored = {key: waiting.scored[key] for key in starts}
        if not waiting.rows:
            del self._waiting[job_id]
        return Entering(rows, starts, scored)

    def drop(self, job_ids: list[str]) -> None:
        for job_id in job_ids:
            self._waiting.pop(job_id, None)
