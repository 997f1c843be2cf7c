"""What the API and the workers agree on; imports neither `api` nor `worker`.

- `shared.wire`: the HTTP wire formats (OpenAI's requests, responses and errors) and the one
  builder of each answer shape.
- `shared.queue`: the queue's machinery: settings, the Redis connection and every key, the job
  payload and its events, liveness, backlog, fair order, ids and the request rules both sides
  apply (context window, prompt tokens, grammar).
- `shared.observe`: what the fleet records about itself: metrics, the fleet snapshot, logs, traces.
"""
