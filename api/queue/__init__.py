"""The API's side of the job queue: what the fleet serves (the roster, read only), the queue's
writes (the broker: RQ queues, the backlog's caps, cancellation), admission (one step from a
built job to a queued one: the prompt's count, the context window, the key's limits, placement),
the reply channel relay, the watch that ends waits on lost jobs, and running a job and reading
its events.

Imports `shared`, `api.backend`, `api.http` and `api.limits`; never a route module, `worker` or mlx.
"""
