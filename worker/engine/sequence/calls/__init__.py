"""Tool calls read back from a sequence's text as it streams: the scanners (`tool_calls` between
markers, `answer_calls` for calls written as the whole answer), the reader of each call format
(`call_readers`), and what a scanner gives and how a sequence's calls are numbered
(`scanned_calls`)."""
