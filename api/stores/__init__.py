"""What the API stores in Redis and serves back: files, batches (their intake and finalization),
response records, and the cursor pages over an owner's resources.

Imports `shared` and `api.http` (errors, ownership); never a route module, `worker` or mlx.
"""
