"""The API's surfaces: one Flask blueprint per resource, thin routes that parse a body
(api/http), hand it to the queue (api/queue) or a store (api/stores), and answer with a shape
from shared/wire; what the generation routes do alike before running a job is
`generation_job.py`'s. A new API surface is a new module here, registered in `api.create_app`; the
surfaces of one API that has several keep a room of their own (`anthropic`, `batch`).

Imports `api.http`, `api.queue`, `api.stores` and `shared`; never `worker` or mlx.
"""
