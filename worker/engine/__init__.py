"""The engine: a loaded model generating many sequences in one continuous batch, and what
prepares a job for it. Nothing here knows Redis or HTTP."""
