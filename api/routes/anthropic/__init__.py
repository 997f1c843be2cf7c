"""Anthropic's surfaces: /v1/messages and /v1/messages/count_tokens (`messages`) and the Message
Batches API (`message_batches`), translated at the edge onto the chat job and the Batch API's
machinery; their errors take Anthropic's shape."""
