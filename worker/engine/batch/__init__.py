"""The token batch: sequences advanced one token per step. mlxq's slot batch (in-place KV rows,
chunked prefill between decode steps) and mlx-lm's BatchGenerator (for caches the slot batch does
not hold) behind `token_batch.TokenBatch`, taking `types.Entry` and giving `types.Token`."""
