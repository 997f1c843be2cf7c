"""What the API stores in Redis and serves back: files, batches (their intake and finalization),
response records, Idempotency-Keys, and the cursor pages over an owner's resources. The stores
that queue or cancel work (responses, batches) do it through the broker (api/queue/broker.py).

Imports `shared`, `api.backend`, `api.http`, `api.limits` and `api.queue`; never a route module,
`worker` or mlx.
"""
