"""The API's side of the job queue: the broker (liveness, RQ queues, cancellation), admission
(one step from a built job to a queued one: the prompt's count, the context window, rate limits,
placement), the reply channel relay, the watch that ends waits on lost jobs, and running a job
and reading its events.

Imports `shared` and `api.http`; never a route module, `worker` or mlx.
"""
