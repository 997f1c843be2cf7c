"""Tool calls read back from a sequence's text as it streams: the scanners (`marked_calls`
between markers, `answer_calls` for calls written as the whole answer), which format a model
gets (`tool_calls`' `ToolFormat`), the readers of a call's text (`call_readers`), each family's
own syntax (the `families` room, one module a family), and what a scanner gives and how a
sequence's calls are numbered (`scanned_calls`)."""
