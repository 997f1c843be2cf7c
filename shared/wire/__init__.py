"""The HTTP wire formats: OpenAI's requests, responses, stream chunks, errors and stored objects
(files, batches, responses), as pydantic models, and the one function that builds each answer.

Pure data and pure functions: no Redis, no I/O. Imports nothing of `shared.queue` or
`shared.observe` beyond plain types, and nothing of `api` or `worker`.
"""
