"""Seeing the fleet: the request figures workers record in Redis, the fleet snapshot the page and
`mlxq status` read, how every process logs, and traces across processes.

Imports `shared.queue` and `shared.wire`; nothing of `api` or `worker`.
"""
