"""A job's prompt as both sides count it: its tokens counted on the API side exactly as the worker
will (`prompt_tokens`), and the context-window rule both apply (`context_window`)."""
