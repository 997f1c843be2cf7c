"""Test doubles, for tests and benchmarks only: a synthetic engine that emits timed tokens
without a model (`synthetic`, with its prefill cost model in `synthetic_prefill`), a synthetic
embedding engine (`synthetic_embedding`), and fault injection (`faults`). Nothing here runs in a
worker unless its setting asks for it."""
