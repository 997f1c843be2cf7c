"""Operator tools: the `mlxq` command line, the stack it runs, and the Batch API client."""
