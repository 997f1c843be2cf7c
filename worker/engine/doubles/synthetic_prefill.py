"""The synthetic engine's prefill model: what a prompt would cost a real worker, as a sleep.

Placement (api/queue/placement.py) can only be measured apart from CPU contention if workers
that compute nothing still behave like real ones where placement acts: they count and hash
prompt tokens as the API does, keep a prefix cache, and take longer for what is not in it. So
with MLXQ_SYNTHETIC_PREFILL_S_PER_TOKEN above 0 a synthetic worker:

- tokenizes each prompt with its served model's real tokenizer, through the `PromptCounter` the
  API builds from the spec the worker publishes (shared/queue/prompt/prompt_tokens.py), so both
  sides see the same token ids and so the same block hashes;
- keeps a bounded LRU of the token sequences it has prefilled (`SyntheticPrefixCache`), each
  under its job's cache scope, whose `held` is what worker/runtime/prefix/prefix_report.py
  publishes, as from the real `PrefixCache`;
- charges each step the prompt tokens it prefills that are not in that cache, at the configured
  seconds per token, up to the step's prefill budget (MLXQ_PREFILL_TOKENS), in admission order,
  as the real engine's chunked prefill does; a sequence's first token comes in the step its
  prefill ends (worker/engine/doubles/synthetic.py sleeps; nothing burns CPU).

What it models and what not: the cache holds a prompt from the step its prefill ended, so a
later prompt of the same burst finds a shared system prompt once an earlier one has computed it
(the real cache does that for histories of 16-512 tokens, `MIN_SHARED_TOKENS`/`MAX_SHARED_TOKENS`
in prefix_cache.py); when a sequence ends its answer (its text, tokenized) is held with it, as
the real cache holds the finished sequence; it evicts by entries only
(MLXQ_PREFIX_CACHE_ENTRIES), not bytes.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from shared.queue.jobs import GenerationJob
from shared.queue.prefix.prefix_blocks import HeldPrompt
from shared.queue.prompt.prompt_tokens import PromptCounter
from worker.engine.prepare import PreparedJob

_Key = tuple[str, tuple[int, ...]]  # a scope and its tokens


class SyntheticPrefixCache:
    """The token sequences prefilled last, at most `entries`, newest first in `held`."""

    def __init__(self, entries: int):
        self._entries = entries
        self._lru: OrderedDict[_Key, None] = OrderedDict()
        self._held: tuple[HeldPrompt, ...] = ()

    @property
    def held(self) -> tuple[HeldPrompt, ...]:
        """As `PrefixCache.held`: replaced whole at each insertion, so any thread may read it."""
        return self._held

    def matched(self, prompt: HeldPrompt) -> int:
        """The prompt's leading tokens some sequence held for its scope shares, leaving its last
        token to compute (the real cache recomputes it for the logits); a hit counts as a use."""
        best, best_key = 0, None
        for key in self._lru:
            shared = _common_prefix(key[1], prompt.tokens) if key[0] == prompt.scope else 0
            if shared > best:
                best, best_key = shared, key
        if best_key is not None:
            self._lru.move_to_end(best_key)
        return min(best, len(prompt.tokens) - 1)

    def insert(self, held: HeldPrompt) -> None:
        key = (held.scope, tuple(held.tokens))
        self._lru[key] = None
        self._lru.move_to_end(key)
        while len(self._lru) > self._entries:
            self._lru.popitem(last=False)
        self._held = tuple(HeldPrompt(scope, list(tokens)) for scope, tokens in reversed(self._lru))

    def extend(self, held: HeldPrompt, more: list[int]) -> None:
        """Hold `held` with `more` after it in place of `held` (a prompt, then with its
        answer)."""
        self._lru.pop((held.scope, tuple(held.tokens)), None)
        self.insert(HeldPrompt(held.scope, held.tokens + more))


def _common_prefix(held: tuple[int, ...], prompt: list[int]) -> int:
    """How many leading tokens the two share; slices compare in C, so a bisection is cheap."""
    low, high = 0, min(len(held), len(prompt))
    while low < high:
        mid = (low + high + 1) // 2
        if list(held[:mid]) == prompt[:mid]:
            low = mid
        else:
            high = mid - 1
    return low


@dataclass
class PrefillState:
    """One sequence's prefill: None until it starts, then the tokens the cache gave it."""

    cached: int | None = None
    left: int = 0

    @property
    def done(self) -> bool:
        return self.cached is not None and self.left == 0


class SyntheticPrefill:
    """Token ids as the API counts them, the cache, and the cost of what the cache lacks."""

    def __init__(
        self,
        counter: PromptCounter,
        cache: SyntheticPrefixCache | None,
        s_per_token: float,
        budget: int,
    ):
        self._counter = counter
        self._cache = cache
        self._s_per_token = s_per_token
        self._budget = budget

    def prompts(self, job: GenerationJob) -> tuple[list[int], ...]:
        """The job's prompts' token ids, exactly as the API hashes them."""
        ids = self._counter.ids(job)
        if ids is not None:
            return (ids,)
        return tuple(self._counter.item_ids(item) for item in job.prompt_items())

    def step_s(self, pending: list[tuple[PreparedJob, PrefillState]]) -> float:
        """Advance the sequences waiting for prefill (in admission order) by one step's budget
        of tokens; the seconds that step's prefill takes."""
        spent = 0
        for prepared, state in pending:
            if spent >= self._budget:
                break
            prompts = prepared.prompts
            if state.cached is None:
                state.cached = self._start(prepared)
                state.left = sum(len(p) for p in prompts) - state.cached
            take = min(state.left, self._budget - spent)
            state.left -= take
            spent += take
            if state.left == 0 and self._cache is not None:
                for prompt in prompts:
                    self._cache.insert(HeldPrompt(prepared.cache_scope, prompt))
        return spent * self._s_per_token

    def finished(self, prepared: PreparedJob, answer: str) -> None:
        """Hold a one-prompt sequence with its answer, as the real cache does when it ends: the
        next turn, which sends the answer back, finds it whole. It replaces the prompt alone,
        which it extends."""
        if self._cache is None or len(prepared.prompts) != 1:
            return
        held = HeldPrompt(prepared.cache_scope, prepared.prompts[0])
        self._cache.extend(held, self._counter.encode(answer, special_tokens=False))

    def _start(self, prepared: PreparedJob) -> int:
        """The tokens the cache gives a sequence as its prefill starts (one prompt only)."""
        prompts = prepared.prompts
        if self._cache is None or len(prompts) != 1 or not prompts[0]:
            return 0
        return self._cache.matched(HeldPrompt(prepared.cache_scope, prompts[0]))
