"""The HTTP wire formats: OpenAI's and Anthropic's requests, responses, stream chunks, errors and
stored objects (files, batches, responses), as pydantic models, and the one function that builds
each answer. One room per API (`chat`, `responses`, `anthropic`, `batch`), one for what a request
asks of generation (`generation`) and one for the fleet's formats (`fleet`); at the top, what all
of them share: errors, a job's events, ids, numbers written as strings, embeddings, and the rule
for a request's images.

Pure data and pure functions: no Redis, no I/O. Imports nothing of `shared.queue` or
`shared.observe` beyond plain types, and nothing of `api` or `worker`.
"""
