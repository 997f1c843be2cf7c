"""How many waiting prompts join an engine step's prefill: a budget of prompt tokens per step.

On the CPU a prefill is compute-bound: its time grows with its tokens, and every running
sequence waits for it. mlx-lm's BatchGenerator takes up to `prefill_batch_size` waiting prompts
into one prefill group. A burst of 32 prompts prefilled as one group gives all 32 their first
token only after the whole group's prefill; groups of about `budget` tokens give the first of
them theirs after a fraction of it, at nearly the same total cost. Measured, that helped at 32
clients and not at 16 (measured: commit 8dd5d87), so the default budget is large.
This is vLLM's `max_num_batched_tokens` idea on top of mlx-lm's scheduler, which is left as it is.
"""

from __future__ import annotations

from mlx_lm.generate import BatchGenerator


def size_prefill_group(batch: BatchGenerator, budget: int | None) -> None:
    """Set `batch.prefill_batch_size` for its next step: the prompts already in prefill, and the
    waiting ones, in order, while their next chunks fit `budget` tokens (None: all that the
    batch has room for). The first waiting prompt always joins an idle prefill, however long
    (it is then prefilled in chunks of `prefill_step_size`). A prompt that only moves to
    generation this step costs nothing, so the next group's prefill runs in that same step."""
    if budget is None:
        batch.prefill_batch_size = batch.completion_batch_size
        return
    step = batch.prefill_step_size
    chunks = [_chunk(seq[0], step) for seq in batch._currently_processing]
    left = budget - sum(chunks)
    joining = 0
    for waiting in batch._unprocessed_sequences:
        tokens = _chunk(waiting[1], step)
        if tokens > left and (joining or any(chunks)):
            break
        left -= tokens
        joining += 1
    batch.prefill_batch_size = len(batch._prompt_batch) + joining


def _chunk(segments: list[list[int]], step: int) -> int:
    """The prompt tokens a sequence waiting for (or in) prefill computes at its next step.

    mlx-lm keeps a prompt's last token as a segment of its own: it is the first decode step's
    input, so a sequence left with only that one costs the prefill nothing."""
    if len(segments) == 1 and len(segments[0]) == 1:
        return 0
    return min(len(segments[0]), step)
