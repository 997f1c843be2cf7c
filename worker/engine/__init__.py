"""The engine: a loaded model generating many sequences in one continuous batch, and what
prepares a job for it. Nothing here knows Redis or HTTP.

The top level holds loading a model (`model`), turning a job into prompt tokens (`prepare`),
what a step may prefill (`prefill_policy`), the prompts computed before their choices enter the
batch (`staged_prompt`) and the prefix cache. Each other kind of thing has a room of its own:

- `generation/`: the generation engine itself (jobs in, each step's visible output out) and what
  a step shows of each sequence.
- `batch/`: the token batch under the engine: mlxq's slot batch, its rows and KV, or mlx-lm's
  BatchGenerator, behind one protocol and the two types they share.
- `sequence/`: what runs per sequence: sampling, logits processors and grammars, stop handling,
  detokenizing, log-probabilities, tool calls.
- `cpu/`: MLX's CPU backend's fast paths (exponentials, few-row products, 8-bit KV's decode
  attention). Only model loading
  imports this room; the fast paths attach to the model they were loaded with.
- `embedding/`: the embedding engine, its encoder and its default model.
- `doubles/`: engines and faults for tests and benchmarks only (synthetic tokens, fault injection).
"""
