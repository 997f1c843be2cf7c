"""The API's side of the job queue: the broker (liveness, RQ queues, cancellation), the reply
channel relay, the watch that ends waits on lost jobs, running a job and reading its events, and
the context-window check before queueing.

Imports `shared` and `api.http`; never a route module, `worker` or mlx.
"""
