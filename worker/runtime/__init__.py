"""The worker's runtime: everything that feeds the engine and reports what it does.

One skeleton for every kind of engine: the engine loop (`loop`) and the job functions RQ runs
(`job_function`), generic over what an engine prepares and what its steps publish; what differs
by kind is a small `JobKind` each (the `kinds` room). Around them, at the top: the worker process
(`serve`), publishing events (`publish`), cancellations, the worker's report and when its last
job ended (`report`, `recency`), how it counts prompts (`tokenizer_spec`) and `blas` (OpenBLAS
preloaded on Linux); in rooms: how jobs come in from RQ (`intake`), a worker alive, dead or
wedged (`liveness`) and prefix caches shared across the fleet (`prefix`).
"""
