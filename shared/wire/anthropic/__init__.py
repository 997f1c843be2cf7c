"""Anthropic's Messages API: its requests and their translation onto a chat request (`messages`,
`message_blocks`, `billing_line`), its answers and stream (`message_answers`), and its Message
Batches (`message_batches`)."""
