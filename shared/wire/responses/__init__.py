"""OpenAI's Responses API: its request, response object and stored record (`responses`), its items
(`response_items`), a response's state and stream derived from its job's events (`response_state`,
`response_events`), and the opaque value that carries reasoning out and back in
(`reasoning_blob`)."""
