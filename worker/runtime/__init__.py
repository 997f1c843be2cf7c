"""The worker's runtime: everything that feeds the engine and reports what it does.

One skeleton for every kind of engine: the engine loop (`loop`) and the job functions RQ runs
(`job_function`), generic over what an engine prepares and what its steps publish; what differs
by kind is a small `JobKind` each (`generation_kind`, `embedding_kind`). Around them: the worker
process (`serve`), RQ slots (`slots`, `fixed_job`, `placed_take`), publishing events (`publish`,
`fence`), a batch line's work (`batch_lines`), cancellations, heartbeats and reports
(`heartbeat`, `report`, `prefix_report`, `tokenizer_spec`), the reaper, the watchdog, drain,
and `blas` (OpenBLAS preloaded on Linux).
"""
