"""The queue's machinery both sides use: settings, the Redis connection, every Redis key, the job
that goes on an RQ queue and the events that come back, when a worker is alive, the backlog
check, the fair order of a model's queue, ids, and the rules the API checks before queueing and
the worker applies again (context window, prompt tokens, grammar). Two rooms: a prompt as both
sides count it (`prompt`) and how the fleet names what prefix caches hold (`prefix`).

Imports `shared.wire` for the request models it carries; nothing of `api` or `worker`.
"""
