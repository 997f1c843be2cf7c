"""HTTP plumbing every route uses: who is calling (API keys, owners), request bodies into pydantic
models, the one translation point from any failure to OpenAI's error body, JSON answers and SSE
framing.

Imports `shared` only; never a route, a store, the queue plumbing, `worker` or mlx.
"""
